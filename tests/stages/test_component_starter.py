"""RADICAL's client processes started by fork from one warm Python
(tasks/component_starter.py): each start is the script RADICAL names, run
as __main__ with its arguments, folder and the caller's environment; its output
and exit code come back as ru.sh_callout gives them; the daemon it makes lives on;
what the starter cannot start is started as RADICAL starts it."""
import os
import sys
import time

import pytest

from trajflow.tasks import component_starter
from trajflow.tasks.component_starter import ForkedStarts, _UtilsWithForkedStarts

pytestmark = pytest.mark.timeout(60)

# a launcher as RADICAL's are: it daemonizes its work with radical.utils, waits until
# the daemon says it has started, and exits
LAUNCHER = """#!{python}
import os, sys, time
import multiprocessing as mp
import radical.utils as ru

def main(path, evt):
    import setproctitle
    setproctitle.setproctitle("rp.starter_test")  # as RADICAL names its processes
    evt.set()
    time.sleep(0.5)
    with open(path, "w") as fh:
        name = open("/proc/self/comm").read().strip()
        slack = open("/proc/self/timerslack_ns").read().strip()
        fh.write(f"{{os.getpid()}} {{os.getcwd()}} {{os.environ.get('STARTER_TEST', '-')}} {{name}} "
                 f"{{slack}}")
    time.sleep(3)  # alive while the test looks at it

if __name__ == "__main__":
    print("args", sys.argv[1:], "cwd", os.getcwd())
    print("said on stderr", file=sys.stderr)
    if sys.argv[1] == "fail":
        raise ValueError("a launcher that fails")
    if sys.argv[1] == "exit":
        sys.exit(3)
    if sys.argv[1] == "hang":
        time.sleep(60)
    evt = mp.Event()
    ru.daemonize(main=main, args=[sys.argv[2], evt], stdout="daemon.out", stderr="daemon.err")
    evt.wait(10)
    sys.exit(0)
"""


@pytest.fixture
def launcher(tmp_path):
    path = tmp_path / "bin" / "radical-pilot-bridge"
    path.parent.mkdir()
    path.write_text(LAUNCHER.format(python=sys.executable))
    path.chmod(0o755)
    return path


def _wait_for(path, timeout=10):
    deadline = time.time() + timeout
    while not path.exists() or not path.read_text():
        assert time.time() < deadline, f"{path} was never written"
        time.sleep(0.05)
    return path.read_text()


def test_a_start_is_the_script_in_the_callers_folder_and_environment(tmp_path, launcher,
                                                                    monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    starts = ForkedStarts()
    try:
        monkeypatch.setenv("STARTER_TEST", "first")
        out, err, rc = starts.start(str(launcher), ["ok", str(tmp_path / "d1")], str(work))
        assert rc == 0, err
        assert out == f"args ['ok', '{tmp_path / 'd1'}'] cwd {work}\n"
        assert err == "said on stderr\n"
        pid, cwd, env, name, _ = _wait_for(tmp_path / "d1").split()
        assert (cwd, env, name) == (str(work), "first", "rp.starter_test")
        assert open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0] == b"rp.starter_test"
        assert int(pid) != starts._process.pid  # the daemon is a process of its own
        # the environment is the caller's at each start, not the starter's
        monkeypatch.setenv("STARTER_TEST", "second")
        out, err, rc = starts.start(str(launcher), ["ok", str(tmp_path / "d2")], str(work))
        assert rc == 0 and _wait_for(tmp_path / "d2").split()[2] == "second"
        # a launcher's exit code and its traceback come back as a new Python's would
        out, err, rc = starts.start(str(launcher), ["exit"], str(work))
        assert rc == 3
        out, err, rc = starts.start(str(launcher), ["fail"], str(work))
        assert rc == 1 and "ValueError: a launcher that fails" in err
        # and the starter goes on serving after both, start after start (each daemon's
        # start is said back through a pipe the starter's own files once shadowed)
        for n in range(10):
            out, err, rc = starts.start(str(launcher), ["ok", str(tmp_path / f"e{n}")], str(work))
            assert rc == 0, err
        assert all(_wait_for(tmp_path / f"e{n}") for n in range(10))
    finally:
        starts.close()
    assert starts._process.returncode == 0, "the starter did not end with its input"


def test_a_start_that_hangs_fails_and_the_next_is_radicals_own(tmp_path, launcher,
                                                               monkeypatch):
    monkeypatch.setattr(component_starter, "START_TIMEOUT_S", 2.0)
    starts = ForkedStarts()
    try:
        out, err, rc = starts.start(str(launcher), ["hang"], str(tmp_path))
        assert rc == 1 and "did not answer within 2 s" in err
        assert starts.start(str(launcher), ["exit"], str(tmp_path)) is None  # not twice
    finally:
        starts.close()


class _FakeUtils:
    """radical.utils as far as sh_callout goes: records what it was asked."""

    def __init__(self):
        self.asked = []
        self.other = "ru's own"

    def sh_callout(self, cmd, stdout=True, stderr=True, shell=False, env=None, cwd=None):
        self.asked.append(cmd)
        return "", "", 0


def test_only_radicals_two_launchers_of_this_python_go_to_the_starter(tmp_path, launcher,
                                                                      monkeypatch):
    monkeypatch.setenv("PATH", f"{launcher.parent}{os.pathsep}{os.environ['PATH']}")
    ru = _FakeUtils()
    starts = ForkedStarts()
    try:
        utils = _UtilsWithForkedStarts(ru, starts)
        assert utils.other == "ru's own"
        out, err, rc = utils.sh_callout("radical-pilot-bridge exit", cwd=str(tmp_path))
        assert rc == 3 and ru.asked == []  # the starter ran it
        utils.sh_callout("echo radical-pilot-bridge", cwd=str(tmp_path))
        assert ru.asked == ["echo radical-pilot-bridge"]
        # another Python's script is not this one's to fork
        launcher.write_text(LAUNCHER.format(python="/usr/bin/python3"))
        utils.sh_callout("radical-pilot-bridge exit", cwd=str(tmp_path))
        assert ru.asked[-1] == "radical-pilot-bridge exit"
        # a starter that has gone: RADICAL's own start
        launcher.write_text(LAUNCHER.format(python=sys.executable))
        starts._process.kill()
        starts._process.wait()
        utils.sh_callout("radical-pilot-bridge exit", cwd=str(tmp_path))
        assert len(ru.asked) == 3
    finally:
        starts.close()


def test_forked_starts_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(component_starter.DISABLE_ENV, "0")
    monkeypatch.setattr(component_starter, "_ACTIVE", {})
    component_starter.use_forked_starts()
    assert component_starter._ACTIVE == {}


AGENT = """#!{python}
import os, sys
from radical.pilot.utils import component_manager
print(os.getpid(), sys.argv[1], type(component_manager.ru).__name__)
"""


def test_the_agent_runs_in_the_launchers_process_with_forked_starts(tmp_path):
    """trajflow.tasks.agent_start runs RADICAL's agent script found on the PATH in its
    own process (the pid the bootstrapper watches), with its arguments and forked
    starts on; any other command it is given is run as it is."""
    import subprocess
    folder = tmp_path / "bin"
    folder.mkdir()
    agent = folder / "radical-pilot-agent_0"
    agent.write_text(AGENT.format(python=sys.executable))
    agent.chmod(0o755)
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    process = subprocess.Popen([sys.executable, "-P", "-m", "trajflow.tasks.agent_start",
                                "radical-pilot-agent_0", "4242"], env=env, cwd=str(tmp_path),
                               stdout=subprocess.PIPE, text=True)
    out, _ = process.communicate(timeout=60)
    pid, ppid, utils = out.split()
    assert (int(pid), ppid, utils) == (process.pid, "4242", "_UtilsWithForkedStarts")
    said = subprocess.run([sys.executable, "-m", "trajflow.tasks.agent_start", "echo", "as is"],
                          capture_output=True, text=True, timeout=60)
    assert said.stdout == "as is\n"


SLACKED = """
import sys
from trajflow.tasks.placement import RADICAL_TIMER_SLACK_NS, set_timer_slack
from trajflow.tasks.component_starter import ForkedStarts
set_timer_slack(RADICAL_TIMER_SLACK_NS)  # as the process holding a pilot does
starts = ForkedStarts()
print(starts.start(sys.argv[1], ["ok", sys.argv[2]], sys.argv[3])[2])
starts.close()
"""


def test_radicals_processes_keep_the_timer_slack_of_the_process_holding_the_pilot(
        tmp_path, launcher):
    """The starter imports trajflow.tasks, whose import gives a task back the default
    timer slack: RADICAL's processes it forks keep the 10 ms they inherit (an idle pilot's
    wake-ups, 0.16 of a core with it, 0.5 without)."""
    import subprocess
    said = subprocess.run([sys.executable, "-c", SLACKED, str(launcher), str(tmp_path / "s"),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert said.stdout.strip() == "0", said
    assert _wait_for(tmp_path / "s").split()[4] == "10000000"


WAITS = """#!{python}
import signal, sys
term, interrupt = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
import radical.pilot.agent.scheduler.base as scheduler
import radical.utils, radical.utils.zmq.queue, radical.utils.zmq.pubsub
from radical.pilot.utils.component import BaseComponent
print(type(scheduler.time).__name__, "radical.pilot.agent.executing.popen" in sys.modules,
      term is signal.SIG_DFL, interrupt is signal.default_int_handler,
      radical.utils.zmq.queue.Queue.__name__, radical.utils.zmq.pubsub.PubSub.__name__,
      radical.utils.PWatcher._watch.__name__, BaseComponent.wait.__name__)
"""


QUIET = "HeldRequestsQueue WaitingPubSub watch_with_pidfds wait_until_stopped"


@pytest.mark.parametrize("agent,expected", [(True, "CappedSleeps False True True " + QUIET),
                                            (False, "module False True True " + QUIET)])
def test_only_the_agents_components_look_for_work_sooner(tmp_path, agent, expected):
    """The agent's starter caps its scheduler's idle sleeps (agent_waits.py) before it
    forks it; the client's starter leaves RADICAL's as they are. Both make their bridges
    the waiting ones (quiet_bridges.py). Neither imports RADICAL's
    executor module, whose import would give every process forked after it RADICAL's
    SIGTERM and SIGINT handlers (they do not end the process)."""
    script = tmp_path / "radical-pilot-component"
    script.write_text(WAITS.format(python=sys.executable))
    script.chmod(0o755)
    starts = ForkedStarts(agent=agent)
    try:
        out, err, rc = starts.start(str(script), [], str(tmp_path))
    finally:
        starts.close()
    assert (rc, out.strip()) == (0, expected), err
