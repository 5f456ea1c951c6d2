"""A pilot's single-core tasks started by fork from its task server (tasks/task_server.py):
a served task is the process a new Python would have been (its input and output,
folder, environment, umask, CPUs, command line, exit status), its client passes signals
on and a task whose client dies is killed; a client the server may not serve, or whose
server is not safe to reach, runs the task itself; the server ends with its input,
removing what it made."""
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from trajflow.tasks import task_server
from trajflow.tasks.modes import TaskSpec
from trajflow.workflows.run.entk_client import is_task_of_session
from trajflow.workflows.run.pipeline import ServedTaskCommand, TaskCommand

pytestmark = pytest.mark.timeout(120)
SERVER = "trajflow.tasks.task_server"


def start_server(sandbox):
    """A server whose record is in `sandbox` (the pilot's sandbox of its clients)."""
    record = sandbox / task_server.SERVER_RECORD
    proc = subprocess.Popen([sys.executable, "-P", "-m", SERVER, "serve", str(record)],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not record.exists() and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    assert record.exists(), "the server never wrote its record"
    proc.record = record
    return proc


@pytest.fixture
def server(tmp_path):
    proc = start_server(tmp_path)
    yield proc
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(30)


def client_env(sandbox, **extra):
    env = {**os.environ, "RP_PILOT_SANDBOX": str(sandbox), "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}
    env.pop(task_server.DISABLE_ENV, None)
    return env


def served(args, sandbox, **kw):
    return [sys.executable, "-m", SERVER, "run", SERVER, *args]


def run_client(args, sandbox, extra_env=None, **kw):
    return subprocess.run(served(args, sandbox), env=client_env(sandbox, **(extra_env or {})),
                          capture_output=True, text=True, timeout=60, **kw)


def test_a_served_task_is_the_process_a_new_python_would_be(server, tmp_path):
    work = tmp_path / "task"
    work.mkdir()
    done = run_client(["probe"], tmp_path, {"A_VARIABLE": "its value"}, cwd=work,
                      input="its input\n", preexec_fn=lambda: os.umask(0o027))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["ppid"] == server.pid  # a fork of the server, not a new Python
    assert seen["pgid"] == seen["pid"]  # a group of its own: what it starts ends with it
    assert seen["cwd"] == str(work) and seen["umask"] == 0o027
    assert seen["stdin"] == "its input\n" and seen["env"]["A_VARIABLE"] == "its value"
    assert seen["argv"][1:] == ["probe"] and seen["cpus"] == sorted(os.sched_getaffinity(0))
    assert done.stderr == ""


def test_its_command_line_is_the_tasks_and_its_client_says_which_it_follows(server, tmp_path):
    client = subprocess.Popen(served(["sleep", "30"], tmp_path), env=client_env(tmp_path),
                              stdout=subprocess.PIPE, text=True)
    try:
        task = int(client.stdout.readline())
        assert task != client.pid
        with open(f"/proc/{task}/cmdline", "rb") as fh:
            assert b"-m trajflow.tasks.task_server sleep 30" in fh.read()
        with open(f"/proc/{client.pid}/cmdline", "rb") as fh:
            assert fh.read().startswith(f"trajflow task client (task process {task})".encode())
    finally:
        client.kill()
        client.wait()


def test_exit_code_and_output_are_a_new_pythons(server, tmp_path):
    bad_plan = ["-m", "trajflow.tasks.reduce", "--plan", str(tmp_path / "missing.json")]
    cold = subprocess.run([sys.executable] + bad_plan, capture_output=True, text=True,
                          timeout=60, env=client_env(tmp_path))
    warm = subprocess.run([sys.executable, "-m", SERVER, "run"] + bad_plan[1:],
                          capture_output=True, text=True, timeout=60, env=client_env(tmp_path))
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout) and cold.returncode
    assert warm.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]
    assert "missing.json: cannot be read" in warm.stderr


def _started(tmp_path):
    client = subprocess.Popen(served(["sleep", "60"], tmp_path), env=client_env(tmp_path),
                              stdout=subprocess.PIPE, text=True)
    return client, int(client.stdout.readline())


def _gone(pid, within_s=10):
    deadline = time.time() + within_s
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_client_ends_the_task_and_the_client_as_it(server, tmp_path, signum):
    client, task = _started(tmp_path)
    client.send_signal(signum)
    assert client.wait(30) == -signum
    assert _gone(task)


def test_a_stopped_task_is_ended_by_its_clients_sigterm(server, tmp_path):
    client, task = _started(tmp_path)
    os.kill(task, signal.SIGSTOP)
    client.send_signal(signal.SIGTERM)
    assert client.wait(30) == -signal.SIGTERM
    assert _gone(task)


def test_a_task_whose_client_is_killed_is_killed(server, tmp_path):
    client, task = _started(tmp_path)
    client.kill()
    client.wait(30)
    assert _gone(task)


def test_a_client_with_another_resource_limit_runs_the_task_itself(server, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    done = run_client(["probe"], tmp_path, input="",
                      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                            (min(soft, 512) - 1, hard)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ppid"] == os.getpid()  # exec'd: the client's own pid
    server.stdin.close()
    server.wait(30)
    assert "not served: its process differs: limits" in server.stderr.read().decode()


def test_a_server_whose_socket_others_may_reach_is_not_used(server, tmp_path):
    folder = json.loads(server.record.read_text())["folder"]
    os.chmod(folder, 0o755)
    done = run_client(["probe"], tmp_path, input="")
    assert json.loads(done.stdout)["ppid"] == os.getpid()


def test_without_a_server_the_client_runs_the_task_itself(tmp_path):
    done = run_client(["probe"], tmp_path, input="")
    assert done.returncode == 0 and json.loads(done.stdout)["ppid"] == os.getpid()


def test_the_server_ends_with_its_input_and_leaves_nothing(server, tmp_path):
    client, task = _started(tmp_path)
    folder = json.loads(server.record.read_text())["folder"]
    server.stdin.close()
    assert server.wait(30) == 0
    assert _gone(task)
    assert client.wait(30) == 1  # told that its task ended with the server
    assert not server.record.exists() and not os.path.exists(folder)


def test_a_signal_ignored_by_the_client_is_ignored_by_its_task(server, tmp_path):
    """RADICAL starts a task in the background of a shell: SIGINT and SIGQUIT ignored."""
    def ignore():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    served_run = run_client(["signals"], tmp_path, preexec_fn=ignore)
    own = subprocess.run([sys.executable, "-m", SERVER, "signals"], capture_output=True,
                         text=True, timeout=60, preexec_fn=ignore)
    assert json.loads(served_run.stdout) == json.loads(own.stdout)
    assert json.loads(own.stdout)[str(int(signal.SIGINT))] == "ignored"
    assert json.loads(own.stdout)[str(int(signal.SIGTERM))] == "default"


def test_a_client_that_sends_nothing_or_nonsense_leaves_the_server_serving(server, tmp_path):
    folder = json.loads(server.record.read_text())["folder"]
    for payload in (b"", b"\x00\x00\x00\x02[]", b"\xff\xff\xff\xff"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(os.path.join(folder, task_server.SOCKET))
        sock.sendall(payload)
        sock.close()
    done = run_client(["probe"], tmp_path, input="")
    assert json.loads(done.stdout)["ppid"] == server.pid


def test_a_served_task_is_known_as_a_task_of_its_pilots_session(tmp_path):
    """A fork's environment, as /proc shows it, is the server's: it is known by its
    server, whose command line names the pilot's sandbox."""
    sandbox = tmp_path / "re.session.served" / "pilot.0000"
    sandbox.mkdir(parents=True)
    proc = start_server(sandbox)
    try:
        client, task = _started(sandbox)
        assert is_task_of_session(task, "re.session.served")
        assert not is_task_of_session(task, "re.session.other")
        assert not is_task_of_session(proc.pid, "re.session.served")
        client.kill()
        client.wait(30)
    finally:
        proc.stdin.close()
        proc.wait(30)


def test_two_messages_that_arrive_together_are_read_one_by_one():
    a, b = socket.socketpair()
    task_server._send(a, {"pid": 1})
    task_server._send(a, {"status": 0})
    time.sleep(0.1)
    messages = task_server._Messages(b)
    assert messages.receive()[0] == {"pid": 1} and messages.receive()[0] == {"status": 0}
    a.close()
    assert messages.receive() == (None, [])


def test_only_this_users_task_programs_are_served():
    settings = task_server.process_settings()
    mine = {"module": "trajflow.tasks.analyze", "settings": settings}
    assert task_server.refusal(mine, settings, os.getuid()) is None
    assert task_server.refusal(mine, settings, os.getuid() + 1) == "another user's"
    assert "not a task program" in task_server.refusal({**mine, "module": "os"}, settings,
                                                       os.getuid())
    assert task_server.refusal([], settings, os.getuid()) == "not a request"
    other = {**settings, "read_at_start": {**settings["read_at_start"], "PYTHONPATH": "/x"}}
    assert task_server.refusal({**mine, "settings": other}, settings, os.getuid()) \
        == "its process differs: read_at_start"


def test_served_task_commands_serve_single_cores_and_mpi_ranks_alike():
    single = TaskSpec("reduce", "trajflow.tasks.reduce", ["--plan", "p.json"])
    ranks = TaskSpec("analyze", "trajflow.tasks.analyze", ["--plan", "p.json"], 2, True)
    other = TaskSpec("x", "somewhere.else", ["--plan", "p.json"])
    assert ServedTaskCommand("py").arguments(single) == [
        "-m", SERVER, "run", "trajflow.tasks.reduce", "--plan", "p.json"]
    assert ServedTaskCommand("py").arguments(ranks) == [
        "-m", SERVER, "run", "trajflow.tasks.analyze", "--plan", "p.json"]
    assert ServedTaskCommand("py").arguments(other) == TaskCommand("py").arguments(other) \
        == ["-m", "somewhere.else", "--plan", "p.json"]


@pytest.mark.timeout(240)
def test_mpi_ranks_are_served_and_end_as_their_launcher_expects(server, tmp_path):
    """Each rank hands the server MPICH's connection to its proxy (PMI_FD) with its stdio;
    the forks are finalized and end through libc's exit(), so the proxy hears each one's
    "finalize" (ended by os._exit, 33 of 40 such launches were SIGKILLed by the proxy)."""
    for ranks in (2, 3, 4, 3, 2, 3):
        done = subprocess.run(["mpiexec", "-n", str(ranks)] + served(["mpi-probe"], tmp_path),
                              env=client_env(tmp_path), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        # (hydra forwards the ranks' lines as they come: two may share a line)
        seen = sorted((json.loads(m) for m in re.findall(r"\{[^{}]*\}", done.stdout)),
                      key=lambda s: s["rank"])
        assert [s["rank"] for s in seen] == list(range(ranks))
        assert {(s["size"], s["sum"]) for s in seen} == {(ranks, ranks * (ranks - 1) // 2)}
        assert {s["ppid"] for s in seen} == {server.pid}  # forks of the server, each one
        assert "Killed" not in done.stdout + done.stderr


FORK_AFTER_PRINTF = """
import ctypes, os, sys
from trajflow.tasks.task_server import flush_before_fork
libc = ctypes.CDLL(None)
libc.printf(b"held by C stdio\\n")  # stdout is a pipe: fully buffered, not yet written
if sys.argv[1] == "flush":
    flush_before_fork()
pid = os.fork()
if pid == 0:
    libc.exit(0)  # as a served task ends after MPI: libc's exit flushes its buffers
os.waitpid(pid, 0)
libc.exit(0)
"""


@pytest.mark.parametrize("flush,copies", [("flush", 1), ("no", 2)])
def test_what_c_stdio_held_before_a_fork_is_written_once(flush, copies):
    # (PYTHONUNBUFFERED, set in some shells, makes C's stdout unbuffered too)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    out = subprocess.run([sys.executable, "-c", FORK_AFTER_PRINTF, flush], capture_output=True,
                         text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("held by C stdio") == copies, out.stdout
