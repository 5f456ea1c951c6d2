"""RADICAL's components and process watchers wake when there is something to do: a
watcher when a watched process ends, not every 50 ms; a component's main thread
when the component stops, not every 0.1 s.

Every RADICAL-Pilot bridge and component (~25 processes per local pilot) runs a
`radical.utils.PWatcher`: a thread that checks its watched pids (its parent, itself)
with `kill(pid, 0)` every 50 ms, and on a death ends the processes as told. On an
idle held pilot those were the last loops waking 20 times a second in every process.
Here the thread sleeps on a pidfd per watched pid (readable once the process has
ended) and on a pipe that `watch()` writes to; what it then checks, and does, is
RADICAL's own (`_is_alive`, then the watcher's action). A pid
whose pidfd cannot be had, or which has ended but is not yet reaped (a zombie, alive
to `kill(pid, 0)`), is polled every POLL_S, as RADICAL polls every pid.

A component's script (`radical-pilot-component`) ends in `BaseComponent.wait()`,
which looks at the component's stop flag (a threading.Event) every 0.1 s; here it
waits on the flag (signals still reach it: Python's lock waits are interruptible).
A timed callback (`register_timed_cb`: the pilot manager's heartbeat, agent_0's
lifetime check every 10 s) ran in a thread that looked at the clock every 10 ms;
here it waits on the stop flag until the callback is due. And a ZMQ subscriber's or
pipe's listener thread polled its socket every 500 or 10 ms to see its stop flag;
here the flag also makes a pipe readable, which it polls beside its socket
(`waking_rp_listeners`).

Applied by the component starter (component_starter.py) before it forks any bridge or
component, in agent_0's process by its launcher (agent_start.py), and in the client
holding a pilot (workflows/run/entk_client.py).
"""
import os
import select
import threading
import time
import weakref

RESCAN_S = 60.0  # a look without cause, should a wake-up be missed
POLL_S = 0.05    # RADICAL's own period, for the pids that cannot be waited on
ACTIONS = ("nothing", "suicide", "killall", "rampage")  # PWatcher's, as RADICAL names them


def quiet_components(component_class=None, watcher_class=None):
    """RADICAL's components (or `component_class`) wait on their stop flag, their
    process watchers (or `watcher_class`) on the processes watched, and the ZMQ
    subscribers' and pipes' listeners of this process on a message or their stop."""
    if component_class is None:
        from radical.pilot.utils.component import BaseComponent as component_class
    component_class.wait = wait_until_stopped
    component_class.register_timed_cb = register_timed_cb
    quiet_process_watchers(watcher_class)
    waking_rp_listeners()


def wait_until_stopped(self):
    """BaseComponent.wait: until the component's stop flag is set."""
    while not self._term.wait(RESCAN_S):
        pass


def register_timed_cb(self, cb, cb_data=None, timer=None):
    """BaseComponent.register_timed_cb (radical/pilot/utils/component.py): `cb` called
    in a thread of its own, at most every `timer` s (none: again and again) until it
    returns False or the component stops; the thread sleeps until it is due."""
    name = "%s.idler.%s" % (self.uid, cb.__name__)
    self._log.debug('START: %s register idler %s', self.uid, name)
    with self._cb_lock:
        if name in self._threads:
            raise ValueError('cb %s already registered' % cb.__name__)
        self._threads[name] = TimedCallback(name, self._log, float(timer or 0.0), cb,
                                            cb_data, self._cb_lock, self._term)
    self._log.debug('%s registered idler %s', self.uid, name)


class TimedCallback(threading.Thread):
    """RADICAL's Idler thread, waiting on the component's stop flag until it is due."""

    def __init__(self, name, log, timer, cb, cb_data, cb_lock, term):
        super().__init__(name=name, daemon=True)
        self._log, self._timeout, self._term = log, timer, term
        self._cb, self._cb_data, self._cb_lock = cb, cb_data, cb_lock
        self._last = 0.0
        self.start()

    def run(self):
        try:
            self._log.debug('start idle thread: %s', self._cb)
            ret = True
            while ret and not self._term.is_set():
                due_in = self._timeout - (time.time() - self._last) if self._timeout else 0
                if due_in > 0:
                    self._term.wait(due_in)
                    continue
                with self._cb_lock:
                    ret = self._cb() if self._cb_data is None else self._cb(cb_data=self._cb_data)
                if self._timeout:
                    self._last = time.time()
        except Exception:
            self._log.exception('idle thread failed: %s', self._cb)


def quiet_process_watchers(watcher_class=None):
    """RADICAL's PWatcher (or `watcher_class`) threads started from now on in this
    process wait on pidfds; once."""
    if watcher_class is None:
        from radical.utils import PWatcher as watcher_class
    if watcher_class._watch is watch_with_pidfds:
        return
    made, watch = watcher_class.__init__, watcher_class.watch

    def __init__(self, *args, **kwargs):
        self._wake_read, self._wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        made(self, *args, **kwargs)  # (starts its thread)

    def watch_and_wake(self, pid):
        watch(self, pid)
        try:
            os.write(self._wake_write, b"w")
        except BlockingIOError:
            pass  # awake already

    watcher_class.__init__ = __init__
    watcher_class.watch = watch_and_wake
    watcher_class._watch = watch_with_pidfds


def watch_with_pidfds(self):
    """PWatcher's loop: sleep until a watched process ends (or RESCAN_S), then check
    and act as RADICAL's loop does."""
    self._log.debug_1('pwatcher started')
    pidfds = {}  # watched pid -> its pidfd, or None: polled
    try:
        while True:
            with self._lock:
                watched = set(self._pids)
            for pid in set(pidfds) - watched:
                close_fd(pidfds.pop(pid))
            for pid in watched - set(pidfds):
                pidfds[pid] = pidfd_of(pid)
            waited = {fd: pid for pid, fd in pidfds.items() if fd is not None}
            wait_s = POLL_S if len(waited) < len(pidfds) else RESCAN_S
            for fd in readable([self._wake_read, *waited], wait_s):
                if fd == self._wake_read:
                    drain(fd)
                else:  # ended: checked below; polled while a zombie
                    pidfds[waited.pop(fd)] = None
                    close_fd(fd)
            check_watched(self)
    finally:
        for fd in pidfds.values():
            close_fd(fd)


def readable(fds, wait_s):
    """Those of `fds` readable within `wait_s` (poll(2): no limit on the fds' numbers)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(wait_s * 1000)]


def check_watched(self):
    """RADICAL's check of its watched pids (radical/utils/heartbeat.py PWatcher._watch):
    one found dead is unwatched and the watcher's action (its method `_<action>`) run."""
    with self._lock:
        for pid in list(self._pids):
            if not self._is_alive(pid):
                self._log.warn('process %d died, exit', pid)
                self._pids.remove(pid)
                if self._action in ACTIONS:
                    getattr(self, "_" + self._action)(pid)


def pidfd_of(pid):
    """A pidfd of `pid`, or None (gone already, no pidfds in this kernel or this
    Python's build, no file descriptor left): then it is polled."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        return pidfd_open(pid)
    except OSError:
        return None


def drain(fd):
    """Read a non-blocking pipe empty (its bytes only said: wake up)."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def close_fd(fd):
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class WakingEvent(threading.Event):
    """A threading.Event whose set() also makes a pipe readable, so that a listener
    polling its socket and this pipe wakes at a stop at once."""

    def __init__(self):
        super().__init__()
        self._read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def fileno(self):
        return self._read_fd

    def set(self):
        super().set()
        try:
            os.write(self._write_fd, b"x")
        except (BlockingIOError, OSError):
            pass  # already readable (or closed at exit)

    def clear(self):
        super().clear()
        drain(self._read_fd)

    def __del__(self):
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


LISTENER_IDLE_MS = 5000  # a listener that a stop wakes looks at its flag this often
_LISTENER_STOPS = weakref.WeakKeyDictionary()  # a subscriber's socket -> its WakingEvent
_SWAP_LOCK = threading.Lock()


def waking_rp_listeners(poll_ms=50):
    """RADICAL's ZMQ subscriber and pipe listeners in this process sleep until a message
    or their stop comes, instead of polling every 500 ms (subscribers) or 10 ms (pipes).

    A listener thread is joined when its subscriber or pipe stops; the client's
    session, pilot manager and task manager stop a dozen of them one after another at
    close (3.7 s of every teardown with the subscribers' 500 ms: py-spy, 50 Hz; it
    polled 50 ms before 0.22), and a held pilot's holder kept ~10 subscribers and 3
    pipes waking 20-100 times a second each, agent_0 a pipe 100 times. Each listener's
    stop flag is now a WakingEvent whose pipe it polls beside its socket. One whose
    flag is RADICAL's (a listener started before this was applied) polls every
    `poll_ms`.
    """
    import zmq
    from radical.utils.zmq.pipe import MODE_PULL, Pipe, from_msgpack
    from radical.utils.zmq.pubsub import Subscriber
    if getattr(Subscriber._get_nowait, "_trajflow_waking", False):
        return
    get = Subscriber._get_nowait
    start_listener = Subscriber._start_listener

    def waking_start_listener(self):
        # (not under the subscriber's lock: RADICAL's takes it; under one of this
        # module's, so that two threads' first subscribe() swap the flag once)
        with _SWAP_LOCK:
            if self._thread is None and not isinstance(self._term, WakingEvent):
                self._term = WakingEvent()
                _LISTENER_STOPS[self._sock] = self._term
        return start_listener(self)

    def waking_get(sock, lock, timeout, log, prof):
        stop = _LISTENER_STOPS.get(sock)
        if stop is None:
            return get(sock, lock, poll_ms if timeout is None else min(timeout, poll_ms),
                       log, prof)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(stop.fileno(), zmq.POLLIN)
        if sock in dict(poller.poll(timeout=LISTENER_IDLE_MS)):
            return get(sock, lock, 0, log, prof)
        return None, None
    waking_get._trajflow_waking = True

    def waking_pipe_listener(self):
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        term = self._term
        waking = isinstance(term, WakingEvent)
        if waking:
            poller.register(term.fileno(), zmq.POLLIN)
        while not term.is_set():
            if self._sock in dict(poller.poll(timeout=LISTENER_IDLE_MS if waking else 10)):
                msg = self._sock.recv()
                for cb in list(self._cbs):
                    try:
                        cb(from_msgpack(msg))
                    except Exception:
                        self._log.exception('callback failed')

    pipe_init = Pipe.__init__

    def waking_pipe_init(self, *args, **kwargs):
        pipe_init(self, *args, **kwargs)
        if self._mode == MODE_PULL and self._thread is None:
            self._term = WakingEvent()

    Subscriber._start_listener = waking_start_listener
    Subscriber._get_nowait = staticmethod(waking_get)
    Pipe.__init__ = waking_pipe_init
    Pipe._listener = waking_pipe_listener
