"""The client guard: a pilot whose client is gone ends itself.

RADICAL-Pilot 1.103 no longer notices a dead client (its session heartbeat
went in 1.100): a pilot whose workstation process was killed idled until its
walltime (29.7 min seen), which on a cluster burns the allocation. trajflow's
client touches a heartbeat file in its RADICAL session folder every few
seconds while it is alive. This guard is started by the pilot's bootstrapper
(a `pre_bootstrap_0` command that trajflow adds to the resource config), runs
beside the agent, and ends the pilot

  - when the heartbeat is older than the client timeout,
  - at once when a cancel file appears (`trajflow run --resume` finds an
    orphan of the same run this way), or
  - when the client has cancelled the pilot itself (its closed file) and the
    pilot still runs 30 s later: a pilot cancelled before its agent was up
    never hears RADICAL's cancel, and on a SLURM without cgroups its
    daemonised agent outlives the scancel (seen),

by cancelling the batch job it runs in (SLURM `scancel`, PBS `qdel`) and
ending the bootstrapper's process tree (tasks in sessions of their own
included: what ends a local pilot). It records what it did next to the
heartbeat. Standard library only: it starts before the agent, in every pilot.

    python -m trajflow.tasks.client_guard --session-dir DIR --timeout 300 --bootstrap-pid PID
"""
import argparse
import contextlib
import os
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

from .rundir import write_record

HEARTBEAT = "trajflow.heartbeat"   # touched by the client while it lives
CANCEL = "trajflow.cancel"         # written by whoever wants the pilot gone now
CLOSED = "trajflow.closed"         # written by the client when it has cancelled its pilot
CLOSED_GRACE_S = 30.0              # a cancelled pilot's agent ends within seconds
STARTED = "trajflow.guard"         # the guard's host, pid and batch job
FIRING = "trajflow.guard.firing"   # why the guard is ending the pilot (before it does)
ENDED = "trajflow.guard.ended"     # why and how the guard ended (once the pilot has)
CLIENT_CONFIGS = "trajflow-radical-config"  # the client's RADICAL configs, removed at the end


def heartbeat_age(session_dir, since):
    """Seconds since the client's last heartbeat (since `since` if it has none yet)."""
    try:
        return time.time() - os.stat(os.path.join(session_dir, HEARTBEAT)).st_mtime
    except OSError:
        return time.time() - since


def alive(pid, born=None):
    """Whether process `pid` runs (not a zombie); with `born` (its start_time), only
    if it is still that process: pids are reused (pid_max 32768 here, wrapped
    every ~45 min of the test suite), and a guard that took a new process for
    its ended bootstrapper would, once the heartbeat went stale, end that
    process's tree: someone else's work."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z" and (born is None or fields[19] == born)


def _stat(pid):
    """The fields of /proc/PID/stat after the command (state first; start_time is
    [19]), or [] when it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def start_time(pid):
    """Process `pid`'s start time (clock ticks after boot): with the pid, its identity."""
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def _children():
    """pid -> [child pids], from /proc."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    return children


def process_tree(root):
    """`root` and all its descendants (tasks started in sessions of their own too)."""
    children, tree, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def end_process_tree(root, grace_s=5.0):
    """SIGTERM, then SIGKILL after `grace_s`, to the process groups of `root`'s tree
    (never the guard's own group)."""
    own = os.getpgid(0)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        groups = set()
        for pid in process_tree(root):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
        groups.discard(own)
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + (grace_s if sig == signal.SIGTERM else 0)
        while time.time() < deadline and any(alive(p) for p in process_tree(root)):
            time.sleep(0.2)


def batch_job_cancel():
    """The command that cancels the batch job this guard runs in, or None outside one."""
    for var, command in (("SLURM_JOB_ID", "scancel"), ("PBS_JOBID", "qdel")):
        if os.environ.get(var):
            return [command, os.environ[var]]
    return None


def guard(session_dir, timeout_s, bootstrap_pid, poll_s=None):
    """Watch until the pilot ends (its bootstrapper is gone) or the client is."""
    poll_s = poll_s or min(5.0, max(0.5, timeout_s / 10.0))
    start = time.time()
    write_record(os.path.join(session_dir, STARTED), host=socket.gethostname(), pid=os.getpid(),
            bootstrap_pid=bootstrap_pid, timeout_s=timeout_s,
            job=os.environ.get("SLURM_JOB_ID") or os.environ.get("PBS_JOBID"))
    started = os.path.join(session_dir, STARTED)
    born = start_time(bootstrap_pid)
    ends = _end_of(bootstrap_pid)
    while alive(bootstrap_pid, born):
        os.utime(started)  # the guard lives: `--resume` may ask it to end this pilot
        reason = None
        cancel = os.path.join(session_dir, CANCEL)
        closed = os.path.join(session_dir, CLOSED)
        if os.path.exists(cancel):
            with open(cancel, encoding="utf-8", errors="replace") as fh:
                reason = "cancelled: " + (fh.read().strip() or "a cancel file appeared")
        elif os.path.exists(closed) and time.time() - os.stat(closed).st_mtime > CLOSED_GRACE_S:
            reason = (f"the client cancelled this pilot over {CLOSED_GRACE_S:.0f} s ago and it "
                      "still runs")
        else:
            age = heartbeat_age(session_dir, start)
            if age > timeout_s:
                reason = (f"the client's heartbeat is {age:.0f} s old (client timeout "
                          f"{timeout_s:g} s): the client is gone")
        if reason:
            print(f"trajflow client guard: {reason}; ending the pilot", flush=True)
            # said first: locally the client's own process group is ended with the pilot's,
            # and the client reads why as soon as it sees its end (ENDED comes after)
            # (best effort: a full disk must not keep the guard from ending the pilot)
            with contextlib.suppress(OSError):
                write_record(os.path.join(session_dir, FIRING), reason=reason)
            job = batch_job_cancel()
            if job:  # recorded first: the cancel ends the guard too
                with contextlib.suppress(OSError):
                    _ended(session_dir, fired=True, reason=reason,
                           job_cancelled=shlex.join(job))
                subprocess.run(job, check=False, timeout=60)
            end_process_tree(bootstrap_pid)
            if not job:
                _ended(session_dir, fired=True, reason=reason, job_cancelled=None)
            return reason
        _wait(ends, poll_s)
    if ends is not None:
        os.close(ends)
    _ended(session_dir, fired=False, reason="the pilot ended")
    return None


def _end_of(pid):
    """A descriptor readable once `pid` has ended (pidfd), or None (no pidfd_open here,
    or it is gone already)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait(ends, poll_s):
    """`poll_s`, or less: the pilot's end is heard at once where its pidfd is (a guard
    that lived on for up to its 5 s poll after its pilot was seen in tests)."""
    if ends is None:
        time.sleep(poll_s)
    else:
        select.select([ends], [], [], poll_s)


def _ended(session_dir, **fields):
    """Record the end; remove what a killed client could not (its config folder) and
    what RADICAL-Pilot never does (its tasks' temp folder on this node)."""
    shutil.rmtree(os.path.join(session_dir, CLIENT_CONFIGS), ignore_errors=True)
    remove_task_tmp(os.path.basename(os.path.normpath(session_dir)))
    write_record(os.path.join(session_dir, ENDED), **fields)


def remove_task_tmp(sid):
    """Remove ${TMPDIR:-/tmp}/<sid>: RADICAL-Pilot's agent makes it for its tasks' temp
    files and leaves it (an empty folder per run in /tmp, 175 seen here)."""
    if sid.startswith("re.session."):
        shutil.rmtree(os.path.join(os.environ.get("TMPDIR", "/tmp"), sid), ignore_errors=True)


def _daemonize(log_path):
    """Return in the child of a double fork, in a session of its own, its output to
    `log_path`: the bootstrapper goes on at once, and a cancel of the pilot's
    process group does not take the guard before it has recorded the end."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--session-dir", required=True)
    p.add_argument("--timeout", type=float, required=True)
    p.add_argument("--bootstrap-pid", type=int, required=True)
    p.add_argument("--foreground", action="store_true", help="do not detach (tests)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.session_dir):
        print(f"trajflow client guard: no session folder {args.session_dir}; not guarding",
              file=sys.stderr)
        return 0
    if not args.foreground:
        _daemonize(os.path.abspath("trajflow-guard.log"))
    guard(args.session_dir, args.timeout, args.bootstrap_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
