"""Stop signals: SIGTERM and SIGHUP stop a run as Ctrl-C does.

A batch system's or a user's kill (SIGTERM) and a dropped SSH session (SIGHUP)
must cancel the pilot in order, end its tasks and record the outcome, never
leave a pilot running on its own; the `trajflow` command then exits 128 + N.
"""
import contextlib
import os
import signal
import threading

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

    owner = os.getpid()

    def stop(signum, frame):
        global stopped_by
        if os.getpid() != owner:  # a forked child (a multiprocessing worker): die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
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
