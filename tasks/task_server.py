"""A pilot's task programs started by fork from a Python that has imported their
libraries once, instead of each as a new Python that imports them.

Every single-core task (split, a tasks-mode analyze, reduce, a Backend part) is a
new Python that imports numpy and h5py (0.2-0.3 s of CPU) and, for a Backend part,
MDAnalysis (0.45 s more), for work that takes milliseconds on a small run. Beside a
pilot's agent (tasks/agent_start.py) runs this module's server, which has imported
them; the task's command is `python -m trajflow.tasks.task_server run MODULE ARGS`, a
small client that hands the server its standard input and output, folder,
environment, umask, CPUs and timer slack over a Unix socket. The server forks; the
fork becomes `python -m MODULE ARGS` (its command line too: `ps` shows the task) and
the client waits for it, passes on the signals it gets (RADICAL's cancel) and ends
with its exit status. The client is still RADICAL's task process: its states,
profile and cancel are RADICAL's as before. Where the server is not there or serves
not this client (another user, Python, cgroup, nice value, resource limit, or a
variable Python or its libraries read when they start), the client becomes the task
itself (exec): a run never depends on it. A fork whose client dies is killed; the
server ends with the agent (its input closes), killing what it started.

Not MPI ranks: MPICH's launcher talks to each rank through a descriptor (PMI_FD) that
can be handed over, but with it handed over, 33 of 40 3-rank launches ended in
"Killed (signal 9)" from its proxy after every rank had finished (seen).
Standard library only at the top: the client must start in milliseconds.
"""
import json
import os
import signal
import socket
import struct
import sys

SERVER_RECORD = "trajflow-task-server.json"  # in the pilot's sandbox: where its socket is
# what a task's command line runs; only these modules are served
SERVED = ("trajflow.tasks.split", "trajflow.tasks.analyze", "trajflow.tasks.reduce",
          "trajflow.tasks.backend_part", "trajflow.tasks.task_server")
# imported once by the server (each where it can be: a missing one is the task's to import)
PREIMPORTED = ("ctypes", "setproctitle", "numpy", "h5py", "cloudpickle", "MDAnalysis", "MDAnalysis.analysis.base",
               "trajflow.tasks.split", "trajflow.tasks.analyze", "trajflow.tasks.reduce",
               "trajflow.tasks.backend_part", "trajflow.tasks.mda_analyses")
# variables read when Python or a preimported library starts: a client whose values
# differ from the server's is not served (its fork would run with the server's)
READ_AT_START = ("PYTHON", "OMP_", "OPENBLAS_", "MKL_", "NUMEXPR_", "HDF5_", "LD_",
                 "MDANALYSIS", "NUMBA_")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# the signals a client passes on to its task (a stopped task is continued after a
# terminating one, so that it ends)
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)
ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
DISABLE_ENV = "TRAJFLOW_TASK_SERVER"  # "0": a pilot's agent starts no server
_LENGTH = struct.Struct("!I")


# --- what a client and the server both describe -------------------------------------
def process_settings():
    """What a fork inherits from the server and cannot be given the client's: equal, or
    the client is not served."""
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
        "python": os.path.realpath(sys.executable), "cgroup": cgroup,
        "nice": os.getpriority(os.PRIO_PROCESS, 0), "limits": limits,
        "read_at_start": {k: v for k, v in os.environ.items() if k.startswith(READ_AT_START)}}))


def _send(sock, message, fds=()):
    data = json.dumps(message).encode()
    socket.send_fds(sock, [_LENGTH.pack(len(data)) + data], list(fds))


def _receive(sock, max_fds=0):
    """(message, fds), or (None, []) where the other side has gone."""
    data, fds = b"", []
    while len(data) < _LENGTH.size or len(data) < _LENGTH.size + _LENGTH.unpack(
            data[:_LENGTH.size])[0]:
        chunk, got, _, _ = socket.recv_fds(sock, 1 << 16, max_fds)
        fds += got
        if not chunk:
            for fd in fds:
                os.close(fd)
            return None, []
        data += chunk
    return json.loads(data[_LENGTH.size:]), fds


# --- the client: RADICAL's task process ----------------------------------------------
def run(module, args):
    """Be the task `python -m module args`: served by the pilot's server where it can
    be, else by exec."""
    sock = _connect()
    if sock is not None:
        signals = _SignalsPassedOn()  # from before the request: none is lost to a race
        request = {"module": module, "args": args, "cwd": os.getcwd(),
                   "env": dict(os.environ), "umask": _umask(),
                   "cpus": sorted(os.sched_getaffinity(0)),
                   "timer_slack": _timer_slack(), "settings": process_settings(),
                   "title": " ".join([sys.executable, "-m", module, *args])}
        try:
            _send(sock, request, (0, 1, 2))
            reply, _ = _receive(sock)
        except OSError:
            reply = None
        if reply is not None and "pid" in reply:
            _follow(sock, reply["pid"], signals)  # never returns
        sock.close()
        signals.take_back()  # one that came meanwhile ends this process as it would have
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


class _SignalsPassedOn:
    """The client's handlers of the signals it passes on to its task's process group;
    one that comes before the task's pid is known waits for it."""

    def __init__(self):
        self.pid, self.waiting = None, []
        for signum in PASSED_ON:
            signal.signal(signum, self._handle)

    def _handle(self, signum, _frame):
        if self.pid is None:
            self.waiting.append(signum)
        else:
            self._pass_on(signum)

    def _pass_on(self, signum):
        try:
            os.killpg(self.pid, signum)
            if signum in ENDING:  # a stopped task would not end
                os.killpg(self.pid, signal.SIGCONT)
        except OSError:
            pass

    def follow(self, pid):
        self.pid = pid
        for signum in self.waiting:
            self._pass_on(signum)

    def take_back(self):
        """The default handlers again, and the signals that came, raised on this process."""
        for signum in PASSED_ON:
            signal.signal(signum, signal.SIG_DFL)
        for signum in self.waiting:
            os.kill(os.getpid(), signum)


def _connect():
    """A connection to this node's server, or None: none runs here, or its socket is
    not this user's alone."""
    sandbox = os.environ.get("RP_PILOT_SANDBOX")
    if not sandbox or os.environ.get(DISABLE_ENV) == "0":
        return None
    try:
        with open(os.path.join(sandbox, SERVER_RECORD), encoding="utf-8") as fh:
            record = json.load(fh)
        path = record["socket"]
        if record.get("host") != socket.gethostname():
            return None
        folder = os.lstat(os.path.dirname(path))
        if folder.st_uid != os.getuid() or folder.st_mode & 0o077 \
                or os.lstat(path).st_uid != os.getuid():
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return sock
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _follow(sock, pid, signals):
    """Wait for the task's fork, pass signals on to it, end as it ended."""
    signals.follow(pid)
    try:
        import setproctitle
        setproctitle.setproctitle(f"trajflow task client (task process {pid})")
    except ImportError:
        pass
    try:
        reply, _ = _receive(sock)
    except OSError:
        reply = None
    status = reply.get("status") if reply else None
    if status is None:  # the server died: its fork was killed with it
        sys.stderr.write("trajflow: the pilot's task server ended before this task\n")
        os._exit(1)
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
    with open(log_path, "ab") as log:
        _SERVER.append(subprocess.Popen(
            [sys.executable, "-P", "-m", "trajflow.tasks.task_server", "serve",
             os.path.join(os.getcwd(), SERVER_RECORD)],
            stdin=subprocess.PIPE, stdout=log, stderr=log, close_fds=True))


def serve(record_path):
    """Serve forks of the task programs until the input closes."""
    import select
    import shutil
    import tempfile
    for name in THREAD_VARIABLES:  # the tasks' own (workflows/run/pipeline.py)
        os.environ.setdefault(name, "1")
    settings = _preimport()
    import setproctitle  # set up while this process' own environment is in place, so
    setproctitle.setproctitle(setproctitle.getproctitle())  # that a fork can retitle
    signal.signal(signal.SIGTERM, _end_on_signal)  # RADICAL ending the agent's group:
    signal.signal(signal.SIGHUP, _end_on_signal)   # the forks killed, the socket removed
    folder = tempfile.mkdtemp(prefix="trajflow-tasks-")  # only this user may enter
    path = os.path.join(folder, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    _write_record(record_path, {"socket": path, "host": socket.gethostname(),
                                "pid": os.getpid()})
    parent = os.getppid()
    forks = {}  # pidfd -> (pid, the client's connection)
    by_connection = {}  # connection -> pidfd
    try:
        while True:
            ready, _, _ = select.select([sys.stdin, listener, *forks, *by_connection],
                                        [], [], 1.0)
            if sys.stdin in ready and not os.read(sys.stdin.fileno(), 1 << 12) \
                    or os.getppid() != parent:  # the agent has ended
                return
            if listener in ready:
                _accept(listener, settings, forks, by_connection)
            for pidfd in [r for r in ready if isinstance(r, int)]:
                pid, conn = forks.pop(pidfd)
                del by_connection[conn]
                _, status = os.waitpid(pid, 0)
                os.close(pidfd)
                try:
                    _send(conn, {"status": status})
                except OSError:
                    pass
                conn.close()
            for conn in [r for r in ready if isinstance(r, socket.socket) and r is not listener]:
                if conn in by_connection and not conn.recv(1):  # its client has gone
                    _kill(forks[by_connection[conn]][0])
    finally:
        for pid, conn in forks.values():
            _kill(pid)
        try:
            os.unlink(record_path)
        except OSError:
            pass
        shutil.rmtree(folder, ignore_errors=True)


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
    return process_settings()


def _write_record(path, record):
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh)
    os.replace(tmp, path)


def _kill(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def refusal(request, settings, peer_uid):
    """Why this request is not served (None: it is)."""
    if peer_uid != os.getuid():
        return "another user's"
    if request.get("module") not in SERVED:
        return f"not a task program: {request.get('module')!r}"
    differ = sorted(k for k in settings if request["settings"].get(k) != settings[k])
    return f"its process differs: {', '.join(differ)}" if differ else None


def _accept(listener, settings, forks, by_connection):
    conn, _ = listener.accept()
    conn.settimeout(10)
    fds = []
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, peer_uid, _ = struct.unpack("3i", creds)
        request, fds = _receive(conn, max_fds=3)
        why = "no request" if request is None or len(fds) != 3 \
            else refusal(request, settings, peer_uid)
        if why is not None:
            print(f"not served: {why}", file=sys.stderr, flush=True)
            _send(conn, {"refused": why})
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            _become_task(request, fds, [listener, conn, *by_connection], list(forks))
        pidfd = os.pidfd_open(pid)
        forks[pidfd] = (pid, conn)
        by_connection[conn] = pidfd
        conn.settimeout(None)
        _send(conn, {"pid": pid})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"a request failed: {exc!r}", file=sys.stderr, flush=True)
        conn.close()
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _become_task(request, fds, sockets, pidfds):
    """In the fork: become `python -m MODULE ARGS` as the client would have run it,
    run it, and end as the interpreter would. Never returns."""
    code = 1
    try:
        for sock in sockets:
            sock.close()
        for fd in pidfds:
            os.close(fd)
        os.setpgid(0, 0)  # its own group: what it starts ends with it
        _die_with_server()
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        fds.clear()
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


def _die_with_server():
    """SIGKILL when the server dies (prctl PR_SET_PDEATHSIG): no fork outlives it."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _fresh_stdio():
    """sys.stdin/stdout/stderr on the client's descriptors, buffered as a new Python's."""
    import io
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(open(0, "rb", closefd=False))
    out = open(1, "wb", closefd=False)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(out, line_buffering=out.isatty())
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(open(2, "wb", closefd=False),
                                                   errors="backslashreplace",
                                                   line_buffering=True)


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
    on an uncaught KeyboardInterrupt)."""
    try:
        import atexit
        import threading
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code if 0 <= code < 256 else 1)


def probe():
    """What a served task sees (for tests and a look by hand)."""
    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                      "argv": sys.argv, "umask": _umask(),
                      "cpus": sorted(os.sched_getaffinity(0)),
                      "env": dict(os.environ), "pgid": os.getpgid(0),
                      "stdin": sys.stdin.read()}), flush=True)


def main(argv):
    if argv[:1] == ["serve"] and len(argv) == 2:
        serve(argv[1])
    elif argv[:1] == ["run"] and len(argv) >= 2:
        run(argv[1], argv[2:])
    elif argv == ["probe"]:
        probe()
    elif argv[:1] == ["sleep"] and len(argv) == 2:
        import time
        print(os.getpid(), flush=True)
        time.sleep(float(argv[1]))
    else:
        sys.exit("usage: python -m trajflow.tasks.task_server "
                 "(serve RECORD | run MODULE ARGS... | probe | sleep SECONDS)")


if __name__ == "__main__":
    main(sys.argv[1:])
