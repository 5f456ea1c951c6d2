"""Stop signals: SIGTERM and SIGHUP stop a run as Ctrl-C does.

A batch system's or a user's kill (SIGTERM) and a dropped SSH session (SIGHUP)
must cancel the pilot in order, end its tasks and record the outcome, never
leave a pilot running on its own; the `trajflow` command then exits 128 + N.
`describe_stop` says which signal it was and, where it can be known, who sent
it (Python's handlers get no sender: the process's context tells).
"""
import contextlib
import os
import signal
import subprocess
import threading

from trajflow.tasks import procfs

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
stopped_by = None  # the stop signal that last interrupted a run, if one did


@contextlib.contextmanager
def stop_on_signals(also_sigint=False):
    """SIGTERM (a batch system's or a user's kill) and SIGHUP (a dropped SSH
    session) stop a run as Ctrl-C does: the pilot is cancelled in order, its
    tasks end, the outcome is recorded, Interrupted is raised. Only in the
    main thread (Python delivers signals there); the handlers before are put
    back after. `also_sigint`: Ctrl-C too where it was ignored (a command
    started with & from a script inherits SIGINT ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    global stopped_by
    stopped_by = None  # a signal that stopped an earlier run is not this one's
    owner = os.getpid()

    def stop(signum, frame):
        global stopped_by
        if os.getpid() != owner:  # a forked child (a multiprocessing worker): die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if stopped_by == signum:  # one stop: `timeout` signals trajflow, then its whole
            return                # process group (two SIGTERMs; the second escaped, seen)
        stopped_by = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)
    signals = STOP_SIGNALS + ((signal.SIGINT,) if also_sigint else ())
    before = {sig: signal.getsignal(sig) for sig in signals}
    for sig in signals:
        signal.signal(sig, stop if sig != signal.SIGINT else signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def describe_stop(signum=None):
    """'stopped by SIGTERM (...who sent it...)' for the stop signal of the last
    interrupt (or `signum`); 'interrupted by Ctrl-C (SIGINT)' when none was caught."""
    signum = signum or stopped_by
    if not signum or signum == signal.SIGINT:
        return "interrupted by Ctrl-C (SIGINT)"
    return f"stopped by {signal.Signals(signum).name} ({_sender(signum)})"


def _sender(signum):
    """Who most likely sent `signum`: the batch job's end, a `timeout` that started
    this process, a closed terminal; else what usually does."""
    if signum == signal.SIGHUP:
        return "its terminal or SSH connection closed"
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        state = _slurm_job_state(job)
        return (f"SLURM job {job}" + (f", {state}" if state else "")
                + ": `scancel` or the job's time limit")
    parent = procfs.name(os.getppid())
    if parent == "timeout":
        return f"probably `timeout` (pid {os.getppid()}), which started trajflow, at its limit"
    return ("sent by another process: `kill`, a batch system's time limit or a shutdown; "
            f"trajflow's parent is {parent or 'unknown'} (pid {os.getppid()})")


def _slurm_job_state(job):
    """The job's state as squeue says it (CANCELLED, TIMEOUT, ...), or ''."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
