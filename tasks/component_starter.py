"""RADICAL-Pilot's bridges and components started by fork from one Python that
has imported RADICAL once, instead of each as a new Python.

RADICAL-Pilot 1.103 starts every bridge and component of a session (its
client's, and its agent's in the pilot) one after the other through
ru.sh_callout of `radical-pilot-bridge` or `radical-pilot-component`, each a
new Python that imports radical.pilot first: a cold local run starts 14 in
the client and 16 in the agent, 0.25-0.5 s each (RADICAL's profiles), before
the first task can go. Here a starter process imports RADICAL once; each start
is a fork of it that runs the very script RADICAL would have run (runpy, its
arguments, its working folder and the caller's environment), so each process,
its name (`rp.<uid>`), its files and its process group are what RADICAL makes.
A start it cannot make (the script is another Python's, the starter has died)
is made as RADICAL makes it. What a Python reads only when it starts (PYTHON*
variables, its options) or RADICAL reads when imported (RADICAL_* debug and
ZMQ settings) is the starter's: the environment of the process that started it
(the one holding the pilot, or the agent), the same as its RADICAL processes'
save for what that process changed later.

`use_forked_starts()` is called once in the process holding the pilot (before
its RADICAL session exists) and in the agent (tasks/agent_start.py); the
starter ends with that process (its input closes) or with its process group.
Where TRAJFLOW_FORKED_STARTS=0, every start is RADICAL's own.
"""
import json
import logging
import os
import shlex
import select
import shutil
import subprocess
import sys
import tempfile
import threading

log = logging.getLogger(__name__)

SCRIPTS = ("radical-pilot-bridge", "radical-pilot-component")
# what RADICAL's two launchers import, imported once by the starter
PREIMPORTED = ("multiprocessing", "setproctitle", "radical.utils", "radical.pilot",
               "radical.pilot.messages")
# a launcher waits 30 s for its daemon to say it started; past this the starter is hung
START_TIMEOUT_S = 90.0
DISABLE_ENV = "TRAJFLOW_FORKED_STARTS"  # "0": every start a new Python, as RADICAL makes it
AGENT_FLAG = "--agent"  # the starter of a pilot's agent (agent_waits.py)


# --- the starter (a process of its own) ------------------------------------------
def serve(requests=None, replies=None, agent=False):
    """One request per line (JSON: script, args, cwd, env), one reply per line
    (rc, out, err), until the input closes. Single-threaded: a fork is safe.
    Its bridges are quiet_bridges.py's, which wait for messages, and its components
    and process watchers quiet_components.py's, which wait for their stop or a death.
    `agent`: the starter of a pilot's agent, whose components look for work sooner
    (agent_waits.py)."""
    requests = requests or sys.stdin.buffer
    replies = replies or sys.stdout.buffer
    from trajflow.tasks.placement import keep_inherited_placement
    keep_inherited_placement()  # RADICAL's processes, not tasks: their timer slack, CPUs
    import importlib
    for name in PREIMPORTED:
        importlib.import_module(name)
    from trajflow.tasks.quiet_bridges import make_quiet_bridges
    from trajflow.tasks.quiet_components import quiet_components
    make_quiet_bridges()  # its bridges wait for messages instead of polling
    quiet_components()  # its components for their stop, their watchers for a death
    if agent:
        from radical.pilot.utils.component import BaseComponent
        from trajflow.tasks.agent_waits import (see_task_exits_at_once, shorten_agent_waits,
                                                skip_empty_publishes)
        shorten_agent_waits()
        skip_empty_publishes(BaseComponent)
        see_task_exits_at_once()
    import setproctitle
    # set up here, while this process' own environment is in place: it finds the
    # memory of argv and environ then, and a fork whose environment has been
    # replaced could not (its `rp.<uid>` name would silently not be set; seen)
    setproctitle.setproctitle(setproctitle.getproctitle())
    for line in requests:
        request = json.loads(line)
        # plain descriptors: a file object here would be closed again by the forked
        # child's exit (this frame is below its SystemExit), by then another file's
        out_fd, err_fd = _scratch_file(), _scratch_file()
        pid = os.fork()
        if pid == 0:
            _run_script(request, out_fd, err_fd)
        _, status = os.waitpid(pid, 0)
        reply = {"rc": os.waitstatus_to_exitcode(status), "out": _read_back(out_fd),
                 "err": _read_back(err_fd)}
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def _scratch_file():
    fd, path = tempfile.mkstemp(prefix="trajflow-start-")
    os.unlink(path)
    return fd


def _read_back(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _run_script(request, out_fd, err_fd):
    """In the fork: become the script's process (its stdio, folder, environment,
    argv) and run it as __main__. Whatever ends it (its SystemExit, an exception)
    goes up and out of the starter's module, which catches nothing: the
    interpreter ends as a new one would (the traceback said on stderr, exit code
    1; its threads joined, its atexit handlers run, its output flushed)."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.closerange(3, 1 << 16)  # the starter's own files are not the script's
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    run_as_main(request["script"], request["args"])
    raise SystemExit(0)


def run_as_main(script, args):
    """Run `script` in this process as `python SCRIPT ARGS` would: its argv, its
    folder first on sys.path, as __main__."""
    import runpy
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
    runpy.run_path(script, run_name="__main__")


# --- the process holding the pilot -----------------------------------------------
class ForkedStarts:
    """The starter, seen from the process that asks it for starts."""

    def __init__(self, agent=False):
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            # -P: no folder of the caller's on its path (it imports for every start)
            [sys.executable, "-P", "-m", "trajflow.tasks.component_starter"]
            + ([AGENT_FLAG] if agent else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)

    def start(self, script, args, cwd):
        """(out, err, rc) as ru.sh_callout gives them; None where the starter had gone
        before it was asked (then RADICAL's own start). Once asked, never None: a
        start it may have made is not made twice (two bridges of one name)."""
        request = {"script": script, "args": args, "cwd": cwd or os.getcwd(),
                   "env": dict(os.environ)}
        with self._lock:
            if self._process.poll() is not None:
                return None
            try:
                self._process.stdin.write(json.dumps(request).encode() + b"\n")
                self._process.stdin.flush()
            except (OSError, ValueError):
                return None
            ready, _, _ = select.select([self._process.stdout], [], [], START_TIMEOUT_S)
            line = self._process.stdout.readline() if ready else b""
            if not line:
                self._process.kill()  # it hung or died: the next start is RADICAL's own
                self._process.wait()
                log.error("the forked start of %s %s did not answer within %.0f s",
                          os.path.basename(script), " ".join(args), START_TIMEOUT_S)
                return "", (f"trajflow's forked start of {os.path.basename(script)} did not "
                            f"answer within {START_TIMEOUT_S:.0f} s"), 1
        reply = json.loads(line)
        return reply["out"], reply["err"], reply["rc"]

    def close(self):
        """Its input closed, it ends (at once: it only waits for requests)."""
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class _UtilsWithForkedStarts:
    """radical.utils as RADICAL's ComponentManager sees it: sh_callout of a
    bridge or component start goes to the starter; everything else is ru's."""

    def __init__(self, ru, starts):
        self._ru = ru
        self._starts = starts

    def __getattr__(self, name):
        return getattr(self._ru, name)

    def sh_callout(self, cmd, stdout=True, stderr=True, shell=False, env=None, cwd=None):
        words = shlex.split(cmd) if isinstance(cmd, str) and not shell else None
        script = same_python_script(words[0]) if words and words[0] in SCRIPTS \
            and env is None and stdout and stderr else None
        if script is not None:
            said = self._starts.start(script, words[1:], cwd)
            if said is not None:
                return said
            log.debug("the forked starter has gone; %s starts as a new Python", words[0])
        return self._ru.sh_callout(cmd, stdout=stdout, stderr=stderr, shell=shell, env=env,
                                   cwd=cwd)


def same_python_script(name):
    """The script's path where it is a Python script of this very interpreter
    (its first line names it), else None: a fork of this Python would not be it."""
    path = shutil.which(name)
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            first = fh.readline(4096).decode(errors="replace")
    except OSError:
        return None
    interpreter = first[2:].strip().split()[0] if first.startswith("#!") and first[2:].strip() \
        else ""
    # this very Python: the same binary in the same folder (a virtualenv's python links
    # to its base Python, which another virtualenv's links to as well)
    same = interpreter and all(
        os.path.realpath(a) == os.path.realpath(b) for a, b in (
            (interpreter, sys.executable),
            (os.path.dirname(interpreter), os.path.dirname(sys.executable))))
    return path if same else None


_ACTIVE = {}  # pid -> its ForkedStarts (a forked process makes its own)


def use_forked_starts(agent=False):
    """From now on, RADICAL's bridges and components started by this process (its
    client's, or the agent's: `agent`) start by fork from one starter, and their
    bridges and the client's proxy's wait for messages (quiet_bridges.py). Once per
    process; not where TRAJFLOW_FORKED_STARTS=0 or where RADICAL's ComponentManager is
    not what this expects."""
    if os.getpid() in _ACTIVE or os.environ.get(DISABLE_ENV) == "0":
        return
    try:
        from radical.pilot.utils import component_manager
    except ImportError:
        return
    ru = component_manager.ru
    if isinstance(ru, _UtilsWithForkedStarts):  # made by the process this one forked from
        ru = ru._ru
    if not callable(getattr(ru, "sh_callout", None)):
        return
    starts = ForkedStarts(agent)
    _ACTIVE[os.getpid()] = starts
    component_manager.ru = _UtilsWithForkedStarts(ru, starts)
    if not agent:
        from trajflow.tasks.quiet_bridges import quiet_proxy_bridges
        quiet_proxy_bridges()  # the client's proxy's bridges wait as the starter's do


if __name__ == "__main__":
    serve(agent=sys.argv[1:] == [AGENT_FLAG])
