"""Processes of a test's trajflow runs: start one with sleeping tasks, find what runs, stop it."""
import glob
import os
import select
import shutil
import signal
import subprocess
import sys
import time

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")


def processes_mentioning(*texts):
    """pids whose command line contains every one of `texts` (from /proc, no extra
    dependency). Each command line is read once: a process that ends while it is
    looked at is simply not found (reading its /proc entry twice raced, in CI)."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as fh:
                line = fh.read()
        except OSError:
            continue
        if all(text.encode() in line for text in texts):
            found.append(int(cmdline.split("/")[2]))
    return [p for p in found if p != os.getpid()]


START_LIMIT = "start=90"  # a pilot whose start hangs is replaced before wait_for_analyze gives up


def start_with_sleeping_tasks(args, delay="0:compute:300,1:compute:300"):
    """`trajflow ARGS` in a session of its own (as a terminal would run it), its
    blocks 0 and 1 sleeping 300 s in compute, so that there is time to press Ctrl-C.
    A `run` without --limits gets START_LIMIT: RADICAL's agent hung in its start once
    with 3 pilots starting side by side (seen), which the run survives by starting
    another pilot at the start bound (300 s by default, past wait_for_analyze's patience)."""
    if args[:1] == ["run"] and "--limits" not in args and "--resume" not in args:
        args = [*args, "--limits", START_LIMIT]
    env = {**os.environ, "TRAJFLOW_TEST_DELAY": delay}
    return subprocess.Popen([TRAJFLOW] + args, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def analyze_tasks(marker=""):
    """pids of analyze tasks (of the run whose folder is `marker`, if given)."""
    return processes_mentioning("trajflow.tasks.analyze", marker)


def wait_for_analyze(proc, patience_s=240, marker=""):
    deadline = time.time() + patience_s
    while time.time() < deadline and not analyze_tasks(marker):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(1)
    assert analyze_tasks(marker), "the analyze tasks never started"


def stop(proc):
    """If a check failed mid-run: Ctrl-C first, so the pilot is cancelled in order
    (a SIGKILL would orphan it), then SIGKILL whatever is left of the group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def output_so_far(proc, quiet_s=2.0):
    """What the run has written, without waiting for the end of its output: a process
    it left behind may hold the pipe open."""
    fd, chunks = proc.stdout.fileno(), []
    while select.select([fd], [], [], quiet_s)[0]:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode(errors="replace")


def session_name(folder):
    """The RADICAL session a run in `folder` started (re.session.*)."""
    return os.path.basename(glob.glob(os.path.join(str(folder), "re.session.*"))[0])


def analyzing(proc, out):
    """Wait until the analyze tasks of the run in `out` run; its RADICAL session's name."""
    wait_for_analyze(proc, marker=str(out))
    return session_name(out)


def signal_run(proc, ready, sig=signal.SIGINT, whole_group=True, timeout=180):
    """Once `ready()` has returned, send `sig` to the run - its whole group, as Ctrl-C in a
    terminal does, or the client alone, as `kill PID` does - and wait for its end.
    Returns (exit code, output, what ready() returned); a failed check stops the run."""
    try:
        got = ready()
        (os.killpg if whole_group else os.kill)(proc.pid, sig)
        return proc.wait(timeout=timeout), proc.stdout.read(), got
    except BaseException:
        stop(proc)
        print("the run's output:\n" + output_so_far(proc))  # shown with the failure
        raise
    finally:
        stop(proc)


def tasks_of_session(session):
    """pids of the task processes RADICAL started for `session` (re.session.*), known by
    the environment RP gives every task (the teardown's own test): each test judges its
    own pilot's tasks only, so that the pilot layer's tests can run side by side."""
    from trajflow.workflows.run.entk_client import is_task_of_session
    from trajflow.tasks.procfs import processes
    return [p.pid for p in processes() if p.state != "Z" and is_task_of_session(p.pid, session)]


def assert_nothing_left(session):
    """No task and no process of the pilot's session runs a few seconds later."""
    time.sleep(3)
    assert tasks_of_session(session) == [], _described(tasks_of_session(session))
    left = processes_mentioning(session)
    assert left == [], _described(left)


def _described(pids):
    """Each pid's command line, for a failure's message."""
    from trajflow.tasks.procfs import process
    return [(pid, getattr(process(pid), "title", None)) for pid in pids]


def assert_resumed_equal(out, adk, reference, resume=True, pilot=None):
    """`trajflow run --resume OUT` (if `resume`; on the held pilot `pilot`, as
    shared_pilot gives it, if given) succeeds and OUT's RMSD is MDAnalysis'."""
    import h5py
    import numpy as np
    if resume:
        where = ["--pilot", pilot["name"]] if pilot else []
        again = subprocess.run([TRAJFLOW, "run", "--resume", str(out), *where], capture_output=True,
                               text=True, timeout=600, env=pilot["env"] if pilot else None)
        assert again.returncode == 0, again.stdout + again.stderr
    with h5py.File(os.path.join(str(out), "result.h5"), "r") as f:
        np.testing.assert_allclose(f["rmsd"][:], reference(adk[0], [adk[1]], "rmsd")["rmsd"],
                                   rtol=1e-5, atol=1e-4)


# --- one held pilot for the whole layer ------------------------------------------------

SHARED_PILOTS_ENV = "TRAJFLOW_TEST_SHARED_PILOTS"  # its folder: made by the controller, inherited
SHARED_PILOT = "shared"


def shared_pilot_folder():
    """The held pilots' folder of this pytest run (tests/conftest.py's pytest_configure
    makes it; xdist's workers inherit it from the controller's environment)."""
    return os.path.join(os.environ[SHARED_PILOTS_ENV], "pilots")


def _pilot_command(args, timeout):
    """`trajflow pilot ARGS` in the layer's folder (the held pilot's session goes there)."""
    folder = os.environ[SHARED_PILOTS_ENV]
    return subprocess.run([TRAJFLOW, "pilot", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=folder, env={**os.environ, "TRAJFLOW_PILOTS": shared_pilot_folder()})


def hold_shared_pilot():
    """The layer's held pilot, started by the first test of any worker that asks for it
    (a lock keeps the others waiting). It ends itself after 10 idle minutes, or 120 of
    walltime, should pytest be killed before stop_shared_pilot."""
    import fcntl
    with open(os.path.join(os.environ[SHARED_PILOTS_ENV], "lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _pilot_command(["status", SHARED_PILOT], 60).returncode != 0:
            try:
                started = _pilot_command(["start", "--name", SHARED_PILOT, "--cpus", "2", "--walltime",
                                          "120", "--idle-timeout", "10", "--limits", START_LIMIT], 400)
            except subprocess.TimeoutExpired:
                _pilot_command(["stop", SHARED_PILOT], 200)  # a start still going on is ended
                raise
            assert started.returncode == 0, started.stdout + started.stderr
    return {"name": SHARED_PILOT, "env": {**os.environ, "TRAJFLOW_PILOTS": shared_pilot_folder()}}


def stop_shared_pilot(folder):
    """At the pytest run's end (the controller's): stop the layer's held pilot if one
    was started, and remove `folder`, the one this run made."""
    import shutil
    try:
        if os.path.isdir(os.path.join(folder, "pilots", SHARED_PILOT)):
            stopped = _pilot_command(["stop", SHARED_PILOT], 200)
            if stopped.returncode != 0:
                print(f"the shared held pilot did not stop: {stopped.stdout}{stopped.stderr}")
    except subprocess.TimeoutExpired:
        print("the shared held pilot did not stop within 200 s (it ends at its idle time)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_local_sandboxes(folder):
    """Remove the local RADICAL sandboxes (~/radical.pilot.sandbox/<sid>, ~1 MB each) of the
    sessions whose folders lie in `folder`, and their tasks' ${TMPDIR:-/tmp}/<sid>: what
    a client killed or stopped on purpose, or one on a full disk, leaves (its guard ends
    the pilot and keeps the sandbox for a post-mortem)."""
    from trajflow.tasks.client_guard import remove_task_tmp
    sids = {name for _, folders, _ in os.walk(folder)
            for name in folders if name.startswith("re.session.")}
    for sid in sids:
        shutil.rmtree(session_sandbox(sid), ignore_errors=True)
        remove_task_tmp(sid)


def session_sandbox(sid):
    """A local pilot's session sandbox (resource_configs: $HOME)."""
    return os.path.expanduser(os.path.join("~", "radical.pilot.sandbox", sid))


def thread_wakes(thread, seconds):
    """How many times `thread` (a thread of this process) was switched to in `seconds`:
    a loop that polls wakes tens of times a second, one that waits for news not at all."""
    def switches():
        with open(f"/proc/self/task/{thread.native_id}/status") as fh:
            return sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)
    before = switches()
    time.sleep(seconds)
    return switches() - before
