"""A client that dies never leaves a pilot running (issue 15).

The guard's pieces are tested off the pilot on real processes (a fake
bootstrapper tree, a real heartbeat file, RADICAL's own double `eval`); the
whole path on real pilots: the client killed with SIGKILL (and the process
holding its RADICAL session with it) on local.localhost and on the local
SLURM, the client alone killed, and `--resume` cancelling the orphan of its run.
"""
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from processes import (processes_mentioning, start_with_sleeping_tasks, stop, tasks_of_session,
                       wait_for_analyze)

from trajflow.tasks import client_guard
from trajflow.workflows.run import heartbeat


# --- off the pilot -------------------------------------------------------------------
def test_the_guard_command_survives_radicals_double_eval(tmp_path):
    """RADICAL's bootstrapper runs `cmd=$(eval echo "$entry"); eval "$cmd"`: a session
    folder with spaces, quotes and `$` must arrive intact, and `$$` be its pid."""
    odd = str(tmp_path / "a b" / "it's $HOME")
    echo_args = tmp_path / "echo_args"  # stands in for the Python: prints its arguments
    echo_args.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    echo_args.chmod(0o755)
    entry = heartbeat.guard_bootstrap_command(str(echo_args), odd, 12.5)
    script = 'run() { cmd=$(eval echo "$@"); eval "$cmd"; }; run "$0"; echo "pid=$$"'
    out = subprocess.run(["bash", "-c", script, entry], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert lines[:6] == ["-m", "trajflow.tasks.client_guard", "--session-dir", odd, "--timeout",
                         "12.5"], lines
    assert lines[6] == "--bootstrap-pid" and f"pid={lines[7]}" == lines[-1]


def fake_pilot():
    """A 'bootstrapper' (sleep in a shell) with a 'task' in a session of its own under it."""
    return subprocess.Popen(["bash", "-c", "setsid sleep 300 & sleep 300; wait"],
                            start_new_session=True)


def guard_in_background(session, timeout_s, bootstrap_pid):
    return subprocess.Popen([sys.executable, "-m", "trajflow.tasks.client_guard", "--foreground",
                             "--session-dir", str(session), "--timeout", str(timeout_s),
                             "--bootstrap-pid", str(bootstrap_pid)])


def ended(session):
    return json.loads((session / client_guard.ENDED).read_text())


def test_the_guard_knows_its_bootstrapper_by_pid_and_start_time():
    """A pid reused by another process is not the bootstrapper: a guard that took it
    for one once ended someone else's MPI ranks (`exited 9` in the stage tests)."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        born = client_guard.start_time(proc.pid)
        assert born is not None and client_guard.alive(proc.pid, born)
        assert not client_guard.alive(proc.pid, str(int(born) - 1))  # same pid, another process
    finally:
        proc.kill()
        proc.wait()
    assert not client_guard.alive(proc.pid, born) and client_guard.start_time(proc.pid) is None


def test_a_stale_heartbeat_ends_the_pilot_tree_and_its_tasks(tmp_path):
    session = tmp_path / "re.session.x"
    (session / client_guard.CLIENT_CONFIGS).mkdir(parents=True)
    pilot = fake_pilot()
    time.sleep(0.5)
    tree = client_guard.process_tree(pilot.pid)
    assert len(tree) >= 3  # bash, its sleep, the setsid'd task
    (session / client_guard.HEARTBEAT).touch()
    t0 = time.time()
    guard = guard_in_background(session, 3, pilot.pid)
    try:
        assert guard.wait(timeout=30) == 0
    finally:
        pilot.kill()
    assert 3 <= time.time() - t0 < 15
    pilot.wait(timeout=5)
    assert not any(os.path.exists(f"/proc/{p}") and client_guard.alive(p) for p in tree)
    record = ended(session)
    assert record["fired"] and "heartbeat" in record["reason"], record
    assert not (session / client_guard.CLIENT_CONFIGS).exists()


@contextlib.contextmanager
def beating_client_and_guarded_pilot(session, timeout_s):
    """A live client's heartbeat, a fake pilot tree and its guard; (pilot, tree, guard)."""
    session.mkdir()
    beat = heartbeat.Heartbeat(str(session), os.getppid(), lambda: None, period_s=0.5).start()
    pilot = fake_pilot()
    tree = (time.sleep(0.5), client_guard.process_tree(pilot.pid))[1]
    guard = guard_in_background(session, timeout_s, pilot.pid)
    try:
        yield pilot, tree, guard
    finally:
        beat.stop()
        stop_group(pilot, tree)


def test_a_fresh_heartbeat_keeps_the_pilot_and_its_end_is_recorded(tmp_path):
    session = tmp_path / "s"
    with beating_client_and_guarded_pilot(session, 2) as (pilot, _, guard):
        time.sleep(5)  # 2.5 timeouts: the heartbeat keeps it
        assert pilot.poll() is None and guard.poll() is None
        os.killpg(pilot.pid, signal.SIGTERM)  # the pilot ends as cancelled
        assert guard.wait(timeout=10) == 0
    assert ended(session) == {**ended(session), "fired": False, "reason": "the pilot ended"}


def test_a_pilot_still_running_after_its_client_cancelled_it_is_ended(tmp_path):
    """A pilot cancelled before its agent was up never hears RADICAL's cancel (and a
    daemonised agent outlives a scancel without cgroups, seen on the local SLURM):
    once the client's closed file is CLOSED_GRACE_S old, the guard ends it."""
    session = tmp_path / "s"
    with beating_client_and_guarded_pilot(session, 60) as (pilot, tree, guard):
        time.sleep(2)
        closed = session / client_guard.CLOSED
        closed.write_text("the client cancelled its pilot (interrupted)\n")
        time.sleep(2)
        assert pilot.poll() is None and guard.poll() is None  # a fresh closed file: not yet
        old = time.time() - client_guard.CLOSED_GRACE_S - 1
        os.utime(closed, (old, old))
        assert guard.wait(timeout=30) == 0
        left = [p for p in tree if os.path.exists(f"/proc/{p}") and client_guard.alive(p)]
    assert not left, left
    record = ended(session)
    assert record["fired"] and "client cancelled this pilot" in record["reason"], record


def stop_group(proc, tree=()):
    """End the fake pilot's group and what of its `tree` is left (its setsid'd task)."""
    for pid in tree:
        if client_guard.alive(pid):
            os.kill(pid, signal.SIGKILL)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def test_cancel_orphans_asks_only_live_guards_and_waits_for_them(tmp_path):
    rundir = tmp_path / "run"
    live, done = rundir / "re.session.live", rundir / "re.session.done"
    live.mkdir(parents=True)
    done.mkdir()
    (live / client_guard.HEARTBEAT).touch()
    (done / client_guard.STARTED).write_text("{}")
    (done / heartbeat.CLOSED).write_text("closed")
    pilot = fake_pilot()
    guard = guard_in_background(live, 300, pilot.pid)
    try:
        deadline = time.time() + 10
        while not (live / client_guard.STARTED).exists() and time.time() < deadline:
            time.sleep(0.1)
        said = []
        assert heartbeat.cancel_orphans(str(rundir), said.append) == [str(live)]
        assert guard.wait(timeout=10) == 0
    finally:
        stop_group(pilot)
    assert ended(live)["fired"] and "--resume" in ended(live)["reason"]
    assert "still running without its client" in said[0] and "pilot ended" in said[1], said
    assert not (done / client_guard.CANCEL).exists()
    assert heartbeat.cancel_orphans(str(rundir), said.append) == []


# --- on real pilots --------------------------------------------------------------------
def client_pids(proc):
    """The `trajflow run` process and the process holding its RADICAL session."""
    return [proc.pid] + [p for p in processes_mentioning("trajflow\x00run\x00")
                         if p != proc.pid and _parent(p) == proc.pid]


def every_client_process(proc):
    """Every process of the client (forks of `trajflow run`: the command, the process
    holding the session, its reaper, RADICAL's session proxy), as `kill -9` of all of
    them would end; not the pilot's."""
    return [p for p in processes_mentioning("trajflow\x00run\x00") if _descends(p, proc.pid)]


def _descends(pid, ancestor):
    while pid and pid > 1:
        if pid == ancestor:
            return True
        pid = _parent(pid)
    return False


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def wait_until_gone(marker, patience_s, session=None):
    """Seconds until no process mentions `marker` and no task of `session` (if given) runs."""
    t0 = time.time()
    while time.time() - t0 < patience_s:
        if not processes_mentioning(marker) and not (session and tasks_of_session(session)):
            return time.time() - t0
        time.sleep(0.5)
    pytest.fail(f"still running {patience_s} s after the client died: "
                f"{processes_mentioning(marker)}")


def run_args(adk, out, *extra):
    return ["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
            "--mode", "tasks", "--blocks", "2", "--cpus", "2", "--walltime", "15",
            "--out", str(out), *extra]


def killed_mid_analyze(args, pids=client_pids, killed=None):
    """Start a run whose tasks sleep, SIGKILL `pids(proc)` once they run (added to `killed`,
    if given); the session folder."""
    args = [str(a) for a in args]
    proc = start_with_sleeping_tasks(args)
    try:
        out = args[args.index("--out") + 1]
        wait_for_analyze(proc, marker=out)
        session = glob.glob(os.path.join(out, "re.session.*"))[0]
        for pid in pids(proc):
            os.kill(pid, signal.SIGKILL)
            if killed is not None:
                killed.append(pid)
        proc.wait(timeout=10)
    finally:
        stop(proc)
    return session


def resume(out):
    return subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "run", "--resume",
                           str(out)], capture_output=True, text=True)


def assert_rmsd_is_mdanalysis(out, adk, reference_results):
    with h5py.File(out / "result.h5", "r") as f:
        np.testing.assert_allclose(f["rmsd"][:], reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                                   rtol=1e-5, atol=1e-4)


@pytest.mark.entk
def test_a_killed_client_leaves_no_pilot_running_and_resume_completes(tmp_path, adk,
                                                                      reference_results):
    out = tmp_path / "killed"
    killed = []
    session = killed_mid_analyze(run_args(adk, out, "--client-timeout", "10"),
                                 pids=every_client_process, killed=killed)
    gone_after = wait_until_gone(os.path.basename(session), 60, os.path.basename(session))
    # 10 s timeout + a 1 s poll + 5 s between SIGTERM and SIGKILL + the scan
    assert gone_after < 30, gone_after
    wait_until_gone(str(out), patience_s=10)
    assert "heartbeat" in json.load(open(os.path.join(session, client_guard.ENDED)))["reason"]
    assert not os.path.exists(os.path.join(session, client_guard.CLIENT_CONFIGS))
    again = resume(out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "without its client" not in again.stderr  # the guard had ended it already
    assert_rmsd_is_mdanalysis(out, adk, reference_results)
    # the killed client's private RADICAL configs were removed by the next trajflow
    leaked = [d for d in glob.glob("/tmp/trajflow-radical-config-*")
              if d.split("-")[3].isdigit() and int(d.split("-")[3]) in killed
              and not os.path.exists(f"/proc/{d.split('-')[3]}")]  # (unless its pid is reused)
    assert leaked == []


@pytest.mark.entk
def test_resume_cancels_the_orphaned_pilot_of_its_run_first(tmp_path, adk, reference_results):
    out = tmp_path / "orphan"
    session = killed_mid_analyze(run_args(adk, out), pids=every_client_process)  # timeout 300 s
    assert processes_mentioning(os.path.basename(session)), "the orphan should still run"
    again = resume(out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"session {session}); cancelling it" in again.stderr, again.stderr
    assert "--resume" in json.load(open(os.path.join(session, client_guard.ENDED)))["reason"]
    assert processes_mentioning(os.path.basename(session)) == []
    assert_rmsd_is_mdanalysis(out, adk, reference_results)


@pytest.mark.entk
def test_a_killed_client_alone_has_its_pilot_cancelled_in_order(tmp_path, adk):
    out = tmp_path / "parent"
    session = killed_mid_analyze(run_args(adk, out), pids=lambda proc: [proc.pid])
    assert wait_until_gone(os.path.basename(session), 60, os.path.basename(session)) < 40
    wait_until_gone(str(out), patience_s=15)
    outcome = json.load(open(out / "outcome.json"))
    assert outcome["status"] == "failed", outcome
    assert "the end of the trajflow process that started it" in outcome["error"], outcome
    deadline = time.time() + 30  # written once the child's shutdown is through
    while not os.path.exists(os.path.join(session, heartbeat.CLOSED)) and time.time() < deadline:
        time.sleep(0.5)
    assert os.path.exists(os.path.join(session, heartbeat.CLOSED))


@pytest.mark.entk
def test_a_killed_client_on_slurm_has_its_batch_job_cancelled(tmp_path, adk, slurm):
    out = tmp_path / "slurm"
    session = killed_mid_analyze(run_args(adk, out, "--resource", "local.slurm",
                                          "--client-timeout", "10"))
    job = json.load(open(os.path.join(session, client_guard.STARTED)))["job"]
    assert job, "the guard should run inside the SLURM job"
    t0 = time.time()
    while time.time() - t0 < 90 and subprocess.run(
            ["squeue", "-h", "-j", str(job)], capture_output=True, text=True).stdout.strip():
        time.sleep(1)
    assert subprocess.run(["squeue", "-h", "-j", str(job)], capture_output=True,
                          text=True).stdout.strip() == "", f"job {job} still queued/running"
    assert time.time() - t0 < 45
    wait_until_gone(os.path.basename(session), 30, os.path.basename(session))
    wait_until_gone(str(out), patience_s=15)  # the client's own leftovers: its reaper ended them
    assert json.load(open(os.path.join(session, client_guard.ENDED)))["job_cancelled"] == \
        f"scancel {job}"
