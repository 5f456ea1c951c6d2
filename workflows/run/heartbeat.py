"""The client's side of the pilot guard (tasks/client_guard.py).

A pilot must not outlive the trajflow process that asked for it: RADICAL-
Pilot 1.103 no longer notices a dead client. Three pieces live here:

  guard_bootstrap_command  the `pre_bootstrap_0` entry that starts the guard
                           beside the agent, watching this session's heartbeat
  Heartbeat                the thread, in the process holding the RADICAL
                           session, that touches the heartbeat while the
                           trajflow process that started it lives; when that
                           process is gone it stops the pilot in order itself
  cancel_orphans           what `--resume` does first: ask the guard of an
                           earlier session of the same run, still running
                           without its client, to end its pilot now
"""
import glob
import json
import os
import stat
import shlex
import threading
import time

from trajflow.tasks.client_guard import CANCEL, CLOSED, ENDED, HEARTBEAT, STARTED
from trajflow.tasks.rundir import open_in_run, owned_by_user, read_lines, SESSIONS
from trajflow.workflows.run.resources import pre_bootstrap_entry

DEFAULT_CLIENT_TIMEOUT_S = 300


def guard_bootstrap_command(python, session_dir, timeout_s):
    """A `pre_bootstrap_0` entry starting the guard of `session_dir`, which watches
    the bootstrapper's pid (`$$`, expanded by the bootstrapper's shell). A guard
    that cannot start is reported in the bootstrapper's log and never fails the
    pilot."""
    return pre_bootstrap_entry(
        shlex.join([python, "-m", "trajflow.tasks.client_guard", "--session-dir", session_dir,
                    "--timeout", f"{timeout_s:g}"])
        + " --bootstrap-pid $$ || echo 'trajflow: the client guard did not start'")


class Heartbeat:
    """Touch SESSION_DIR/trajflow.heartbeat every `period_s` while process
    `client_pid` lives; once it is gone, call `on_client_gone()` (once) and
    stop touching, so that the guard ends the pilot if nothing else does."""

    def __init__(self, session_dir, client_pid, on_client_gone, period_s=5.0):
        self.path = os.path.join(session_dir, HEARTBEAT)
        self.client_pid = client_pid
        self.on_client_gone = on_client_gone
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="trajflow-heartbeat", daemon=True)

    def start(self):
        self._touch()
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def _touch(self):
        with open(self.path, "a"):
            os.utime(self.path)

    def _beat(self):
        while not self._stop.wait(self.period_s):
            if os.getppid() != self.client_pid:  # re-parented: the client is gone
                self.on_client_gone()
                return
            try:
                self._touch()
            except OSError:
                pass  # a full disk must not end the heartbeat; the mtime is what counts


def heartbeat_period(timeout_s):
    return min(5.0, max(0.5, timeout_s / 10.0))


def record_session(rundir, session_dir):
    """Note in RUNDIR that `session_dir` ran this run (resume looks there for orphans)."""
    path = os.path.join(rundir, SESSIONS)
    known = read_lines(path)
    if session_dir not in known:
        with open_in_run(path, "a") as fh:
            fh.write(session_dir + "\n")


def live_guards(rundir, fresh_s=30.0):
    """Session folders of this run whose guard is running (its record fresh, no end
    recorded, the client not closed): the pilots of clients that died."""
    candidates = set(os.path.dirname(p) for p in glob.glob(os.path.join(rundir, "*", STARTED)))
    candidates.update(line for line in read_lines(os.path.join(rundir, SESSIONS)) if line)
    live = []
    for session in sorted(candidates):
        # a line planted in the record may name someone else's pilot
        if not (os.path.isabs(session) and owned_by_user(session, stat.S_ISDIR)):
            continue
        started = os.path.join(session, STARTED)
        if (not os.path.exists(started) or os.path.exists(os.path.join(session, ENDED))
                or os.path.exists(os.path.join(session, CLOSED))):
            continue
        if time.time() - os.stat(started).st_mtime < fresh_s:
            live.append(session)
    return live


def client_alive(session, stale_s=12.0):
    """True while the session's heartbeat is still touched (its client lives: e.g. a
    Pilot of this very script that ran the run before); False once it is older
    than `stale_s` (more than two beats) or gone."""
    path = os.path.join(session, HEARTBEAT)
    try:
        first = os.stat(path).st_mtime
    except OSError:
        return False
    while time.time() - first <= stale_s:
        time.sleep(0.5)
        try:
            if os.stat(path).st_mtime != first:
                return True
        except OSError:
            return False
    return False


def cancel_orphans(rundir, say, patience_s=60.0):
    """Ask every live guard of an earlier session of this run to end its pilot, and
    wait (at most `patience_s`) until each has recorded that it did."""
    orphans = [s for s in live_guards(rundir) if not client_alive(s)]
    for session in orphans:
        with open_in_run(os.path.join(session, CANCEL), "w") as fh:
            fh.write(f"an orphaned pilot of {rundir}, cancelled by trajflow --resume")
        say(f"{rundir}: an earlier pilot of this run is still running without its client "
            f"(session {session}); cancelling it")
    deadline = time.time() + patience_s
    waiting = list(orphans)
    while waiting and time.time() < deadline:
        time.sleep(0.5)
        waiting = [s for s in waiting if not os.path.exists(os.path.join(s, ENDED))]
    for session in orphans:
        if session in waiting:
            say(f"{session}: its guard did not confirm within {patience_s:.0f} s; check the "
                "batch queue for the job of that pilot")
        else:
            with open(os.path.join(session, ENDED), encoding="utf-8") as fh:
                ended = json.load(fh)
            say(f"{session}: pilot ended ({ended.get('job_cancelled') or 'its processes ended'})")
    return orphans
