"""A pilot's task programs started by fork from a Python that has imported their
libraries once, instead of each as a new Python that imports them.

Every task program (split, analyze, reduce, a Backend part) is a new Python that
imports numpy and h5py (0.2-0.3 s of CPU) and, for a Backend part, MDAnalysis (0.45 s
more), for work that takes milliseconds on a small run. Beside a
pilot's agent (tasks/agent_start.py) runs this module's server, which has imported
them; the task's command is `python -m trajflow.tasks.task_server run MODULE ARGS`, a
small client that hands the server its standard input and output, folder,
environment, umask, CPUs, timer slack and ignored signals over a Unix socket. The
server forks; the fork becomes `python -m MODULE ARGS` (its command line too: `ps`
shows the task) and the client waits for it, passes on the signals it gets
(RADICAL's cancel) and ends with its exit status. The client is still RADICAL's task
process: its states, profile and cancel are RADICAL's as before. Where the server is
not there or serves not this client (another user, Python, installed code, cgroup,
nice value, resource limit, or a variable Python, its libraries or trajflow's test
hooks read when they start), the client becomes the task itself (exec): a run never
depends on it. A fork whose client dies is killed; the server ends with the agent (its
input closes), killing what it started, and a fork dies with the server.

What differs from a new Python: the fork's /proc/PID/environ is the server's (Linux
shows a process' environment as it was at its exec), and its CPU and I/O counters
start at the fork, without an interpreter's start-up and imports.

MPI ranks too (MPICH's hydra, SLURM's PMI2): a rank's launcher talks to it through a
descriptor it names in PMI_FD; the client hands it over with its stdio and the fork has
it at the same number. A served rank is finalized and ends through libc's exit():
MPICH tells its proxy "finalize" from a C atexit handler, and the proxy SIGKILLs every
rank when one's connection closes unfinalized (with os._exit, 33 of 40 3-rank launches
were killed after every rank had finished; strace of the proxy showed why).
Standard library only at the top: the client must start in milliseconds.
"""
import functools
import json
import os
import signal
import socket
import struct
import sys

MODULE = "trajflow.tasks.task_server"  # `python -m` this (its own __name__ is __main__ then)
SERVER_RECORD = "trajflow-task-server.json"  # in the pilot's sandbox: where its socket is
SOCKET = "socket"
SERVER_COMMAND = f"-m {MODULE} serve "  # in the server's process title
# what a task's command line runs; only these modules are served
SERVED = ("trajflow.tasks.split", "trajflow.tasks.analyze", "trajflow.tasks.reduce",
          "trajflow.tasks.backend_part", MODULE)
# imported once by the server (each where it can be: a missing one is the task's to import)
PREIMPORTED = ("ctypes", "fcntl", "setproctitle", "numpy", "h5py", "cloudpickle",
               "MDAnalysis", "MDAnalysis.analysis.base", "trajflow.tasks.split",
               "trajflow.tasks.analyze", "trajflow.tasks.reduce", "trajflow.tasks.backend_part",
               "trajflow.tasks.mda_analyses", "trajflow.tasks.procfs")
# variables read when Python, a preimported library or trajflow's test hooks
# (tasks/faults.py) start: a client whose values differ from the server's is not
# served (its fork would run with the server's)
READ_AT_START = ("PYTHON", "OMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "NPY_", "NUMPY_",
                 "HDF5_", "LD_", "MDANALYSIS", "NUMBA_", "KMP_", "GOMP_", "LANG", "LC_",
                 "TZ", "TMPDIR", "TRAJFLOW_TEST_")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# the signals a client passes on to its task (a stopped task is continued after an
# ending one, so that it ends); one the client was started ignoring stays ignored
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
DISABLE_ENV = "TRAJFLOW_TASK_SERVER"  # "0": a pilot's agent starts no server
REQUEST_TIMEOUT_S = 2.0  # a client sends its request at once: the server waits no longer
MAX_MESSAGE = 1 << 24
_LENGTH = struct.Struct("!I")


# --- what a client and the server both describe -------------------------------------
def process_settings(environ=None):
    """What a fork inherits from the server and cannot be given the client's: equal, or
    the client is not served. `environ`: the environment the process started with
    (a library may set variables when imported: MDAnalysis' dependencies set
    KMP_DUPLICATE_LIB_OK)."""
    environ = os.environ if environ is None else environ
    import resource
    limits = {name: resource.getrlimit(getattr(resource, name))
              for name in sorted(dir(resource)) if name.startswith("RLIMIT_")}
    try:
        with open("/proc/self/cgroup", encoding="ascii") as fh:
            cgroup = fh.read()
    except OSError:
        cgroup = None
    return json.loads(json.dumps({  # as a request brings them
        "uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
        "python": [os.path.realpath(sys.executable), sys.prefix], "code": _code_version(),
        "cgroup": cgroup, "nice": os.getpriority(os.PRIO_PROCESS, 0), "limits": limits,
        "read_at_start": {k: v for k, v in environ.items() if k.startswith(READ_AT_START)}}))


def _code_version():
    """trajflow.tasks' files as they are now (name, size, mtime): a server started before
    an edit or an upgrade serves no task of the new code."""
    folder = os.path.dirname(os.path.abspath(__file__))
    seen = []
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.endswith(".py"):
            info = entry.stat()
            seen.append([entry.name, info.st_size, info.st_mtime_ns])
    return seen


def _send(sock, message, fds=()):
    data = json.dumps(message).encode()
    socket.send_fds(sock, [_LENGTH.pack(len(data)) + data], list(fds))


class _Messages:
    """Length-prefixed JSON messages off a stream socket (two sent together arrive
    together), with the descriptors that came with them."""

    def __init__(self, sock):
        self.sock, self.data = sock, b""

    def receive(self, max_fds=0):
        """(message, fds), or (None, []) where the other side has gone."""
        fds = []
        try:
            while True:
                if len(self.data) >= _LENGTH.size:
                    size = _LENGTH.unpack(self.data[:_LENGTH.size])[0]
                    if size > MAX_MESSAGE:
                        raise ValueError(f"a message of {size} bytes")
                    if len(self.data) >= _LENGTH.size + size:
                        message = self.data[_LENGTH.size:_LENGTH.size + size]
                        self.data = self.data[_LENGTH.size + size:]
                        return json.loads(message), fds
                chunk, got, _, _ = socket.recv_fds(self.sock, 1 << 16, max_fds)
                fds += got
                if not chunk:
                    _close_all(fds)
                    return None, []
                self.data += chunk
        except BaseException:
            _close_all(fds)
            raise


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


MAX_PASSED = 4  # stdin, stdout, stderr and the MPI launcher's connection (PMI_FD)


def launcher_descriptors():
    """What the task has from whoever started it: stdin, stdout and stderr, and an MPI
    rank's connection to its launcher's proxy where the launcher hands it over by number
    (MPICH's hydra, SLURM's PMI2: PMI_FD)."""
    fds = [0, 1, 2]
    pmi = os.environ.get("PMI_FD", "")
    if pmi.isdigit() and 2 < int(pmi) < 1 << 16:
        try:
            os.fstat(int(pmi))
            fds.append(int(pmi))
        except OSError:
            pass
    return fds


def _passed_as_said(request, fds):
    """Whether the descriptors that came are those the request names: stdio first, then
    at most one more, each once."""
    said = request.get("fds") if isinstance(request, dict) else None
    return (isinstance(said, list) and len(said) == len(fds) and said[:3] == [0, 1, 2]
            and all(isinstance(t, int) and 2 < t < 1 << 16 for t in said[3:])
            and len(set(said)) == len(said))


def _place(fds, targets):
    """Each descriptor that came at the number the client had it (moved clear of the
    targets first: one that came at another's number is not overwritten)."""
    import fcntl
    clear = [fcntl.fcntl(fd, fcntl.F_DUPFD, max(targets) + 1) for fd in fds]
    _close_all(fds)
    for target, fd in zip(targets, clear):
        os.dup2(fd, target)
    _close_all(clear)


# --- the client: RADICAL's task process ----------------------------------------------
def run(module, args):
    """Be the task `python -m module args`: served by the pilot's server where it can
    be, else by exec. Once a request is sent, a server that ends without answering
    fails the task (the fork may have begun it): it is not run twice."""
    signals = _SignalsPassedOn()  # from before the request: none is lost to a race
    passed = launcher_descriptors()
    request = {"module": module, "args": args, "cwd": os.getcwd(), "fds": passed,
               "env": dict(os.environ), "umask": _umask(),
               "cpus": sorted(os.sched_getaffinity(0)), "ignored": signals.ignored,
               "timer_slack": _timer_slack(), "settings": process_settings(),
               "title": " ".join([sys.executable, "-m", module, *args])}
    sock = _connect()
    if sock is not None:
        messages = _Messages(sock)
        try:
            _send(sock, request, passed)
        except OSError:
            reply = {"refused": "the server took no request"}
        else:
            try:
                reply, _ = messages.receive()
            except (OSError, ValueError):
                reply = None
        if reply is None:
            _fail("the pilot's task server ended before it answered")
        if "pid" in reply:
            _follow(messages, reply["pid"], signals)  # never returns
        sock.close()
    signals.take_back()  # as it was started; one that came meanwhile ends it as it would have
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


def _fail(why):
    sys.stderr.write(f"trajflow: {why}\n")
    sys.stderr.flush()
    os._exit(1)


class _SignalsPassedOn:
    """The client's handlers of the signals it passes on to its task's process group;
    one that comes before the task's pid is known waits for it. A signal the client was
    started ignoring (RADICAL starts tasks in the background of a shell: SIGINT and
    SIGQUIT) stays ignored, here and in the task."""

    def __init__(self):
        self.pid, self.waiting = None, []
        self.ignored = [int(s) for s in PASSED_ON if signal.getsignal(s) == signal.SIG_IGN]
        for signum in PASSED_ON:
            if signum not in self.ignored:
                signal.signal(signum, self._handle)

    def _handle(self, signum, _frame):
        if self.pid is None:
            self.waiting.append(signum)
        else:
            self._pass_on(signum)

    def _pass_on(self, signum):
        if _signal_fork(self.pid, signum) and signum in ENDING:  # a stopped task
            _signal_fork(self.pid, signal.SIGCONT)                # would not end

    def follow(self, pid):
        self.pid = pid
        for signum in self.waiting:
            self._pass_on(signum)

    def take_back(self):
        """The handlers as this process was started with, and the signals that came,
        raised on this process."""
        for signum in PASSED_ON:
            if signum not in self.ignored:
                signal.signal(signum, signal.SIG_DFL)
        for signum in self.waiting:
            os.kill(os.getpid(), signum)


def _connect():
    """A connection to this node's server, or None: none runs here, or its record or
    socket is not this user's alone."""
    sandbox = os.environ.get("RP_PILOT_SANDBOX")
    if not sandbox or os.environ.get(DISABLE_ENV) == "0":
        return None
    import stat
    try:
        fd = os.open(os.path.join(sandbox, SERVER_RECORD),
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            info = os.fstat(fh.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() \
                    or info.st_size > 1 << 16:
                return None
            record = json.loads(fh.read())
        if record.get("host") != socket.gethostname():
            return None
        folder = os.open(record["folder"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    try:  # the socket through the folder checked, not through its path again
        info = os.fstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        path = f"/proc/self/fd/{folder}/{SOCKET}"
        if not stat.S_ISSOCK(os.lstat(path).st_mode) or os.lstat(path).st_uid != os.getuid():
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(REQUEST_TIMEOUT_S)
            sock.connect(path)
            sock.settimeout(None)
        except OSError:
            sock.close()
            return None
        return sock
    except OSError:
        return None
    finally:
        os.close(folder)


def _follow(messages, pid, signals):
    """Wait for the task's fork, pass signals on to it, end as it ended."""
    signals.follow(pid)
    try:
        import setproctitle
        setproctitle.setproctitle(f"trajflow task client (task process {pid})")
    except ImportError:
        pass
    try:
        reply, _ = messages.receive()
    except (OSError, ValueError):
        reply = None
    status = reply.get("status") if reply else None
    if status is None:  # the server died: its fork was killed with it
        _fail("the pilot's task server ended before this task")
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # ended by a signal: so does this process
        signals.waiting = [-code]
        signals.take_back()
        code = 128 - code
    os._exit(code)


def _umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _timer_slack():
    from trajflow.tasks.placement import timer_slack_ns
    return timer_slack_ns()


# --- the server: beside the pilot's agent --------------------------------------------
_SERVER = []


def start_beside_agent():
    """Start this node's server for the agent's tasks (it ends when this process does:
    its input closes). Nothing where TRAJFLOW_TASK_SERVER=0."""
    if os.environ.get(DISABLE_ENV) == "0" or _SERVER:
        return
    import subprocess
    log_path = os.path.join(os.getcwd(), "trajflow-task-server.log")
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "ab") as log:
        _SERVER.append(subprocess.Popen(
            [sys.executable, "-P", "-m", MODULE, "serve",
             os.path.join(os.getcwd(), SERVER_RECORD)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, close_fds=True))


def serve(record_path):
    """Serve forks of the task programs until the input closes (or the parent ends)."""
    import select
    import shutil
    import tempfile
    try:  # how the server hears of its forks' ends (Linux 5.3); without it none is served
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError) as exc:
        print(f"not serving: no pidfd_open here ({exc})", file=sys.stderr, flush=True)
        return
    for name in THREAD_VARIABLES:  # the tasks' own (workflows/run/pipeline.py)
        os.environ.setdefault(name, "1")
    started_with = dict(os.environ)
    _preimport()
    settings = process_settings(started_with)
    import setproctitle  # set up while this process' own environment is in place, so
    setproctitle.setproctitle(setproctitle.getproctitle())  # that a fork can retitle
    signal.signal(signal.SIGTERM, _end_on_signal)  # RADICAL ending the agent's group:
    signal.signal(signal.SIGHUP, _end_on_signal)   # the forks killed, the socket removed
    folder = tempfile.mkdtemp(prefix="trajflow-tasks-")  # only this user may enter
    tempfile.tempdir = None  # a fork finds its own TMPDIR's
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, SOCKET))
    listener.listen(64)
    from trajflow.tasks.rundir import write_record
    write_record(record_path, folder=folder, host=socket.gethostname(), pid=os.getpid())
    parent = os.getppid()
    forks = _Forks()
    try:
        while True:
            ready, _, _ = select.select([sys.stdin, listener, *forks.selectable()], [], [],
                                        1.0)
            for pidfd in [r for r in ready if isinstance(r, int)]:
                forks.ended(pidfd)  # first: a fork that ended with the input still answered
            for conn in [r for r in ready if isinstance(r, socket.socket) and r is not listener]:
                forks.heard_from(conn)
            if listener in ready:
                _accept(listener, settings, forks)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 12) \
                    or os.getppid() != parent:  # the agent has ended
                return
    finally:
        forks.kill_all()
        try:
            os.unlink(record_path)
        except OSError:
            pass
        shutil.rmtree(folder, ignore_errors=True)


class _Forks:
    """The running forks: each with its pidfd (readable when it ends) and its client's
    connection (readable when the client has gone)."""

    def __init__(self):
        self.by_pidfd = {}       # pidfd -> (pid, connection)
        self.by_connection = {}  # connection -> pidfd

    def selectable(self):
        return [*self.by_pidfd, *self.by_connection]

    def add(self, pid, conn):
        pidfd = os.pidfd_open(pid)
        self.by_pidfd[pidfd] = (pid, conn)
        self.by_connection[conn] = pidfd

    def descriptors(self):
        """What a new fork must close: every pidfd and connection of the others."""
        return list(self.by_pidfd), list(self.by_connection)

    def ended(self, pidfd):
        pid, conn = self._forget(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            _send(conn, {"status": status})
        except OSError:
            pass
        conn.close()

    def heard_from(self, conn):
        """A client sends nothing after its request: its connection readable means it
        has gone, and so goes its fork."""
        if conn not in self.by_connection:
            return
        try:
            gone = not conn.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            gone = True
        if gone:
            pid, _ = self.by_pidfd[self.by_connection[conn]]
            _kill(pid)  # its end comes as its pidfd's: reaped, the connection closed

    def kill_all(self):
        for pidfd in list(self.by_pidfd):
            pid, conn = self._forget(pidfd)
            _kill(pid)
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
            conn.close()

    def _forget(self, pidfd):
        pid, conn = self.by_pidfd.pop(pidfd)
        del self.by_connection[conn]
        os.close(pidfd)
        return pid, conn


def _end_on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def _preimport():
    import importlib
    import gc
    for name in PREIMPORTED:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the task imports it, and says why
            print(f"not preimported: {name}: {exc}", file=sys.stderr, flush=True)
    gc.collect()
    gc.freeze()  # the forks share these pages instead of touching them


def _kill(pid):
    _signal_fork(pid, signal.SIGKILL)


def _signal_fork(pid, signum):
    """`signum` to the fork's process group, or to the fork before it has made its
    group; False where neither is there."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signum)
            return True
        except OSError:
            continue
    return False


def refusal(request, settings, peer_uid):
    """Why this request is not served (None: it is)."""
    if peer_uid != os.getuid():
        return "another user's"
    if not isinstance(request, dict) or not isinstance(request.get("settings"), dict):
        return "not a request"
    if request.get("module") not in SERVED:
        return f"not a task program: {request.get('module')!r}"
    differ = sorted(k for k in settings if request["settings"].get(k) != settings[k])
    return f"its process differs: {', '.join(differ)}" if differ else None


def _accept(listener, settings, forks):
    """Take one request: refuse it, or fork its task. Whatever fails after the fork
    kills the fork (its client is told nothing and fails: never run twice)."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return
    conn.settimeout(REQUEST_TIMEOUT_S)  # a client sends its request at once
    fds, pid = [], None
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, peer_uid, _ = struct.unpack("3i", creds)
        request, fds = _Messages(conn).receive(max_fds=MAX_PASSED)
        why = "no request" if request is None \
            else "not its descriptors" if not _passed_as_said(request, fds) \
            else refusal(request, settings, peer_uid)
        if why is not None:
            print(f"not served: {why}", file=sys.stderr, flush=True)
            _send(conn, {"refused": why})
            conn.close()
            return
        pidfds, conns = forks.descriptors()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
        try:
            flush_before_fork()
            pid = os.fork()
            if pid == 0:
                _become_task(request, fds, [listener, conn, *conns], pidfds, blocked)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            os.setpgid(pid, pid)  # at once (the fork makes it too): a kill reaches its group
        except OSError:
            pass
        forks.add(pid, conn)
        conn.settimeout(None)
        _send(conn, {"pid": pid})
    except Exception as exc:  # noqa: BLE001 - one client's failure is not the server's
        print(f"a request failed: {exc!r}", file=sys.stderr, flush=True)
        if pid is not None and pid > 0:
            _kill(pid)  # its end is reaped through its pidfd, or here
            if conn not in forks.by_connection:
                os.waitpid(pid, 0)
                conn.close()
        else:
            conn.close()
    finally:
        _close_all(fds)


def _become_task(request, fds, sockets, pidfds, mask):
    """In the fork: become `python -m MODULE ARGS` as the client would have run it,
    run it, and end as the interpreter would. Never returns."""
    code = 1
    try:
        from trajflow.tasks.procfs import die_with_parent  # preimported: no import's work here
        parent = os.getppid()
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in request["ignored"]:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        die_with_parent(parent)  # no fork outlives the server, none starts after it
        for sock in sockets:
            sock.close()
        for fd in pidfds:
            os.close(fd)
        os.setpgid(0, 0)  # its own group: what it starts ends with it
        _place(fds, request["fds"])
        _fresh_stdio()
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.sched_setaffinity(0, request["cpus"])
        from trajflow.tasks.placement import set_timer_slack, timer_slack_ns
        if request["timer_slack"] is not None and timer_slack_ns() != request["timer_slack"]:
            set_timer_slack(request["timer_slack"])
        import setproctitle
        setproctitle.setproctitle(request["title"])
        _reseed()
        code = _run_module(request["module"], request["args"])
    except BaseException:  # noqa: BLE001 - the fork must never return into the server
        import traceback
        traceback.print_exc()
    finally:
        _exit_as_interpreter(code)


def _fresh_stdio():
    """sys.stdin/stdout/stderr on the client's descriptors, made as the server's were
    (its encoding, errors and buffering: the variables that decide them are equal) save
    for what depends on the descriptor (a terminal is line-buffered)."""
    import io

    def like(old, fd, mode):
        unbuffered = "w" in mode and getattr(old, "write_through", False)
        raw = open(fd, mode + "b", buffering=0 if unbuffered else -1, closefd=False)
        return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                                line_buffering=old is sys.__stderr__ or raw.isatty(),
                                write_through=unbuffered)
    sys.stdin, sys.stdout, sys.stderr = (like(sys.__stdin__, 0, "r"),
                                         like(sys.__stdout__, 1, "w"),
                                         like(sys.__stderr__, 2, "w"))
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _reseed():
    """numpy's global generator as a new process has it (random's reseeds at fork)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run_module(module, args):
    """runpy as `python -m` runs it; its exit code as the interpreter would give it."""
    import runpy
    import traceback
    sys.argv = [module, *args]
    sys.path.insert(0, os.getcwd())  # `python -m`'s first path entry
    # run as a new Python runs it: its code as __main__ only (the server's import of it
    # served its own imports)
    parent, _, name = module.rpartition(".")
    sys.modules.pop(module, None)
    if parent in sys.modules and hasattr(sys.modules[parent], name):
        delattr(sys.modules[parent], name)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001 - what the interpreter prints, and its code
        traceback.print_exc()
        return 1


def _exit_as_interpreter(code):
    """Join threads, run atexit handlers, flush, exit (or die of SIGINT as Python does
    on an uncaught KeyboardInterrupt). An MPI rank is finalized (mpi4py does it at the
    interpreter's end, which a fork never reaches) and ends through libc's exit(): MPICH
    tells its launcher's proxy "finalize" from a C atexit handler, and a rank whose
    connection closes unfinalized has every rank killed (os._exit skips that handler)."""
    mpi = sys.modules.get("mpi4py.MPI")
    began = False
    try:
        began = mpi is not None and mpi.Is_initialized()  # first: whatever fails below
        import atexit
        import threading
        threading._shutdown()
        atexit._run_exitfuncs()
        if began and not mpi.Is_finalized():
            mpi.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        code = code if 0 <= code < 256 else 1
        if began:  # (PyDLL: the GIL stays held, no thread runs Python during libc's exit)
            import ctypes
            ctypes.PyDLL(None).exit(code)
        os._exit(code)


@functools.lru_cache(maxsize=1)
def _libc():
    import ctypes  # here, not at the top: the client never needs it (pre-imported: PREIMPORTED)
    return ctypes.CDLL(None)


def flush_before_fork():
    """Write what Python's and C's output buffers hold before a fork: a served task that
    ends through libc's exit() (after MPI) would otherwise write its copy of what the
    server's C stdio held (a library's printf), once per task."""
    try:  # a full or closed log loses its bytes, never a task
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _libc().fflush(None)


def probe():
    """What a served task sees (for tests and a look by hand)."""
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                      "argv": sys.argv, "umask": _umask(),
                      "cpus": sorted(os.sched_getaffinity(0)),
                      "env": dict(os.environ), "pgid": os.getpgid(0),
                      "stdin": sys.stdin.read()}), flush=True)


def mpi_probe():
    """An MPI rank's view (for tests): its rank and parent, and the ranks' sum."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    total = world.allreduce(world.Get_rank())
    print(json.dumps({"rank": world.Get_rank(), "size": world.Get_size(), "sum": total,
                      "pid": os.getpid(), "ppid": os.getppid()}), flush=True)


def main(argv):
    if argv[:1] == ["serve"] and len(argv) == 2:
        serve(argv[1])
    elif argv[:1] == ["run"] and len(argv) >= 2:
        run(argv[1], argv[2:])
    elif argv == ["probe"]:
        probe()
    elif argv == ["mpi-probe"]:
        mpi_probe()
    elif argv == ["signals"]:
        print(json.dumps({int(s): {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default"}.get(
            signal.getsignal(s), "handled") for s in PASSED_ON}), flush=True)
    elif argv[:1] == ["sleep"] and len(argv) == 2:
        import time
        print(os.getpid(), flush=True)
        time.sleep(float(argv[1]))
    else:
        sys.exit("usage: python -m trajflow.tasks.task_server "
                 "(serve RECORD | run MODULE ARGS... | probe | mpi-probe | signals | "
                 "sleep SECONDS)")


if __name__ == "__main__":
    main(sys.argv[1:])
