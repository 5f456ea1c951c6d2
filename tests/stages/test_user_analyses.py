"""Any parallelisable MDAnalysis analysis, and a user's own class, through split ->
analyze -> reduce (the task programs as the pilot runs them), against MDAnalysis'
own serial run() of the same object built by the same factory.

Every class runs in mpi mode on the shared trajectory and in tasks mode on the
H5MD conversion (3 blocks each); InterRDF and the user's class run every io
strategy in both modes, and the analyses that take positions when they are
built or read a reference frame (RMSD, Contacts, the user's class) run on split
segments too. Results equal the serial run to 1e-6 relative (exactly for counts).
"""
import json
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping

import h5py
import numpy as np
import pytest

from paths import FACTORIES
from run_stages import plan_and_run
from trajflow.tasks.mda_analyses import parallelisable_classes, read_results
from trajflow.tasks.results import open_result

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
sys.path.insert(0, os.path.dirname(FACTORIES))
import factories  # noqa: E402  the same functions, for the serial runs

# one case per class the installed MDAnalysis declares parallelisable, generated from
# its own list, and a user's own class
GENERATED = [factories.FOR_CLASS.get(name, name) for name in parallelisable_classes()]
CLASSES = tuple(GENERATED) + ("user_class",)
EVERY_STRATEGY = [(io, mode) for io in ("shared", "split", "h5md") for mode in ("mpi", "tasks")]
CASES = ([(name, "shared", "mpi") for name in CLASSES] + [(name, "h5md", "tasks") for name in CLASSES]
         + [(name, io, mode) for name in ("interrdf", "user_class") for io, mode in EVERY_STRATEGY
            if (io, mode) not in (("shared", "mpi"), ("h5md", "tasks"))]
         + [("mda_rmsd", "split", "mpi"), ("contacts", "split", "tasks"),
            ("transformed", "split", "mpi")])


def inputs_for(name, request):
    """The files `name`'s factory is built for: a conftest fixture named in NEEDS, else AdK."""
    for fixture, names in factories.NEEDS.items():
        if name in names:
            return request.getfixturevalue(fixture)
    return request.getfixturevalue("adk")


_serial = {}


def serial_results(name, top, traj, args):
    import MDAnalysis as mda
    key = (name, top, traj)
    if key not in _serial:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _serial[key] = getattr(factories, name)(mda.Universe(top, traj), **args).run().results
    return _serial[key]


# PersistenceLength sums its bond autocorrelation in float32, so the order of the pieces
# moves its fifth digit: MDAnalysis' own 2-worker run differs from its serial run by
# 3.1e-5 there (and its lp by 4e-7)
RTOL = {"persistence_length": 1e-4}


def assert_same(got, ref, where="results", rtol=1e-6):
    assert set(got.keys()) == set(ref.keys()), where
    for key in ref:
        a, b = got[key], ref[key]
        if isinstance(b, Mapping):
            assert_same(a, b, f"{where}.{key}", rtol)
        elif hasattr(b, "grid"):  # a GridDataFormats Density
            np.testing.assert_allclose(a.grid, b.grid, rtol=1e-6, err_msg=f"{where}.{key}")
        elif isinstance(b, np.ndarray) and b.dtype.kind in "US":
            np.testing.assert_array_equal(a, b, err_msg=f"{where}.{key}")
        elif key == "eigenvectors":  # GNM's, one per frame: a sign LAPACK chooses per process
            sign = np.sign(np.sum(a * b, axis=1, keepdims=True))
            assert (sign != 0).all(), f"{where}.{key}: a vector orthogonal to MDAnalysis'"
            np.testing.assert_allclose(a * sign, b, rtol=1e-6, atol=1e-9, err_msg=f"{where}.{key}")
        else:
            np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                       rtol=rtol, atol=1e-12, err_msg=f"{where}.{key}")


@pytest.mark.parametrize("name,io,mode", CASES)
def test_user_analysis_equals_serial_mdanalysis(tmp_path, request, name, io, mode):
    if not hasattr(factories, name):
        pytest.fail(f"MDAnalysis {name} declares itself parallelisable and has no case here: "
                    "add a factory for it to tests/analyses/factories.py (FOR_CLASS), or say in "
                    "docs/guide/own-analysis.md why it cannot run")
    top, traj = inputs_for(name, request)
    args = {"nbins": 50} if name == "interrdf" else {}
    path, plan = plan_and_run(tmp_path / "run", top, [traj], f"{FACTORIES}:{name}", io=io,
                              mode=mode, blocks=3, cpus=3, args=args, side_by_side=True)
    with h5py.File(path) as f:
        got = read_results(f["results"], trust=True)  # its own run: Density is pickled
        n = plan.n_frames
        np.testing.assert_array_equal(f["frame"][()], np.arange(n))
        assert f.attrs["analysis"] == f"{FACTORIES}:{name}"
        assert f.attrs["analysis_args"] == __import__("json").dumps(args)
        assert "MDAnalysis" in f.attrs["versions"]
    ref = serial_results(name, top, traj, args)
    if name == "linear_density":
        # LinearDensity keeps a view of the Universe's box and bins from it, so its
        # hist_bin_edges follow whichever frame the view last saw: MDAnalysis itself
        # gives the last frame's box serially and frame 0's with multiprocessing
        # (an MDAnalysis defect); trajflow gives block 0's last frame's. The
        # densities are equal; the edges are checked to span one frame's box.
        import MDAnalysis as mda
        boxes = [ts.dimensions[:3].max() for ts in mda.Universe(top, traj).trajectory]
        for dim in ("x", "y", "z"):
            edges = got[dim].pop("hist_bin_edges")
            assert any(np.allclose(edges, np.linspace(0, b, len(edges))) for b in boxes)
            ref = {**ref, dim: {k: v for k, v in ref[dim].items() if k != "hist_bin_edges"}}
    assert_same(got, ref, rtol=RTOL.get(name, 1e-6))
    check_whole_result(plan, got)


# a dynamic schedule gives each chunk of frames its own copy of the analysis and merges
# dozens of pieces with the class' aggregator: sums, stacked arrays, nested results
DYNAMIC_CASES = [("user_class", "shared"), ("mda_rmsd", "split"), ("contacts", "h5md"),
                 ("radius_of_gyration", "shared"), ("dihedral", "split"), ("hbonds", "shared"),
                 ("interrdf", "h5md")]


@pytest.mark.parametrize("name,io", DYNAMIC_CASES)
def test_user_analysis_on_a_dynamic_schedule_equals_serial_mdanalysis(tmp_path, request,
                                                                      name, io):
    top, traj = inputs_for(name, request)
    args = {"nbins": 50} if name == "interrdf" else {}  # serial_results' cache has these
    path, plan = plan_and_run(tmp_path / "run", top, [traj], f"{FACTORIES}:{name}", io=io,
                              mode="mpi", schedule="dynamic", blocks=2, cpus=2, args=args)
    with h5py.File(path) as f:
        got = read_results(f["results"], trust=True)  # its own run: Density is pickled
        assert f.attrs["schedule"] == "dynamic"
    assert_same(got, serial_results(name, top, traj, args))
    check_whole_result(plan, got)
    chunks = [c for rank in (0, 1) for c in json.load(open(plan.profile_path(
        f"analyze.block_{rank:05d}")))["chunks"]]
    assert sorted(c[0] for c in chunks) == list(range(len(chunks)))  # each chunk once
    assert len(chunks) == (2 if name == "interrdf" else 24)  # 10 frames: one chunk per block


def check_whole_result(plan, got):
    whole = open_result(plan.workdir)  # what a user reads back: the results plus frame and time
    assert set(whole) == set(got) | {"frame", "time"}
    np.testing.assert_array_equal(whole["frame"], np.arange(plan.n_frames))
    # the factory travelled with the run
    assert open(plan.path(plan.factory["copy"])).read() == open(FACTORIES).read()


@pytest.mark.serial  # judges time: run alone (see the Makefile)
def test_user_analysis_profile_separates_reading_from_computing(tmp_path, adk):
    """Each rank's record has io and compute from the wrapped frame loop, and the
    injected compute delay of block 1 shows in block 1's compute only."""
    import json
    top, traj = adk
    plan_and_run(tmp_path / "run", top, [traj], f"{FACTORIES}:radius_of_gyration", mode="tasks",
                 blocks=3, cpus=3, env={"TRAJFLOW_TEST_DELAY": "1:compute:1.0"})
    recs = {}
    for b in range(3):
        with open(tmp_path / "run" / "profile" / f"analyze.block_{b:05d}.jsonl") as fh:
            recs[b] = json.loads(fh.readline())
    for b, r in recs.items():
        assert r["frames"] == [33, 33, 32][b] and r["t_io"] > 0 and r["t_compute"] > 0
    assert recs[1]["t_compute"] > 1.0 > max(recs[0]["t_compute"], recs[2]["t_compute"])
    assert max(r["t_io"] for r in recs.values()) < 1.0


def trajflow_run(adk, tmp_path, analysis, *extra):
    return subprocess.run([TRAJFLOW, "run", "--topology", adk[0], "--trajectory", adk[1],
                           "--analysis", analysis, "--out", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.parametrize("analysis,extra,message", [
    (f"{FACTORIES}:einstein_msd", [], "EinsteinMSD does not declare itself parallelisable"),
    (f"{FACTORIES}:helanal", [], "HELANAL does not declare itself parallelisable"),
    (f"{FACTORIES}:serial_only", [], "_get_aggregator()"),
    (f"{FACTORIES}:raises", [], "the factory failed on your inputs (RuntimeError: this factory is broken"),
    (f"{FACTORIES}:empty_selection", [], "ValueError: AtomGroup is empty."),
    (f"{FACTORIES}:no_rule_for_a_result", [], "no rule for results.total; declare each in "
                                              "NoRuleForTotal._get_aggregator()"),
    (f"{FACTORIES}:missing", [], "has no 'missing'"),
    ("/nonexistent/file.py:f", [], "does not exist"),
    ("no_such_module_xyz:f", [], "No module named 'no_such_module_xyz'"),
    (f"{FACTORIES}:not_an_analysis", [], "not an MDAnalysis analysis"),
    (f"{FACTORIES}:interrdf", ["--analysis-args", "{nbins: 3}"], "is not JSON"),
    (f"{FACTORIES}:interrdf", ["--analysis-args", "[1, 2]"], "JSON object"),
    (f"{FACTORIES}:mda_rmsd", ["--select", "name CA"], "drop --select"),
    ("sasa", [], "unknown --analysis"),
])
def test_unusable_analyses_are_refused_before_any_pilot(adk, tmp_path, analysis, extra, message):
    proc = trajflow_run(adk, tmp_path, analysis, *extra)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("re.session")]


def test_resume_refuses_a_changed_factory(tmp_path, adk):
    from plans import make_plan
    from trajflow.workflows.run.planning import InputError, plan_for_resume, write_plan
    factory = tmp_path / "mine.py"
    factory.write_text(open(FACTORIES).read())
    plan = make_plan(adk[0], [adk[1]], f"{factory}:mda_rmsd", str(tmp_path / "run"), blocks=2)
    write_plan(plan)
    assert plan_for_resume(plan.workdir).factory["checksum"] == plan.factory["checksum"]
    factory.write_text(open(FACTORIES).read() + "\n# changed\n")
    with pytest.raises(InputError, match="analysis code .* changed"):
        plan_for_resume(plan.workdir)


def test_the_runnable_classes_come_from_the_installed_mdanalysis():
    proc = subprocess.run([TRAJFLOW, "analyses"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines()[1:]}
    assert {"InterRDF", "InterRDF_s", "Contacts", "HydrogenBondAnalysis", "DensityAnalysis",
            "LinearDensity", "DSSP", "Dihedral", "Janin", "AtomicDistances", "DistanceMatrix",
            "AnalysisFromFunction", "RMSD"} <= listed
    assert "RMSF" not in listed and "PCA" not in listed


def test_inspect_reads_a_user_analysis_run(tmp_path, adk):
    path, _ = plan_and_run(tmp_path / "run", adk[0], [adk[1]], f"{FACTORIES}:mda_rmsd",
                           mode="mpi", blocks=2, cpus=2)
    with h5py.File(path) as f:  # the run itself is MDAnalysis' serial RMSD
        assert_same(read_results(f["results"], trust=True),
                    serial_results("mda_rmsd", adk[0], adk[1], {}))
    proc = subprocess.run([TRAJFLOW, "inspect", str(tmp_path / "run"), "--json",
                           str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with open(tmp_path / "r.json", encoding="utf-8") as fh:
        report = json.load(fh)
    # inspect read this run's two analyze ranks, 98 frames shared 49 and 49
    analyze = [r for r in report["records"] if r["task"] == "analyze"]
    assert sorted(r["frames"] for r in analyze) == [49, 49], analyze
    assert "analyze" in proc.stdout


FACTORY = """
from {helper} import RadiusOfGyration


def rgyr(u):
    return RadiusOfGyration(u.select_atoms("protein"))


def lazy(u):
    import {lazy}  # imported when called: a module trajflow cannot see to ship
    return RadiusOfGyration(u.select_atoms({lazy}.SELECTION))
"""


@pytest.fixture
def users_folder(tmp_path):
    """A folder of the user's own: a factory module importing a helper module beside it,
    and a module imported only inside a function; importable here (as from a script's
    folder), not where the tasks run. Module names unique to the test."""
    import importlib
    folder = tmp_path / "mine"
    folder.mkdir()
    tag = tmp_path.name.replace("-", "_").replace("[", "_").replace("]", "_")
    names = {"helper": f"helper_{tag}", "lazy": f"lazy_{tag}", "factory": f"factory_{tag}"}
    shutil.copyfile(FACTORIES, folder / f"{names['helper']}.py")  # a module of the user's own
    (folder / f"{names['lazy']}.py").write_text("SELECTION = 'protein'\n")
    (folder / f"{names['factory']}.py").write_text(FACTORY.format(**names))
    sys.path.insert(0, str(folder))
    try:
        yield folder, importlib.import_module(names["factory"]), names
    finally:
        sys.path.remove(str(folder))
        for name in names.values():
            sys.modules.pop(name, None)


def test_a_users_own_modules_travel_with_the_analysis(tmp_path, adk, users_folder):
    """A factory file importing a module beside it, and a script's function from a
    module of the user's own (pickled by value): the tasks, whose Python has neither
    folder on its path, run them and equal MDAnalysis."""
    import MDAnalysis as mda
    folder, module, names = users_folder
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = module.rgyr(mda.Universe(*adk)).run().results.rgyr
    for label, analysis in (("file", f"{folder}/{names['factory']}.py:rgyr"),
                            ("function", module.rgyr)):
        _, plan = plan_and_run(tmp_path / label, adk[0], [adk[1]], analysis, io="shared",
                               mode="tasks", blocks=2, cpus=2)
        assert plan.trial["frames"] == 5, plan.trial  # tried here first, in a fresh Python
        np.testing.assert_allclose(open_result(plan.workdir).rgyr, expected, rtol=1e-6)
    # the factory file's copy and the one module beside it that it imports, no other
    assert sorted(os.listdir(tmp_path / "file" / "analysis")) == sorted(
        [f"{names['factory']}.py", f"{names['helper']}.py"])


def test_a_module_that_would_not_reach_the_tasks_is_refused_here(tmp_path, adk, users_folder):
    """A module imported inside the function is not seen when pickling: the fresh Python
    of the trial cannot import it, as the tasks could not; refused before any pilot."""
    from trajflow.workflows.errors import InputError
    folder, module, names = users_folder
    with pytest.raises(InputError, match=f"No module named '{names['lazy']}'") as caught:
        plan_and_run(tmp_path / "run", adk[0], [adk[1]], module.lazy, mode="tasks", blocks=2)
    assert "cannot be loaded where the tasks run" in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_a_per_frame_error_is_refused_before_any_pilot(adk, tmp_path):
    """MDAnalysis fails at once serially; so does trajflow, in its trial on the
    workstation, before any pilot or run folder, with the user's traceback (their file,
    their line). (How long that takes is the latency bench's to say, not a test's.)"""
    proc = trajflow_run(adk, tmp_path, f"{FACTORIES}:empty_selection")
    assert proc.returncode == 2, proc.stderr
    assert "failed on the first 5 frame(s)" in proc.stderr and "_single_frame" in proc.stderr
    assert "factories.py" in proc.stderr and "--no-trial" in proc.stderr
    assert "pilot" not in proc.stdout.lower()
    assert not (tmp_path / "run").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("re.session")]


def test_the_trial_tries_the_frames_the_run_analyses(tmp_path, adk):
    """An analysis that fails before frame 50 runs with start=50 (tried on frames 50-54,
    not 0-4) and equals MDAnalysis' run(start=50); without it, it is refused here."""
    import MDAnalysis as mda
    from trajflow.workflows.errors import InputError
    _, plan = plan_and_run(tmp_path / "late", adk[0], [adk[1]], f"{FACTORIES}:fails_early",
                           mode="tasks", blocks=2, start=50)
    assert plan.trial["frames"] == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = factories.fails_early(mda.Universe(*adk)).run(start=50).results
    got = open_result(plan.workdir)
    np.testing.assert_allclose(got.com, ref.com, rtol=1e-6)
    with pytest.raises(InputError, match="nothing to analyse before frame 50"):
        plan_and_run(tmp_path / "all", adk[0], [adk[1]], f"{FACTORIES}:fails_early",
                     mode="tasks", blocks=2)
    assert not (tmp_path / "all").exists()
