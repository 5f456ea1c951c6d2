"""The real RADICAL-EnTK pipeline on a local pilot, end to end.

One session carries all these pipelines on one pilot (a local pilot costs
~40 s): rmsd in MPI mode over the shared DCD; dihedrals as single-core tasks
over split XTC segments, in a folder whose name has spaces, quotes, ';', '$'
and non-ASCII letters; a run whose inputs vanish after planning; a block that
fails once and recovers on its retry; an MPI task that keeps failing; and an
MPI rank that kills itself; a user's class that raises past the local trial
(not retried); and a user's InterRDF (a factory file) over the H5MD of the
periodic solvated system. Failed runs must name the task and
leave no result.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from trajflow.tasks import rundir
from trajflow.workflows.run.execute import run_plans
from plans import make_plan
from trajflow.workflows.run.planning import write_plan
from trajflow.workflows.run.spec import PilotSpec
from paths import FACTORIES

pytestmark = pytest.mark.entk


@pytest.fixture(scope="module")
def session(tmp_path_factory, adk, adk_xtc, solvated):
    root = tmp_path_factory.mktemp("entk")
    doomed_top = str(root / "doomed.psf")
    shutil.copy(adk[0], doomed_top)
    dcd = dict(topology=adk[0], trajectories=[adk[1]], analysis="rmsd", io="shared")
    specs = [
        ("rmsd_mpi", dict(dcd, mode="mpi", gather="gatherv", blocks=2, cpus=2), {}),
        ("dihedrals_tasks", dict(topology=adk_xtc[0], trajectories=[adk_xtc[1]], analysis="dihedrals",
                                 io="split", mode="tasks", blocks=2, cpus=2), {}),
        ("doomed", dict(dcd, topology=doomed_top, mode="mpi", blocks=2, cpus=2), {}),
        ("fail_once", dict(dcd, mode="tasks", blocks=2, cpus=2), {"TRAJFLOW_TEST_FAIL": "1:1"}),
        ("fail_always", dict(dcd, mode="mpi", blocks=2, cpus=2), {"TRAJFLOW_TEST_FAIL": "0:5"}),
        ("killed_rank", dict(dcd, mode="mpi", blocks=2, cpus=2), {"TRAJFLOW_TEST_KILL": "1"}),
        ("user_fails_late", dict(dcd, analysis=f"{FACTORIES}:fails_late", mode="tasks", blocks=2,
                                 cpus=2), {}),
        ("user_rdf", dict(topology=solvated[0], trajectories=[solvated[1]],
                          analysis=f"{FACTORIES}:interrdf", args={"nbins": 40},
                          io="h5md", mode="mpi", blocks=2, cpus=2), {}),
    ]
    folders = {"dihedrals_tasks": 'dih "q" $HOME;ü x'}
    runs = []
    for name, kw, _ in specs:
        plan = make_plan(out=str(root / folders.get(name, name)), chunk=16, **kw)
        if name == "killed_rank":  # mpiexec once left rank 0 waiting for the killed rank 1
            plan.collective_timeout_s = 120.0  # (seen in CI): its own abort ends the task
        runs.append((name, plan, write_plan(plan)))
    os.remove(doomed_top)  # the analyze task of "doomed" must now fail
    report = run_plans(runs, PilotSpec(walltime=15, cpus=2), session_root=str(root),
                       retries=1, envs={name: env for name, _, env in specs})
    return report, {name: plan for name, plan, _ in runs}


def test_good_pipelines_end_done_with_mdanalysis_results(session, adk, adk_xtc, reference_results):
    report, plans = session
    for o in report.outcomes:
        if o.pipeline in ("rmsd_mpi", "dihedrals_tasks"):
            assert o.state == "DONE", o.describe()
    with h5py.File(report.results["rmsd_mpi"]) as f:
        ref = reference_results(adk[0], [adk[1]], "rmsd")
        np.testing.assert_allclose(f["rmsd"][()], ref["rmsd"], atol=1e-4)
        assert f.attrs["mode"] == "mpi" and f.attrs["ranks"] == 2
    with h5py.File(report.results["dihedrals_tasks"]) as f:
        ref = reference_results(adk_xtc[0], [adk_xtc[1]], "dihedrals")
        np.testing.assert_allclose(f["features"][()], ref["features"], atol=1e-6)
        assert f.attrs["tasks"] == 2


def test_failed_task_is_reported_and_no_result_is_published(session):
    report, plans = session
    assert not report.ok
    failed = [o for o in report.failed if o.pipeline == "doomed"]
    # shared io has no split stage: its analyze task finds the topology gone
    assert failed and failed[0].stage == "analyze" and failed[0].state == "FAILED"
    assert failed[0].attempt == 2  # retried once, as asked, then given up
    assert report.stopped["doomed"] == "analyze"
    assert failed[0].exit_code not in (None, 0)
    assert "doomed.psf" in failed[0].stderr_tail  # the real cause, from the task's stderr
    assert report.results["doomed"] is None
    assert not os.path.exists(plans["doomed"].result_path())
    # nothing after the failed stage ran
    assert not [o for o in report.outcomes if o.pipeline == "doomed" and o.state == "DONE"]


def test_a_block_that_fails_once_is_retried_and_the_result_is_right(session, adk, reference_results):
    report, plans = session
    retried = [o for o in report.retried if o.pipeline == "fail_once"]
    assert [(o.stage, o.name, o.exit_code) for o in retried] == [("analyze", "analyze.b00001", 3)]
    assert "fail_once" not in [o.pipeline for o in report.failed]
    with h5py.File(report.results["fail_once"]) as f:
        np.testing.assert_allclose(f["rmsd"][()], reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                                   atol=1e-4)


@pytest.mark.parametrize("name,code", [("fail_always", 3), ("killed_rank", None)])
def test_a_task_that_keeps_failing_fails_the_run_and_publishes_nothing(session, name, code):
    report, plans = session
    [failed] = [o for o in report.failed if o.pipeline == name]
    assert failed.stage == "analyze" and failed.attempt == 2 and failed.state == "FAILED"
    if code is not None:
        assert failed.exit_code == code
    assert failed.exit_code not in (None, 0)
    assert "TRAJFLOW_TEST" in failed.stderr_tail
    assert report.stopped[name] == "analyze"
    assert report.results[name] is None and not os.path.exists(plans[name].result_path())
    assert not os.path.exists(plans[name].gathered_part_path())


def test_an_exception_of_the_analysis_own_code_is_not_retried(session):
    """A user's class raising from frame 60 (past the local trial): block 1's task exits
    ANALYSIS_RAISED with the user's traceback and is not run again (a retry would raise
    again), while the killed rank above was; block 0 ended done."""
    from trajflow.tasks.exit_codes import ANALYSIS_RAISED
    report, plans = session
    mine = [o for o in report.outcomes if o.pipeline == "user_fails_late" and o.stage == "analyze"]
    assert sorted((o.name, o.attempt, o.state) for o in mine) == [
        ("analyze.b00000", 1, "DONE"), ("analyze.b00001", 1, "FAILED")]
    [failed] = [o for o in report.failed if o.pipeline == "user_fails_late"]
    assert failed.exit_code == ANALYSIS_RAISED
    assert "fails late on purpose" in failed.stderr_tail and "_single_frame" in failed.stderr_tail
    assert report.stopped["user_fails_late"] == "analyze"
    assert not os.path.exists(plans["user_fails_late"].result_path())
    from trajflow.workflows.profile.inspection import how_it_ended
    ending = "\n".join(how_it_ended(plans["user_fails_late"].workdir, plans["user_fails_late"])["lines"])
    assert "fix it and start a new run" in ending and "--resume" not in ending, ending


def test_every_rank_left_a_timing_record_also_in_radicals_profile(session):
    report, plans = session
    ranks = [json.loads(open(p).readline())
             for p in sorted(glob.glob(plans["rmsd_mpi"].profile_path("analyze.*")))]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    # the default schedule of a built-in analysis in mpi mode: chunks claimed as they go
    assert sum(r["frames"] for r in ranks) == 98
    # a rank that starts late may find every chunk taken (claims before MPI_Init)
    assert max(r["frames"] for r in ranks) > 0
    for r in ranks:
        assert r["schedule"] == "dynamic" and r["frames"] >= 0 and r["t_total"] > 0
        assert sum(c[3] - c[2] for c in r["chunks"]) == r["frames"]
        assert r["t_total"] >= r["t_io"] + r["t_compute"] + r["t_wait"] + r["t_comm"]
    task = next(o for o in report.outcomes if o.pipeline == "rmsd_mpi" and o.stage == "analyze")
    # RUNDIR's copy of the task's own profile (beside it: its lines of the scheduler's)
    [own] = [p for p in glob.glob(os.path.join(task.kept, "*.prof"))
             if os.path.basename(p) != rundir.SCHEDULING]
    prof = open(own).read()
    assert "app_compute_start" in prof and "rank=0" in prof and "rank=1" in prof
    assert task.kept.startswith(plans["rmsd_mpi"].path("radical"))
    assert not os.path.exists(task.sandbox)  # the pilot's sandbox is removed at the end
    sid = next(p for p in task.sandbox.split(os.sep) if p.startswith("re.session."))
    assert not os.path.exists(os.path.join(os.environ.get("TMPDIR", "/tmp"), sid))  # RP's task tmp


def test_the_trace_shows_radicals_launch_start_up_and_exit_around_every_rank(session, tmp_path):
    from trajflow.workflows.profile.inspection import inspect_runs
    from trajflow.workflows.profile.trace import trace_events
    report, plans = session
    events = trace_events(inspect_runs([plans["rmsd_mpi"].workdir]))["traceEvents"]
    analyze = [e for e in events if e["ph"] == "X" and e["args"].get("task") == "analyze"]
    worked = 0
    for rank in (0, 1):
        mine = {e["name"]: e for e in analyze if e["tid"] == rank}
        assert {"launch", "start-up", "exit", "setup"} <= set(mine), sorted(mine)
        # RADICAL's launch, then the rank's start-up, then its phases, then its exit
        assert mine["launch"]["ts"] + mine["launch"]["dur"] <= mine["start-up"]["ts"] + 1
        assert mine["start-up"]["ts"] + mine["start-up"]["dur"] <= mine["setup"]["ts"] + 1
        if "compute" in mine:  # a rank that starts late may find every chunk taken
            worked += 1
            assert mine["start-up"]["ts"] + mine["start-up"]["dur"] <= mine["io"]["ts"] + 1
            assert mine["exit"]["ts"] >= mine["compute"]["ts"] + mine["compute"]["dur"] - 1
    assert worked >= 1
    assert len({e["pid"] for e in analyze}) == 1  # one MPI task: one process, a thread per rank
    [pilot] = [e for e in events if e["ph"] == "X" and e["name"] == "pilot"]  # its own row
    assert pilot["ts"] <= min(e["ts"] for e in analyze)
    assert pilot["ts"] + pilot["dur"] >= max(e["ts"] + e["dur"] for e in analyze)


def test_cli_run_exits_zero_and_says_where_things_are(tmp_path, adk, reference_results):
    out = tmp_path / "cli run"  # a space in the path, on purpose
    cwd = tmp_path / "where the user stands"
    cwd.mkdir()
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "trajflow"), "run",
                           "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                           "--mode", "mpi", "--gather", "rma", "--cpus", "2", "--walltime", "10",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert os.listdir(cwd) == []  # RADICAL's client session went into RUNDIR, not here
    sessions = glob.glob(str(out / "re.session.*"))
    assert len(sessions) == 1 and os.path.exists(os.path.join(sessions[0], "pmgr.0000.prof"))
    assert str(out / "result.h5") in proc.stdout
    with h5py.File(out / "result.h5") as f:
        assert f["rmsd"].shape == (98, 3) and f.attrs["gather"] == "rma"
    # the summary, written while the pilot was shut down, is printed and on disk
    assert "timeline and phases:" in proc.stdout and (out / "report.html").exists()
    # the follow-up command it prints works pasted into a shell, space and all
    follow = re.search(r"\((trajflow inspect .*) for the table\)", proc.stdout).group(1)
    pasted = subprocess.run(follow, shell=True, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PATH": os.path.dirname(sys.executable) + ":"
                                 + os.environ["PATH"]})
    assert pasted.returncode == 0 and "analyze" in pasted.stdout, pasted.stderr
    # progress lines went to stderr: the pilot, every stage, the run's end
    for line in ("pilot requested on local.localhost", "pilot: active",
                 "analyze submitted: 1 task(s), 2 MPI ranks",
                 "analyze done (and reduce: its gather's root published result.h5)",
                 "cli run: done"):
        assert line in proc.stderr, proc.stderr
    assert "split submitted" not in proc.stderr  # shared io: nothing to prepare
    # a script reopens the CLI's run: the same numbers, the same summary
    import trajflow
    run = trajflow.open_run(out)
    assert run.ok and run.plan.gather == "rma"
    np.testing.assert_allclose(run.results.rmsd, reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                               atol=1e-4)
    assert run.summary().splitlines()[0] in proc.stdout
    # the pilot's bootstrapper was ended after its own END, not before (its profile is
    # kept in the session folder; the sandbox is removed)
    with open(glob.glob(str(out / "radical" / "*" / "outcome.json"))[0]) as fh:
        task_sandbox = json.load(fh)["sandbox"]
    assert not os.path.exists(task_sandbox)
    with open(glob.glob(str(out / "re.session.*" / "pilot.0000" / "bootstrap_0.prof"))[0]) as fh:
        assert fh.read().splitlines()[-1].split(",")[1] == "END"


def test_a_users_analysis_runs_on_the_pilot_and_equals_serial_mdanalysis(session, solvated):
    import warnings
    import MDAnalysis as mda
    from trajflow.tasks.results import open_result
    report, plans = session
    # an MPI run: its analyze task's root concluded the analysis and published result.h5
    [o] = [o for o in report.outcomes if o.pipeline == "user_rdf" and o.stage == "analyze"]
    assert o.state == "DONE", o.describe()
    sys.path.insert(0, os.path.dirname(FACTORIES))
    import factories
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = factories.interrdf(mda.Universe(*solvated), nbins=40).run().results
    got = open_result(plans["user_rdf"].workdir)
    np.testing.assert_allclose(got.rdf, ref.rdf, rtol=1e-6)
    np.testing.assert_array_equal(got.count, ref.count)
