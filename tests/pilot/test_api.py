"""The Python API (`import trajflow`) on a real local pilot, against MDAnalysis.

One Pilot carries every run here (one pilot start): a blocking run, two runs
submitted side by side (a lambda factory and dihedrals in tasks mode), a run
whose block keeps failing (RunFailed carries the task), and a run with an
injected delay (the profile names that straggler). Bad input raises
InputError before any pilot. The example workflow script runs end to end.
"""
import glob
import io
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import trajflow
from paths import EXAMPLES

EXAMPLE = os.path.join(EXAMPLES, "rmsd_and_rdf.py")


def test_the_public_names_are_all_there():
    assert trajflow.__version__ not in ("", "unknown")
    for name in trajflow.__all__:
        assert getattr(trajflow, name) is not None, name
    assert {"run", "Pilot", "RunFuture", "Run", "Profile", "open_run", "open_result", "Backend",
            "Campaign", "CampaignResult", "InputError", "RunFailed",
            "Interrupted"} <= set(trajflow.__all__)
    for name in trajflow.__all__[1:]:  # every public name shows how it is used
        assert ">>>" in getattr(trajflow, name).__doc__, name
    # the tasks import no workstation code: importing trajflow alone loads none of it
    code = "import sys, trajflow, trajflow.tasks.plan; print(any(m.startswith(('radical', " \
           "'trajflow.workflows')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_input_raises_input_error_before_any_pilot(tmp_path, adk, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(trajflow.InputError, match="does not exist"):
        trajflow.run(adk[0], str(tmp_path / "missing.dcd"), "rmsd")
    with pytest.raises(trajflow.InputError, match="io='nfs'"):
        trajflow.run(adk[0], adk[1], "rmsd", io="nfs")
    with pytest.raises(trajflow.InputError, match="not an MDAnalysis analysis"):
        trajflow.run(adk[0], adk[1], lambda u: u.select_atoms("name CA"))
    with pytest.raises(trajflow.InputError, match="did you mean local.localhost"):
        trajflow.run(adk[0], adk[1], "rmsd", resource="local.locahost")
    with pytest.raises(trajflow.InputError, match="selects no frame"):
        trajflow.run(adk[0], adk[1], "rmsd", start=90, stop=10)
    assert os.listdir(tmp_path) == []  # no run folder, no RADICAL session


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("tty", [False, True])
def test_progress_shows_the_frames_the_ranks_report(tmp_path, tty):
    """Two ranks' progress files (what tasks/timing.py writes) summed into lines at
    every quarter, or a tqdm bar on a terminal."""
    from trajflow.tasks.plan import RunPlan
    from trajflow.workflows.run.progress import Progress
    plan = RunPlan(workdir=str(tmp_path), topology="t", trajectories=["x"], analysis="rmsd",
                   selection="name CA", io="shared", mode="mpi", gather="gatherv", n_frames=100,
                   n_atoms=1, blocks=[(0, 50), (50, 100)])
    stream = _Terminal() if tty else io.StringIO()
    progress = Progress(stream=stream, poll_s=0.05)
    progress.stage("run1", plan, "analyze", "submitted", "analyze submitted")
    os.makedirs(tmp_path / "progress")
    for done in (10, 30, 50):
        for b in range(2):
            (tmp_path / "progress" / f"analyze.block_{b:05d}").write_text(f"{done}\n")
        time.sleep(0.3)
    progress.stage("run1", plan, "analyze", "done", "analyze done")
    progress.close()
    out = stream.getvalue()
    assert "run1: analyze submitted" in out and "run1: analyze done" in out
    if tty:
        assert "run1 analyze" in out and "100/100" in out
    else:
        assert "analyze 60 of 100 frames (60 %, about " in out and " s left)" in out
        # the last count comes before the stage's end
        assert out.index("analyze 100 of 100 frames (100 %)") < out.index("analyze done")


@pytest.fixture(scope="module")
def pilot(tmp_path_factory):
    path = tmp_path_factory.mktemp("api")
    with trajflow.Pilot("local.localhost", cpus=2, walltime=15, path=str(path / "pilot"),
                        progress=False) as p:
        yield p, path
    if p.session_dir is not None:  # the RADICAL session went where the Pilot was told
        assert glob.glob(str(path / "pilot" / "re.session.*"))


def test_pilot_run_gives_mdanalysis_rmsd_as_arrays(pilot, adk, reference_results):
    p, path = pilot
    run = p.run(adk[0], adk[1], "rmsd", blocks=2, out=str(path / "rmsd"))
    assert isinstance(run, trajflow.Run) and run.ok and run.outcome["status"] == "done"
    ref = reference_results(adk[0], [adk[1]], "rmsd")
    np.testing.assert_allclose(run.results.rmsd, ref["rmsd"], atol=1e-4)
    np.testing.assert_array_equal(run.frame, np.arange(98))
    np.testing.assert_allclose(run.time, ref["time"])
    assert run.plan.n_blocks == 2 and run.path == str(path / "rmsd")
    ranks = sorted(r["rank"] for r in run.profile.records if r["task"] == "analyze")
    assert ranks == [0, 1]
    assert "done:" in run.summary() and str(run.result_path) in run.summary()
    # one wall time, from the call to the outcome, the same in the summary, `inspect`
    # and `runs` (Run.wall_s), its parts adding up to it, each task's wait for cores kept
    times = run.profile.report["advice"]["rmsd"]["times"]
    assert times["whole"] == pytest.approx(run.wall_s, abs=1e-6)
    assert sum(times["wall"]["parts"].values()) == pytest.approx(run.wall_s, abs=1e-6)
    assert f"wall time {run.wall_s:.1f} s (" in run.summary()
    assert all(times["wall"]["parts"][stage] > 0 for stage in ("analyze", "reduce"))
    assert "split" not in times["wall"]["parts"]  # shared io reads the inputs as they are
    # every RADICAL task's scheduling kept; the reduce ran in the analyze task (MPI: its
    # gather's root published the result), with no launch of its own
    assert all({"queued", "cores"} <= set(r["radical"]) for r in run.profile.records
               if r["task"] != "reduce"), [r["radical"] for r in run.profile.records]
    [reduced] = [r for r in run.profile.records if r["task"] == "reduce"]
    assert reduced["within_task"] == "analyze" and reduced["t_launch"] == 0.0
    assert os.path.exists(os.path.join(run.path, "report.html"))  # API runs get one too
    assert repr(run.profile).startswith("<trajflow.Profile of 1 run(s)")
    # a complete run's working folders go: its parts emptied, its progress counts read
    assert not os.path.exists(os.path.join(run.path, "parts"))
    assert not os.path.exists(os.path.join(run.path, "progress"))
    html = run.profile.to_html(str(path / "rmsd.html"))
    assert "analyze" in open(html).read()
    again = trajflow.open_run(run.path)  # reopened from the folder alone
    np.testing.assert_array_equal(again.results.rmsd, run.results.rmsd)


def test_submitted_runs_go_side_by_side_and_a_lambda_travels(pilot, adk, solvated,
                                                            reference_results):
    import MDAnalysis as mda
    from MDAnalysis.analysis.rdf import InterRDF
    p, path = pilot
    nbins = 30

    def make(u):
        return InterRDF(u.select_atoms("name OW and index 20000:23000"),
                        u.select_atoms("name OW and index 20000:23000"), nbins=nbins,
                        exclusion_block=(1, 1))
    rdf = p.submit(solvated[0], solvated[1], lambda u: make(u), io="h5md", blocks=2,
                   out=str(path / "rdf"))
    dih = p.submit(adk[0], [adk[1]], "dihedrals", mode="tasks", blocks=3, out=str(path / "dih"))
    assert isinstance(rdf, trajflow.RunFuture) and rdf.path == str(path / "rdf")
    got_rdf, got_dih = rdf.result(timeout=600), dih.result(timeout=600)
    assert rdf.done() and dih.done() and not rdf.cancel()  # a finished run cannot be cancelled
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = make(mda.Universe(*solvated)).run().results
    np.testing.assert_allclose(got_rdf.results.rdf, ref.rdf, rtol=1e-6)
    np.testing.assert_array_equal(got_rdf.results.count, ref.count)
    line = make.__code__.co_firstlineno + 4  # the lambda's own line, as runs and summaries say
    assert got_rdf.plan.analysis == f"python:lambda at test_api.py:{line}"
    assert os.path.exists(os.path.join(got_rdf.path, "analysis", "factory.pickle"))
    ref = reference_results(adk[0], [adk[1]], "dihedrals")
    np.testing.assert_allclose(got_dih.results["features"], ref["features"], atol=1e-6)
    # side by side: the two runs (split to reduce) overlapped in time
    spans = {}
    for run in (got_rdf, got_dih):
        recs = run.profile.records
        spans[run.path] = (min(r["t_start"] for r in recs), max(r["t_stop"] for r in recs))
    (a0, a1), (b0, b1) = spans.values()
    assert a0 < b1 and b0 < a1, spans


def test_a_failed_run_raises_run_failed_with_the_task_and_resumes(pilot, adk, reference_results):
    p, path = pilot
    with pytest.raises(trajflow.RunFailed) as err:
        p.run(adk[0], adk[1], "rmsd", mode="tasks", blocks=2, retries=0,
              env={"TRAJFLOW_TEST_FAIL": "1:5"}, out=str(path / "failing"))
    exc = err.value
    [task] = exc.failed_tasks
    assert (task.stage, task.name, task.exit_code, task.attempt) == ("analyze", "analyze.b00001", 3, 1)
    assert task.sandbox and "fails on purpose" in task.stderr_tail
    assert exc.run.path == str(path / "failing") and not exc.run.ok
    assert exc.run.outcome["status"] == "failed" and exc.run.outcome["stopped_at"] == "analyze"
    with pytest.raises(trajflow.RunFailed, match="no complete result"):
        exc.run.results
    assert not os.path.exists(os.path.join(exc.run.path, "result.h5"))
    # reopened, the run says what failed, where, why, and what a resume runs again
    summary = trajflow.open_run(exc.run.path).summary()
    assert "FAILED at its analyze stage" in summary and "analyze.b00001" in summary, summary
    assert "fails on purpose" in summary and "runs 1 analyze task(s), 1 reduce task(s) again" in summary
    inspect = subprocess.run([os.path.join(os.path.dirname(sys.executable), "trajflow"), "inspect",
                              exc.run.path], capture_output=True, text=True, timeout=120)
    assert inspect.returncode == 1 and "analyze.b00001" in inspect.stdout, inspect.stdout
    # resumed on the same pilot (without the failure hook): only block 1, then reduce
    parts_before = sorted(os.listdir(os.path.join(exc.run.path, "parts")))
    assert parts_before == ["block_00000.h5"]
    run = trajflow.resume(exc.run.path, pilot=p)
    assert run.ok and run.outcome["status"] == "done"
    np.testing.assert_allclose(run.results.rmsd, reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                               atol=1e-4)
    analyzed = [r["block"] for r in run.profile.records if r["task"] == "analyze"]
    assert sorted(analyzed) == [0, 1]  # block 0's record from the first attempt, 1 from now


def test_the_profile_names_an_injected_straggler(pilot, adk):
    p, path = pilot
    # 3 tasks on 2 cores: the third waits for a core (its launch phase), which spreads the
    # group (its MAD) by about a task's length; a delay of 8 s stands out of that
    run = p.run(adk[0], adk[1], "rmsd", mode="tasks", blocks=3,
                env={"TRAJFLOW_TEST_DELAY": "1:compute:8"}, out=str(path / "slow"))
    flags = {f["block"]: f for f in run.profile.stragglers if f["task"] == "analyze"}
    assert flags[1]["cause"] == "compute" and flags[1]["excess_by_phase_s"]["compute"] >= 7.5
    assert [b for b, f in flags.items() if f["cause"] == "compute"] == [1], flags
    assert "straggler" in "\n".join(run.profile.summary_lines())
    # the third task's wait in RADICAL's scheduler for a core is kept and read back
    waits = [r["t_queued"] for r in run.profile.records if r["task"] == "analyze"]
    assert sorted(waits)[-1] > 0.1 and sorted(waits)[0] < 0.5 * sorted(waits)[-1], waits
    try:
        import pandas  # noqa: F401  not a trajflow requirement
    except ImportError:
        with pytest.raises(ImportError, match="pip install pandas"):
            run.profile.to_pandas()
    else:
        frame = run.profile.to_pandas()
        slow = frame[frame.task == "analyze"].set_index("block").t_compute
        assert slow[1] > slow[0] + 7.5 and slow[1] > slow[2] + 7.5


def test_a_run_behind_another_says_so_in_its_one_wall_time(pilot, adk):
    """A run submitted while another holds the pilot's cores goes to the pilot at once
    (it does not wait for the other's batch to end) and waits in the agent's scheduler
    for cores: that wait is a part of its wall time of its own, and the summary,
    `inspect` and `runs` (Run.wall_s) give the same whole."""
    p, path = pilot
    # both ranks delayed: with a dynamic schedule either may analyse every chunk
    first = p.submit(adk[0], adk[1], "rmsd", blocks=2,
                     env={"TRAJFLOW_TEST_DELAY": "0:compute:4,1:compute:4"},
                     out=str(path / "ahead"))
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(first.path, "progress", "started.analyze")):
        assert time.time() < deadline and not first.done(), "the first run never began"
        time.sleep(0.05)  # its ranks hold both cores now
    second = p.submit(adk[0], adk[1], "rmsd", blocks=2, out=str(path / "behind"))
    ahead, behind = first.result(timeout=600), second.result(timeout=600)
    wall = behind.profile.report["advice"]["behind"]["times"]["wall"]
    waited = wall["parts"].get("in the agent's scheduler", 0.0)
    assert waited >= 2.0, wall
    assert wall["parts"]["in the pilot's queue"] < 1.0, wall  # handed over at once
    assert wall["whole"] == pytest.approx(behind.wall_s, abs=1e-6)
    assert sum(wall["parts"].values()) == pytest.approx(behind.wall_s, abs=1e-6)
    assert f"{waited:.1f} s in the agent's scheduler" in behind.summary()
    # the first run's own 4 s are its analyze (cores held), not a wait; its reduce may
    # wait for the second run's analyze, which asked for the cores first (seen in CI)
    ahead_wall = ahead.profile.report["advice"]["ahead"]["times"]["wall"]
    assert ahead_wall["parts"]["analyze"] >= 4.0, ahead_wall
    assert sum(ahead_wall["parts"].values()) == pytest.approx(ahead.wall_s, abs=1e-6)


def test_the_example_script_runs_end_to_end(tmp_path, adk, solvated, reference_results):
    import MDAnalysis as mda
    from MDAnalysis.analysis.rdf import InterRDF
    proc = subprocess.run([sys.executable, EXAMPLE], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first peak at" in proc.stdout and "rank 1:" in proc.stdout
    rmsd = trajflow.open_run(tmp_path / "example-rmsd")
    np.testing.assert_allclose(rmsd.results.rmsd, reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                               atol=1e-4)
    u = mda.Universe(*solvated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = InterRDF(u.select_atoms("name OW"), u.select_atoms("name OW"), nbins=80,
                       range=(0.0, 8.0), exclusion_block=(1, 1)).run().results
    rdf = trajflow.open_run(tmp_path / "example-rdf")
    np.testing.assert_allclose(rdf.results.rdf, ref.rdf, rtol=1e-6)
    assert (tmp_path / "example-rdf" / "report.html").exists()
    assert sorted(os.listdir(tmp_path)) == ["example-pilot", "example-rdf", "example-rmsd"]


def test_an_mdanalysis_run_on_the_backend_equals_its_serial_run(pilot, adk, solvated):
    """MDAnalysis' own run() splits and merges; trajflow runs its parts as pilot tasks,
    each profiled, also for a strided slice of frames."""
    import MDAnalysis as mda
    from MDAnalysis.analysis.rdf import InterRDF
    from MDAnalysis.analysis.rms import RMSD
    p, path = pilot
    backend = trajflow.Backend(p, out=str(path), progress=False)
    u = mda.Universe(*solvated)
    ow = u.select_atoms("name OW and index 20000:23000")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = InterRDF(ow, ow, nbins=40, exclusion_block=(1, 1)).run(
            backend=backend, n_workers=3, unsupported_backend=True)
        ref = InterRDF(ow, ow, nbins=40, exclusion_block=(1, 1)).run()
    np.testing.assert_allclose(ours.results.rdf, ref.results.rdf, rtol=1e-6)
    np.testing.assert_array_equal(ours.results.count, ref.results.count)
    run = backend.last_run
    with pytest.raises(trajflow.InputError, match="trust=True"):  # pickled: not by default
        trajflow.open_run(run.path).results
    # concluded again from RUNDIR alone, by the one who wrote it
    reopened = trajflow.open_run(run.path, trust=True).results
    np.testing.assert_allclose(reopened.rdf, ref.results.rdf, rtol=1e-6)
    np.testing.assert_array_equal(reopened.frame, np.arange(u.trajectory.n_frames))
    assert run.ok and run.plan.analysis == "mdanalysis:MDAnalysis.analysis.rdf.InterRDF"
    parts = sorted((r["block"], r["frames"]) for r in run.profile.records if r["task"] == "analyze")
    assert parts == [(0, 4), (1, 3), (2, 3)]
    assert all(r["t_compute"] > 0 for r in run.profile.records if r["task"] == "analyze")
    adk_u = mda.Universe(*adk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = RMSD(adk_u, select="backbone").run(start=2, stop=90, step=3, backend=backend,
                                                  n_workers=2, unsupported_backend=True)
        ref = RMSD(adk_u, select="backbone").run(start=2, stop=90, step=3)
    np.testing.assert_allclose(ours.results.rmsd, ref.results.rmsd, rtol=1e-6)
    np.testing.assert_array_equal(ours.frames, ref.frames)
    assert len(backend.runs) == 2 and backend.runs[0].path != backend.runs[1].path
    # `trajflow runs` shows a Backend run's wall time and its whole class name
    assert all(r.wall_s is not None and r.wall_s > 0 for r in backend.runs)
    listing = subprocess.run([os.path.join(os.path.dirname(sys.executable), "trajflow"), "runs",
                              str(path)], capture_output=True, text=True, timeout=120).stdout
    row = next(line for line in listing.splitlines()
               if line.startswith(os.path.relpath(run.path, path) + " "))
    assert row.split()[1:3] == ["mdanalysis:InterRDF", "done"] and row.split()[4] != "-", listing


def test_the_backend_starts_and_ends_a_pilot_of_its_own(tmp_path, adk):
    import MDAnalysis as mda
    from MDAnalysis.analysis.rms import RMSD
    u = mda.Universe(*adk)
    backend = trajflow.Backend(resource="local.localhost", walltime=10, out=str(tmp_path),
                               progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = RMSD(u, select="name CA").run(backend=backend, n_workers=2, unsupported_backend=True)
        ref = RMSD(u, select="name CA").run()
    np.testing.assert_allclose(ours.results.rmsd, ref.results.rmsd, rtol=1e-6)
    [run] = backend.runs
    assert os.path.dirname(run.path) == str(tmp_path) and run.ok
    assert glob.glob(os.path.join(run.path, "re.session.*"))  # its own pilot's session, in RUNDIR


def test_a_users_helper_module_runs_on_the_pilot(pilot, adk, tmp_path, monkeypatch):
    """`from rgyr_helper import rgyr` in a script (the module beside it, in another folder
    than the tasks run in): the analysis travels by value and equals MDAnalysis."""
    import importlib
    import MDAnalysis as mda
    p, path = pilot
    folder = tmp_path / "my_scripts"
    folder.mkdir()
    from paths import FACTORIES  # the module of the user's own: a copy under another name
    shutil.copyfile(FACTORIES, folder / "rgyr_helper_api.py")
    monkeypatch.syspath_prepend(str(folder))
    helper = importlib.import_module("rgyr_helper_api")
    try:
        run = p.run(adk[0], adk[1], helper.protein_rgyr, mode="tasks", blocks=2,
                    out=str(path / "rgyr"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = helper.protein_rgyr(mda.Universe(*adk)).run().results.rgyr
    finally:
        sys.modules.pop("rgyr_helper_api", None)
    np.testing.assert_allclose(run.results.rgyr, ref, rtol=1e-6)
    assert run.plan.trial["frames"] == 5  # tried in a fresh Python first


def test_a_per_frame_error_is_refused_before_any_pilot(tmp_path, adk, monkeypatch):
    """MDAnalysis serially fails in under a second; trajflow.run too, with the user's
    traceback, no pilot started, no folder left."""
    from paths import FACTORIES
    monkeypatch.syspath_prepend(os.path.dirname(FACTORIES))
    import factories
    monkeypatch.chdir(tmp_path)
    t0 = time.time()
    with pytest.raises(trajflow.InputError, match="AtomGroup is empty") as caught:
        trajflow.run(adk[0], adk[1], factories.empty_selection)
    assert time.time() - t0 < 10
    assert "_single_frame" in str(caught.value)
    assert os.listdir(tmp_path) == []  # no run folder, no RADICAL session
