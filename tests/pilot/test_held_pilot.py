"""A held pilot (`trajflow pilot start`) serving runs from the command line, the API,
MDAnalysis' run(backend=...) and several clients at once, against MDAnalysis;
refusing what it cannot take in a second; ending at stop, at its idle time, or
with its holder's death, leaving nothing running.

One held pilot carries the module's runs (one pilot start); the lifetime tests
start short-lived ones of their own.
"""
import json
import os
import signal
import subprocess
import time
import warnings

import h5py
import numpy as np
import pytest

import trajflow
from processes import assert_nothing_left, processes_mentioning, START_LIMIT, TRAJFLOW


def _trajflow(args, env, cwd, timeout=300, check=None):
    done = subprocess.run([TRAJFLOW] + args, env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    if check is not None:
        assert done.returncode == check, done.stdout + done.stderr
    return done


def _status(name, env, cwd):
    out = _trajflow(["pilot", "status", name], env, cwd, check=0).stdout
    return out


def _holder_pid(pilots, name):
    with open(os.path.join(pilots, name, "holder.json")) as fh:
        return json.load(fh)["pid"]


def _session(pilots, name):
    with open(os.path.join(pilots, name, "holder.json")) as fh:
        return os.path.basename(json.load(fh)["session_dir"])


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A held pilot 'mod' in a private pilots folder of this module's; stopped at the end,
    nothing of it left running."""
    path = tmp_path_factory.mktemp("held")
    pilots = str(path / "pilots")
    env = {**os.environ, "TRAJFLOW_PILOTS": pilots}
    saved = os.environ.get("TRAJFLOW_PILOTS")
    os.environ["TRAJFLOW_PILOTS"] = pilots  # the API's attach finds it too
    # a start that hangs (an agent's, seen in CI with pilots starting side by side) is
    # replaced at the start bound
    start = _trajflow(["pilot", "start", "--name", "mod", "--cpus", "2", "--walltime", "20",
                       "--idle-timeout", "20", "--limits", START_LIMIT], env, str(path),
                      timeout=400)
    assert start.returncode == 0, start.stdout + start.stderr
    assert "pilot mod held" in start.stderr
    session = _session(pilots, "mod")
    holder = _holder_pid(pilots, "mod")
    # the holder's report drawer runs beside it, below the tasks' priority
    [drawer] = processes_mentioning("report_drawer", os.path.join(pilots, "mod"))
    assert os.getpriority(os.PRIO_PROCESS, drawer) == min(19, os.getpriority(os.PRIO_PROCESS, 0)
                                                          + 10)
    try:
        yield {"env": env, "path": path, "pilots": pilots, "session": session}
    finally:
        stopped = _trajflow(["pilot", "stop", "mod"], env, str(path), timeout=200)
        if saved is None:
            os.environ.pop("TRAJFLOW_PILOTS", None)
        else:
            os.environ["TRAJFLOW_PILOTS"] = saved
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not os.path.exists(os.path.join(pilots, "mod"))
    assert holder not in processes_mentioning("held_holder")
    # nor its report drawer (which names the holder's folder)
    assert processes_mentioning(os.path.join(pilots, "mod")) == []
    assert_nothing_left(session)


def test_cli_run_on_a_held_pilot_is_mdanalysis_and_starts_no_pilot(held, adk,
                                                                   reference_results):
    out = held["path"] / "cli"
    t0 = time.time()
    # planned by the holder: this client never imports MDAnalysis (Python lists each import)
    run = _trajflow(["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                     "--pilot", "mod", "--out", str(out)],
                    {**held["env"], "PYTHONPROFILEIMPORTTIME": "1"}, str(held["path"]), check=0)
    wall = time.time() - t0
    imported = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
    assert any("trajflow.workflows.run.held_client" in line for line in imported)
    assert "MDAnalysis" not in [line.split("|")[-1].strip() for line in imported]
    run.stderr = "\n".join(line for line in run.stderr.splitlines()
                            if not line.startswith("import time:"))
    with h5py.File(out / "result.h5", "r") as f:
        np.testing.assert_allclose(f["rmsd"][:], reference_results(adk[0], [adk[1]], "rmsd")
                                   ["rmsd"], rtol=1e-5, atol=1e-4)
    assert "sent to held pilot mod" in run.stderr
    # named by the summary, drawn by the holder's report drawer after the result (the
    # client does not wait for it): there within seconds
    assert f"{out / 'report.html'} (the held pilot draws it after the result)" in run.stdout
    deadline = time.time() + 60
    while not (out / "report.html").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert "trajflow run" in (out / "report.html").read_text()
    # its tasks ran in the held pilot's session: no session, no pilot start of its own
    assert not list(out.glob("re.session.*"))
    with open(out / "radical_session") as fh:
        assert held["session"] in fh.read()
    assert "pilot requested" not in run.stderr
    assert wall < 60, wall  # a bound that only a pilot start of its own would break
    status = _status("mod", held["env"], str(held["path"]))
    assert "mod: active on local.localhost, 0 of 2 cores busy, 0 run(s) running" in status


def test_api_attach_backend_and_run_by_name(held, adk, solvated, reference_results):
    import MDAnalysis as mda
    from MDAnalysis.analysis.rms import RMSD
    path = held["path"]
    with trajflow.Pilot.attach("mod", progress=False) as pilot:
        assert pilot.cpus == 2 and pilot.resource == "local.localhost"
        futures = [pilot.submit(adk[0], adk[1], "rmsd", out=str(path / f"api{i}"))
                   for i in range(2)]
        dih = pilot.submit(adk[0], adk[1], "dihedrals", mode="tasks", blocks=3,
                           out=str(path / "dih"))
        # a file nobody here wrote: periodic, solvated, the protein broken across the box
        periodic = pilot.submit(*solvated, "rmsd", io="h5md", out=str(path / "periodic"))
        runs = [f.result(timeout=300) for f in futures]
        dihedrals = dih.result(timeout=300)
        np.testing.assert_allclose(periodic.result(timeout=300).results.rmsd,
                                   reference_results(solvated[0], [solvated[1]], "rmsd")["rmsd"],
                                   rtol=1e-5, atol=1e-4)
    ref = reference_results(adk[0], [adk[1]], "rmsd")
    for run in runs:
        np.testing.assert_allclose(run.results.rmsd, ref["rmsd"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(dihedrals.results.features,
                               reference_results(adk[0], [adk[1]], "dihedrals")["features"],
                               atol=1e-3)
    by_name = trajflow.run(adk[0], adk[1], "rmsd", pilot="mod", progress=False,
                           out=str(path / "by_name"))
    np.testing.assert_allclose(by_name.results.rmsd, ref["rmsd"], rtol=1e-5, atol=1e-4)
    u = mda.Universe(*adk)
    backend = trajflow.Backend(pilot="mod", out=str(path), progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = RMSD(u, select="name CA").run(backend=backend, n_workers=2,
                                             unsupported_backend=True)
        serial = RMSD(u, select="name CA").run()
    np.testing.assert_allclose(ours.results.rmsd, serial.results.rmsd, rtol=1e-6)
    assert backend.last_run.ok and not list(path.glob("RMSD*/re.session.*"))


def test_several_clients_at_once(held, adk, reference_results):
    path = held["path"]
    procs = [subprocess.Popen([TRAJFLOW, "run", "--topology", adk[0], "--trajectory", adk[1],
                               "--analysis", "rmsd", "--pilot", "mod", "--quiet",
                               "--out", str(path / f"many{i}")], env=held["env"],
                              cwd=str(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(4)]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in procs]
    finally:  # none left running if one hangs
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * 4, outputs
    ref = reference_results(adk[0], [adk[1]], "rmsd")["rmsd"]
    for i in range(4):
        with h5py.File(path / f"many{i}" / "result.h5", "r") as f:
            np.testing.assert_allclose(f["rmsd"][:], ref, rtol=1e-5, atol=1e-4)


def test_a_run_sent_while_another_runs_joins_it_at_once(held, adk, reference_results):
    """No run waits for another's batch to end (one live EnTK workflow): a one-rank run
    sent while a one-rank run of 20 s is on the pilot ends first, and both are right."""
    path = held["path"]
    ref = reference_results(adk[0], [adk[1]], "rmsd")["rmsd"]
    with trajflow.Pilot.attach("mod", progress=False) as pilot:
        slow = pilot.submit(adk[0], adk[1], "rmsd", blocks=1, out=str(path / "slow"),
                            env={"TRAJFLOW_TEST_DELAY": "0:compute:20"})
        deadline = time.time() + 120
        while not (path / "slow" / "progress").is_dir() or not any(
                (path / "slow" / "progress").iterdir()):  # its analyze has begun
            assert time.time() < deadline and not slow.done(), "the slow run never began"
            time.sleep(0.2)
        quick = pilot.submit(adk[0], adk[1], "rmsd", blocks=1, out=str(path / "quick"))
        np.testing.assert_allclose(quick.result(timeout=120).results.rmsd, ref,
                                   rtol=1e-5, atol=1e-4)
        assert not slow.done(), "the second run waited for the first to end"
        np.testing.assert_allclose(slow.result(timeout=120).results.rmsd, ref,
                                   rtol=1e-5, atol=1e-4)


def test_what_a_held_pilot_cannot_take_is_refused_in_a_second(held, adk):
    env, cwd = held["env"], str(held["path"])
    base = ["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd"]
    t0 = time.time()
    missing = _trajflow(base + ["--pilot", "nope", "--out", "x1"], env, cwd, check=2)
    assert "no pilot named 'nope' is held" in missing.stderr
    assert "trajflow pilot list" in missing.stderr
    options = _trajflow(base + ["--pilot", "mod", "--cpus", "4", "--out", "x2"], env, cwd,
                        check=2)
    assert "--cpus: options of a pilot" in options.stderr
    # bad input, found by the holder's planning, in the words and flags of a client's own
    nothing = _trajflow(base + ["--pilot", "mod", "--select", "resname NOPE", "--out", "x3"],
                        env, cwd, check=2)
    assert "selection 'resname NOPE' matches 0 atom(s)" in nothing.stderr
    wide = _trajflow(base + ["--pilot", "mod", "--blocks", "3", "--out", "x4"], env, cwd, check=2)
    assert "--mode mpi runs one rank per block: 3 ranks do not fit in --cpus 2" in wide.stderr
    again = _trajflow(["pilot", "start", "--name", "mod"], env, cwd, check=2)
    assert "a pilot named 'mod' is held already" in again.stderr
    bad = _trajflow(["pilot", "start", "--name", "../up"], env, cwd, check=2)
    assert "pilot name '../up'" in bad.stderr
    assert time.time() - t0 < 60  # seven refusals, each a Python start and no pilot (one
    # pilot start alone takes 10-20 s here; 46 s seen for the seven with 3 test workers)
    assert not [x for x in ("x1", "x2", "x3", "x4") if os.path.exists(os.path.join(cwd, x))]
    # a folder open to others is refused, not used
    os.chmod(held["pilots"], 0o755)
    try:
        opened = _trajflow(["pilot", "list"], env, cwd, check=2)
        assert "open to others" in opened.stderr and "chmod 700" in opened.stderr
    finally:
        os.chmod(held["pilots"], 0o700)


HELD_CAMPAIGN = """
[campaign]
name = "held"
analysis = "rmsd"

[input]
dataset = "adk"
copies = 2

[resources."local.localhost"]
pilot = "mod"

[factors]
ranks = [1, 2]
io = ["shared", "h5md"]
"""


def test_a_campaign_runs_on_the_held_pilot_it_names(held, reference_results):
    import csv
    path = held["path"]
    (path / "held.toml").write_text(HELD_CAMPAIGN)
    dry = _trajflow(["campaign", "held.toml", "--out", "camp", "--dry-run"], held["env"],
                    str(path), check=0)
    assert "the held pilot mod (no pilot start)" in dry.stdout
    done = _trajflow(["campaign", "held.toml", "--out", "camp"], held["env"], str(path),
                     check=0)
    with open(path / "camp" / "campaign.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and all(row["status"] == "done" for row in rows), done.stdout
    assert not (path / "camp" / "sessions").exists() or not list(
        (path / "camp" / "sessions").rglob("re.session.*"))  # no pilot of its own
    from trajflow.workflows.datasets import adk_concatenated
    top, dcd = adk_concatenated(2, "DCD")
    ref = reference_results(top, [dcd], "rmsd")["rmsd"]
    for result in (path / "camp" / "runs").rglob("result.h5"):
        with h5py.File(result, "r") as f:
            np.testing.assert_allclose(f["rmsd"][:], ref, rtol=1e-5, atol=1e-4)
    # a held pilot too small for the largest experiment is refused before anything runs
    (path / "big.toml").write_text(HELD_CAMPAIGN.replace("ranks = [1, 2]", "ranks = [1, 4]"))
    big = _trajflow(["campaign", "big.toml", "--out", "big"], held["env"], str(path), check=2)
    assert "that pilot has 2 cores and the largest experiment needs 4" in big.stderr
    assert not (path / "big").exists()
    # and one that names the pilot's options beside it
    (path / "opt.toml").write_text(HELD_CAMPAIGN.replace('pilot = "mod"',
                                                         'pilot = "mod"\nwalltime = 5'))
    opt = _trajflow(["campaign", "opt.toml", "--out", "opt"], held["env"], str(path), check=2)
    assert 'walltime beside pilot = "mod"' in opt.stderr


def test_a_clients_ctrl_c_stops_its_run_only_and_resume_finishes_it(held, adk,
                                                                    reference_results):
    """A run whose client is interrupted is stopped in the pilot (its running ranks
    cancelled), not run to its end; a run beside it goes on; the pilot serves the
    next run, and `--resume` on the held pilot finishes the stopped one."""
    path = held["path"]
    ref = reference_results(adk[0], [adk[1]], "rmsd")["rmsd"]
    # on both ranks: with a dynamic schedule the rank that starts first may claim every
    # chunk, and the other computes nothing (seen: rank 1 analysed all 98 frames)
    env = {**held["env"], "TRAJFLOW_TEST_DELAY": "0:compute:60,1:compute:60"}
    with trajflow.Pilot.attach("mod", progress=False) as pilot:
        beside = pilot.submit(adk[0], adk[1], "rmsd", blocks=1, out=str(path / "beside"),
                              env={"TRAJFLOW_TEST_DELAY": "0:compute:8"})
        client = subprocess.Popen([TRAJFLOW, "run", "--topology", adk[0], "--trajectory",
                                   adk[1], "--analysis", "rmsd", "--blocks", "1", "--pilot",
                                   "mod", "--out", str(path / "ctrlc")], env=env,
                                  cwd=str(path), start_new_session=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = path / "ctrlc" / "progress" / "started.analyze"
        deadline = time.time() + 120
        while not started.exists():  # its rank runs (and sleeps its 60 s) now
            assert time.time() < deadline and client.poll() is None, "the run never began"
            time.sleep(0.2)
        # its folder is locked while its run goes on: a resume beside it would remove the
        # files its tasks are writing
        refused = _trajflow(["run", "--resume", str(path / "ctrlc")], held["env"], str(path),
                            check=2)
        assert "is in use by another trajflow run" in refused.stderr
        os.killpg(client.pid, signal.SIGINT)
        out = client.communicate(timeout=120)[0]
        assert client.returncode == 130, out
        assert "1 run(s) sent to the held pilot mod: cancelled there" in out
        outcome = path / "ctrlc" / "outcome.json"
        deadline = time.time() + 120
        said = {}
        while said.get("status") != "failed" or said.get("provisional"):  # (its hand-over's)
            assert time.time() < deadline, f"the held pilot did not stop the run: {said}"
            time.sleep(0.5)
            said = json.loads(outcome.read_text()) if outcome.exists() else {}
        assert "cancelled: its client left" in said["error"] and said["stopped_at"] == "analyze"
        assert not (path / "ctrlc" / "result.h5").exists()
        np.testing.assert_allclose(beside.result(timeout=120).results.rmsd, ref,
                                   rtol=1e-5, atol=1e-4)  # the run beside it went on
    _trajflow(["run", "--resume", str(path / "ctrlc"), "--pilot", "mod", "--quiet"],
              held["env"], str(path), check=0)
    with h5py.File(path / "ctrlc" / "result.h5", "r") as f:
        np.testing.assert_allclose(f["rmsd"][:], ref, rtol=1e-5, atol=1e-4)


def test_a_held_pilot_ends_when_idle_and_when_its_holder_dies(tmp_path, adk):
    pilots = str(tmp_path / "p")
    env = {**os.environ, "TRAJFLOW_PILOTS": pilots}
    cwd = str(tmp_path)
    _trajflow(["pilot", "start", "--name", "idle", "--cpus", "1", "--idle-timeout", "0.25",
               "--walltime", "10", "--limits", START_LIMIT], env, cwd, timeout=400, check=0)
    session = _session(pilots, "idle")
    deadline = time.time() + 180
    while time.time() < deadline and os.path.exists(os.path.join(pilots, "idle")):
        time.sleep(1)
    assert not os.path.exists(os.path.join(pilots, "idle")), "it never ended when idle"
    assert_nothing_left(session)
    # its holder too: it removes its folder last, then its Python exits (not at once: CI
    # once saw it still there the moment the folder went), as `pilot stop` waits for it
    holder = os.path.join(pilots, "idle")
    deadline = time.time() + 30
    while time.time() < deadline and processes_mentioning(holder):
        time.sleep(0.5)
    assert processes_mentioning(holder) == [], "the idle pilot's holder did not end"
    # its holder killed: the pilot's guard ends the pilot; the next command cleans up
    _trajflow(["pilot", "start", "--name", "dies", "--cpus", "1", "--client-timeout", "10",
               "--walltime", "10", "--limits", START_LIMIT], env, cwd, timeout=400, check=0)
    session = _session(pilots, "dies")
    os.kill(_holder_pid(pilots, "dies"), signal.SIGKILL)
    refused = _trajflow(["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis",
                         "rmsd", "--pilot", "dies"], env, cwd, check=2)
    assert "the held pilot 'dies' has ended" in refused.stderr
    assert not os.path.exists(os.path.join(pilots, "dies"))
    listed = _trajflow(["pilot", "list"], env, cwd, check=0)
    assert "no held pilot" in listed.stdout
    # the process that held the pilot for the killed holder ends by the pilot's guard too
    # (--client-timeout 10 s, then the pilot cancelled in order), with RADICAL's own
    holders = os.path.join(pilots, "dies")
    deadline = time.time() + 180
    while time.time() < deadline and (processes_mentioning(session)
                                      or processes_mentioning(holders)):
        time.sleep(2)
    assert processes_mentioning(holders) == [], "the killed holder's pilot process lived on"
    assert_nothing_left(session)
