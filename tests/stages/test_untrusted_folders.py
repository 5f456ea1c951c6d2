"""Run folders, campaign files and remote records written by someone else (issue 42).

A folder from shared project space is data, never code: opening, inspecting,
listing, displaying and resuming it runs nothing from it, writes nothing outside
it, and ends each command with one clear line (exit 2 for a folder that is not a
run trajflow wrote). Each case was reproduced on the code before the fix.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import trajflow
from run_stages import plan_and_run, run_stages
from trajflow.tasks import rundir
from trajflow.tasks.plan import PlanError, RunPlan
from trajflow.workflows.errors import InputError

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
FOLDER_LIMIT_S = 120  # every command on a crafted folder ends well within this


class _Planted:
    """Unpickling this touches `path`: the code a crafted result.h5 would run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def trajflow_cli(*args, cwd=None):
    return subprocess.run([TRAJFLOW, *args], capture_output=True, text=True,
                          timeout=FOLDER_LIMIT_S, cwd=cwd, stdin=subprocess.DEVNULL)


def one_line_error(proc):
    """The command said what is wrong in one line (argparse's after its usage), without a
    traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines()
             if line.startswith("trajflow:") or line.startswith("trajflow run: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def finished(adk, tmp_path_factory):
    """A real, complete run (rmsd of AdK, tasks mode, 2 blocks) to copy and tamper with."""
    out = tmp_path_factory.mktemp("finished") / "run"
    _, plan = plan_and_run(out, adk[0], [adk[1]], "rmsd", mode="tasks", blocks=2,
                           side_by_side=True)
    rundir.record_outcome(str(out), "done")
    return str(out)


@pytest.fixture
def copy(finished, tmp_path):
    """A fresh copy of the finished run in a folder of its own."""
    target = tmp_path / "copied"
    shutil.copytree(finished, target)
    return str(target)


def plant_pickle(run, marker):
    with h5py.File(os.path.join(run, rundir.RESULT), "a") as f:
        group = f.require_group("results")
        group.create_dataset("evil.pickle", data=np.void(pickle.dumps(_Planted(marker))))


def test_a_planted_pickle_runs_nothing_unless_trusted(copy, tmp_path):
    marker = tmp_path / "the-planted-code-ran"
    plant_pickle(copy, marker)
    run = trajflow.open_run(copy)
    assert isinstance(run.results["evil"], trajflow.tasks.mda_analyses.PickledNotLoaded)
    assert run.not_loaded == ["evil"] and run.ok
    assert "not loaded" in repr(run.results["evil"])
    run._repr_html_()
    run.profile._repr_html_()
    assert run.write_report() == os.path.join(copy, rundir.REPORT)
    trajflow.open_result(copy)
    assert "1 result(s) stored with pickle (evil)" in run.summary()
    for args in (["inspect", copy, "--html", str(tmp_path / "r.html")], ["runs", copy]):
        proc = trajflow_cli(*args)
        assert proc.returncode == 0, proc.stderr
    assert "trust=True" in trajflow_cli("inspect", copy).stdout
    assert not marker.exists()
    trajflow.open_run(copy, trust=True).results  # noqa: the user said they trust it
    assert marker.exists()  # the plant works: without trust it was never loaded


def test_a_backend_run_from_others_is_not_unpickled(copy, tmp_path):
    marker = tmp_path / "the-planted-code-ran"
    with open(os.path.join(copy, rundir.PLAN), encoding="utf-8") as fh:
        plan = json.load(fh)
    plan["backend"] = True
    with open(os.path.join(copy, rundir.PLAN), "w", encoding="utf-8") as fh:
        json.dump(plan, fh)
    os.makedirs(os.path.join(copy, "backend"), exist_ok=True)
    for name in ("results.pickle", "compute.pickle"):
        with open(os.path.join(copy, "backend", name), "wb") as fh:
            pickle.dump(_Planted(marker), fh)
    run = trajflow.open_run(copy)
    with pytest.raises(InputError, match="trust=True"):
        run.results
    run._repr_html_()
    assert trajflow_cli("inspect", copy).returncode in (0, 1)
    assert not marker.exists()


def test_links_in_a_run_folder_are_never_written_through(copy, tmp_path):
    victim = tmp_path / "authorized_keys"
    victim.write_text("the user's own file\n")
    for name in (rundir.REPORT, rundir.OUTCOME):
        os.remove(os.path.join(copy, name)) if os.path.lexists(os.path.join(copy, name)) else None
        os.symlink(victim, os.path.join(copy, name))
    trajflow.open_run(copy).write_report()
    rundir.record_outcome(copy, "done")
    assert victim.read_text() == "the user's own file\n"
    assert not os.path.islink(os.path.join(copy, rundir.REPORT))
    assert rundir.read_outcome(copy)["status"] == "done"
    # the old temporary name, planted as a link: a random name is used instead
    os.symlink(victim, os.path.join(copy, f"{rundir.PLAN}.{os.getpid()}.tmp"))
    trajflow.open_run(copy).plan.save(os.path.join(copy, rundir.PLAN))
    assert victim.read_text() == "the user's own file\n"


@pytest.mark.parametrize("name", [rundir.LOCK, rundir.RESERVE, "parts"])
def test_resume_refuses_a_link_among_the_runs_own_names(copy, tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    os.remove(os.path.join(copy, rundir.RESULT))
    target = os.path.join(copy, name)
    shutil.rmtree(target) if os.path.isdir(target) and not os.path.islink(target) else None
    if os.path.lexists(target):
        os.remove(target)
    os.symlink(victim, target)
    proc = trajflow_cli("run", "--resume", copy)
    assert proc.returncode == 2
    assert "symbolic link" in one_line_error(proc) and name in proc.stderr
    assert victim.read_text() == "keep me\n"


def test_resume_refuses_a_fifo_among_the_runs_own_names(copy):
    """A FIFO at selection.npz would hang the resume's read of it."""
    os.remove(os.path.join(copy, rundir.RESULT))
    os.remove(os.path.join(copy, rundir.SELECTION))
    os.mkfifo(os.path.join(copy, rundir.SELECTION))
    proc = trajflow_cli("run", "--resume", copy)
    assert proc.returncode == 2 and rundir.SELECTION in one_line_error(proc)


def test_text_results_are_hdf5_not_pickle(tmp_path):
    """DSSP's letters and plain strings are read without trust (before: pickled)."""
    from trajflow.tasks.mda_analyses import read_results, write_results
    values = {"dssp": np.array([["-", "E"], ["H", "H"]]), "label": "héllo", "n": 3}
    with h5py.File(tmp_path / "r.h5", "w") as f:
        write_results(f.create_group("results"), values)
    with h5py.File(tmp_path / "r.h5") as f:
        assert not [name for name in f["results"] if name.endswith(".pickle")]
        got = read_results(f["results"])
    np.testing.assert_array_equal(got["dssp"], values["dssp"])
    assert got["dssp"].dtype == values["dssp"].dtype and got["label"] == "héllo"


def test_a_new_run_refuses_a_lock_planted_as_a_link(adk, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / rundir.LOCK)
    proc = trajflow_cli("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis",
                        "rmsd", "--out", str(out))
    assert proc.returncode == 2 and "not a plain file" in one_line_error(proc)
    assert victim.read_text() == "keep me\n"


def test_a_copied_run_resumes_in_the_folder_given(finished, tmp_path):
    """A copy of run A resumed as B: B gets the result, A is not written (before: A got
    B's result, outcome, report and RADICAL session, B only the lock)."""
    from trajflow.workflows.run.planning import plan_for_resume
    a, b = tmp_path / "A", tmp_path / "B"
    shutil.copytree(finished, a)
    os.remove(a / rundir.RESULT)
    rundir.record_outcome(str(a), "failed", "stopped on purpose")
    shutil.copytree(a, b)
    before = {p: os.path.getmtime(p) for p in a.rglob("*")}
    plan = plan_for_resume(str(b))
    try:
        assert plan.workdir == str(b)
        rundir.begin_attempt(plan.workdir)  # as the Pilot does
        run_stages(plan, plan.path(rundir.PLAN), side_by_side=True)
        rundir.record_outcome(plan.workdir, "done")
    finally:
        plan.lock.release()
    assert (b / rundir.RESULT).exists() and not (a / rundir.RESULT).exists()
    assert {p: os.path.getmtime(p) for p in a.rglob("*")} == before
    expected = trajflow.open_run(finished).results.rmsd
    np.testing.assert_array_equal(trajflow.open_run(str(b)).results.rmsd, expected)


GARBAGE_PLANS = {
    "empty": b"", "not JSON": b"{plan", "truncated": None, "a list": b"[1, 2]",
    "not UTF-8": b'{"workdir": "\xff\xfe"}', "unknown key": None, "wrong type": None,
    "missing key": None, "a million blocks": None, "deep": b"[" * 100_000 + b"]" * 100_000,
    "absolute factory copy": None, "unknown io": None, "a 400-digit number": None,
    "truncated without its file": None, "factory without checksum": None,
}


def garbage_plan(kind, good):
    text = GARBAGE_PLANS[kind]
    if text is not None:
        return text
    plan = json.loads(good)
    if kind == "truncated":
        return good[:len(good) // 2]
    if kind == "unknown key":
        plan["run_this"] = "os.system('x')"
    elif kind == "wrong type":
        plan["blocks"] = "all of them"
    elif kind == "missing key":
        del plan["n_frames"]
    elif kind == "a million blocks":
        plan["blocks"] = [[0, 1]] * (2 << 20)
    elif kind == "absolute factory copy":
        plan["factory"] = {"kind": "file", "copy": "/etc/passwd", "source": None}
    elif kind == "unknown io":
        plan["io"] = "bogus"
    elif kind == "a 400-digit number":
        plan["asked_at"] = 10 ** 400
    elif kind == "truncated without its file":
        plan["truncated"] = {"analysed": 3}
    elif kind == "factory without checksum":
        plan["factory"] = {"kind": "file", "copy": "analysis/f.py", "source": "/x/f.py",
                           "name": "f"}
    return json.dumps(plan).encode()


@pytest.mark.parametrize("kind", sorted(GARBAGE_PLANS))
def test_a_plan_that_is_not_trajflows_is_one_line_everywhere(finished, tmp_path, kind):
    good_run = tmp_path / "good"
    shutil.copytree(finished, good_run)
    bad = tmp_path / "bad"
    shutil.copytree(finished, bad)
    good = (good_run / rundir.PLAN).read_bytes()
    (bad / rundir.PLAN).write_bytes(garbage_plan(kind, good))
    with pytest.raises(PlanError):
        RunPlan.load(str(bad / rundir.PLAN))
    with pytest.raises(InputError):
        trajflow.open_run(str(bad))
    for args in (["inspect", str(bad)], ["run", "--resume", str(bad)]):
        proc = trajflow_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "plan.json" in one_line_error(proc)
    listing = trajflow_cli("runs", str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    assert "bad: UNREADABLE" in listing.stdout and "\ngood " in listing.stdout


def test_a_backend_plan_with_groups_by_frame_number_is_valid(finished, tmp_path):
    """A Backend run's blocks are MDAnalysis' groups by frame number (start/stop/step give
    blocks beyond n_frames, an empty group gives (0, 0)): the schema takes them."""
    from trajflow.tasks.plan import check_plan_dict
    plan = json.loads((open(os.path.join(finished, rundir.PLAN)).read()))
    plan.update(backend=True, n_frames=30, blocks=[[2, 45], [47, 90], [0, 0]])
    check_plan_dict(plan)


def test_records_that_are_not_trajflows_are_skipped(copy):
    with open(os.path.join(copy, "profile", "odd.jsonl"), "w") as fh:
        for rec in ({"task": "analyze", "t_start": 1, "t_stop": 2, "t_total": 1, "rank": "0"},
                    {"task": "analyze", "t_start": 1, "t_stop": 2, "t_total": 1e999},
                    {"task": "analyze", "t_start": 1, "t_stop": 2, "t_total": 1,
                     "intervals": [["io", 1]]},
                    {"task": "analyze", "t_start": 1, "t_stop": 2, "t_total": 1, "t_wait": None},
                    {"task": "analyze", "t_start": 1, "t_stop": 2, "t_total": 1, "size": 2,
                     "rank": 1, "t_setup": None, "setup_parts": {"mpi_init": 0.5}}):
            fh.write(json.dumps(rec) + "\n")
    proc = trajflow_cli("inspect", copy)
    assert proc.returncode == 0 and "5 line(s) that are not timing records" in proc.stdout, \
        proc.stdout + proc.stderr
    os.mkfifo(os.path.join(copy, "parts", "block_00000.h5"))  # a part that never ends
    os.remove(os.path.join(copy, rundir.RESULT))
    proc = trajflow_cli("inspect", copy)
    assert proc.returncode == 1 and "--resume" in proc.stdout


def test_a_campaign_folder_whose_experiments_are_not_trajflows(tmp_path):
    (tmp_path / ".trajflow-campaign").write_text("x")
    for content in ('{"analysis": "rmsd", "experiments": [{"id": "a"}]}', "[]",
                    '{"analysis": "rmsd", "experiments": [{"id": "a", "resource": "r", '
                    '"ranks": 1, "io": "shared", "mode": "mpi", "gather": "-", '
                    '"rundir": "../../etc"}]}'):
        (tmp_path / "experiments.json").write_text(content)
        proc = trajflow_cli("inspect", str(tmp_path))
        assert proc.returncode == 2 and "experiments.json" in one_line_error(proc)


def test_a_fifo_in_profile_is_skipped_not_waited_on(copy):
    os.mkfifo(os.path.join(copy, "profile", "planted.jsonl"))
    os.mkfifo(os.path.join(copy, rundir.OUTCOME + ".fifo"))
    with open(os.path.join(copy, "profile", "odd.jsonl"), "w") as fh:
        fh.write('not json\n[1]\n{"t_start": "soon", "t_total": 1}\n')
    proc = trajflow_cli("inspect", copy)
    assert proc.returncode == 0, proc.stderr
    assert "planted.jsonl: not a plain file, skipped" in proc.stdout
    assert "odd.jsonl: 3 line(s) that are not timing records skipped" in proc.stdout


def test_an_outcome_fifo_is_read_as_damaged_not_waited_on(copy):
    os.remove(os.path.join(copy, rundir.OUTCOME))
    os.mkfifo(os.path.join(copy, rundir.OUTCOME))
    outcome = rundir.read_outcome(copy)
    assert outcome["status"] == "failed" and "not one trajflow wrote" in outcome["error"]


def test_a_result_that_is_not_hdf5_is_not_ok(copy):
    with open(os.path.join(copy, rundir.RESULT), "wb") as fh:
        fh.write(b"this is not HDF5")
    run = trajflow.open_run(copy)
    assert not run.ok
    proc = trajflow_cli("inspect", copy)
    assert proc.returncode == 1 and "DAMAGED" in proc.stdout and "not an HDF5 file" in proc.stdout


def test_inspect_into_a_missing_folder_says_so(copy, tmp_path):
    proc = trajflow_cli("inspect", copy, "--html", str(tmp_path / "no" / "such" / "r.html"))
    assert proc.returncode == 2 and "does not exist" in one_line_error(proc)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=6), max_leaves=30))
def test_any_json_as_plan_or_outcome_is_refused_or_read_never_a_traceback(tmp_path_factory, value):
    """Arbitrary JSON as plan.json: PlanError (one line) or a plan; as outcome.json: a
    record with status done or failed; never another exception."""
    folder = tmp_path_factory.mktemp("any")
    text = json.dumps(value)
    (folder / rundir.PLAN).write_text(text)
    (folder / rundir.OUTCOME).write_text(text)
    try:
        RunPlan.load(str(folder / rundir.PLAN))
    except PlanError as exc:
        assert "\n" not in str(exc) and "plan.json" in str(exc)
    outcome = rundir.read_outcome(str(folder))
    assert outcome["status"] in ("done", "failed")
    assert all(isinstance(t, str) for t in outcome["failed_tasks"])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries({}, optional={
    "repeat": st.integers() | st.floats() | st.booleans() | st.text(max_size=3),
    "chunk": st.integers() | st.floats(),
    "retries": st.integers() | st.floats(),
    "walltime": st.integers() | st.floats(),
    "client_timeout": st.integers() | st.floats() | st.text(max_size=3),
    "blocks": st.integers() | st.floats() | st.none(),
    "out": st.text(max_size=8),
    "limits": st.text(max_size=12)}))
def test_options_from_anywhere_are_finite_whole_and_clean_or_refused(options):
    """The API (and so campaigns and remote runs, which make the same specs): a spec is
    made, with values that are finite, whole where whole and without control characters,
    or InputError; never TypeError, never a NaN that would disable a guard."""
    import math
    from trajflow.workflows.run.spec import PilotSpec, RunSpec, split_options
    run_options, pilot_options = split_options(options, RunSpec, PilotSpec)
    try:
        run, pilot = RunSpec(**run_options), PilotSpec(**pilot_options)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    for value in (run.repeat, run.chunk, run.retries, pilot.walltime, pilot.client_timeout):
        assert math.isfinite(value)
    for value in (run.repeat, run.chunk, run.retries, pilot.walltime):
        assert isinstance(value, int) and not isinstance(value, bool)
    assert run.out is None or not any(c in run.out for c in "\n\r\0")


@pytest.mark.parametrize("flags", [["--client-timeout", "nan"], ["--limits", "session=nan"],
                                   ["--walltime", "inf"], ["--chunk", "nan"],
                                   ["--out", "a\nb"]])
def test_the_command_line_refuses_non_finite_values_and_newlines(adk, tmp_path, flags):
    proc = trajflow_cli("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis",
                        "rmsd", *(["--out", str(tmp_path / "o")] if "--out" not in flags else []),
                        *flags, cwd=str(tmp_path))
    assert proc.returncode == 2
    one_line_error(proc)
    assert os.listdir(tmp_path) == []  # nothing written


def test_a_factory_that_is_not_a_python_file_is_named(adk, tmp_path):
    proc = trajflow_cli("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis",
                        "/etc/passwd:f", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "not a Python file" in one_line_error(proc)


CAMPAIGN_KEYS = st.sampled_from(["analysis", "repeats", "design", "name", "io", "mode", "blocks",
                                 "chunk", "concurrent", "walltime", "cpus", "ranks", "remote"])
TOML_VALUES = st.recursive(st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=8)


def _toml(value):
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(value), repr(value))
    return json.dumps(value)


def _base_campaign():
    return {"campaign": {"analysis": "rmsd"},
            "input": {"topology": sys.executable, "trajectory": [sys.executable]},
            'resources."local.localhost"': {"cpus": 2, "walltime": 10},
            "factors": {"ranks": [1, 2]}}


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["campaign", "factors", 'resources."local.localhost"']),
                       st.dictionaries(CAMPAIGN_KEYS, TOML_VALUES, max_size=3), max_size=2)
       | st.binary(max_size=200))
def test_any_campaign_file_is_refused_in_one_line_or_read(tmp_path_factory, content):
    """A valid campaign file with arbitrary values put into its tables (or arbitrary
    bytes): InputError with one line, or a campaign; never a traceback, nothing written."""
    from trajflow.workflows.campaign.spec import load_campaign
    folder = tmp_path_factory.mktemp("campaign")
    path = folder / "c.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        tables = _base_campaign()
        for table, keys in content.items():
            tables[table].update(keys)
        path.write_text("\n".join(f"[{table}]\n" + "".join(f"{k} = {_toml(v)}\n"
                                                          for k, v in keys.items())
                                  for table, keys in tables.items()))
    try:
        load_campaign(str(path))
    except InputError as exc:
        assert str(exc).strip() and "Traceback" not in str(exc)
    assert os.listdir(folder) == ["c.toml"]
