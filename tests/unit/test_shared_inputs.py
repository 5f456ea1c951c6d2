"""What reaches ssh, a batch script or the outcome of a run from files others wrote (issue 42)."""
import json
import os
import subprocess
import sys

import pytest

from trajflow.tasks import rundir
from trajflow.workflows.errors import InputError


@pytest.mark.parametrize("target", ["-oProxyCommand=touch /tmp/x", "me@-oProxyCommand=x",
                                    "host\nrm -rf ~", "me@host:port", "", "host name",
                                    "me@host:22 -v"])
def test_a_destination_ssh_would_take_for_an_option_or_a_command_is_refused(target):
    from trajflow.workflows.remote.client import parse_destination
    with pytest.raises(InputError, match=r"\[user@\]host\[:port\]"):
        parse_destination(target)


def test_ssh_gets_the_destination_after_a_double_dash(monkeypatch, tmp_path):
    from trajflow.workflows.remote import client
    monkeypatch.setattr(client.tempfile, "gettempdir", lambda: str(tmp_path))
    conn = client.Connection("me@cluster.example.org:2222", "/venv/bin/python")
    seen = {}

    def fake_run(argv, **kw):
        seen["argv"] = argv
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(client.subprocess, "run", fake_run)
    conn.run(["echo", "hi"])
    argv = seen["argv"]
    assert argv[argv.index("--") + 1] == "me@cluster.example.org"
    assert argv[-1] == "echo hi" and ["-p", "2222"] == argv[argv.index("-p"):argv.index("-p") + 2]


def test_the_control_folder_is_the_users_alone(monkeypatch, tmp_path):
    from trajflow.workflows.remote import client
    monkeypatch.setattr(client.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = client.control_folder()
    assert os.stat(folder).st_mode & 0o777 == 0o700
    os.chmod(folder, 0o777)  # made by someone else, open to all
    with pytest.raises(InputError, match="not yours alone"):
        client.control_folder()
    os.rmdir(folder)
    os.symlink(tmp_path, folder)  # a link planted at its name
    with pytest.raises(InputError, match="not a folder"):
        client.control_folder()
    if os.getuid() == 0:  # another user's folder, mode 0700
        os.remove(folder)
        os.mkdir(folder, 0o700)
        os.chown(folder, 65534, 65534)
        with pytest.raises(InputError, match="owner uid 65534"):
            client.control_folder()


@pytest.mark.parametrize("record", [
    [], {"target": "-oProxyCommand=x", "python": "/p", "remote_dir": "/r"},
    {"target": "h", "python": "/p"}, {"target": "h", "python": "/p", "remote_dir": "r"},
    {"target": "h", "python": "/p\nrm -rf ~", "remote_dir": "/r"},
    {"target": "h", "python": "/p", "remote_dir": "/r", "extra": 1},
    {"target": "h", "python": "/p", "remote_dir": "/r", "client_pid": "12"}])
def test_a_remote_record_that_is_not_trajflows_is_refused(tmp_path, record):
    from trajflow.workflows.remote.client import RemoteRun
    (tmp_path / rundir.REMOTE).write_text(json.dumps(record))
    with pytest.raises(InputError, match=rundir.REMOTE):
        RemoteRun(str(tmp_path))


def test_a_newline_never_reaches_the_batch_script(tmp_path):
    """A newline in --out once ended the script's `#` comment: the next line ran."""
    from trajflow.workflows.cli.remote_side import batch_job
    from trajflow.workflows.run.spec import PilotSpec, RunSpec

    class Plan:
        workdir = str(tmp_path / "run\ntouch /tmp/pwned")
        mode, analyze_ranks, n_blocks = "mpi", 2, 2

    with pytest.raises(InputError, match="newline|'\\\\n'"):
        batch_job(Plan(), PilotSpec(cpus=2), "{}")
    with pytest.raises(InputError, match="'\\\\n'"):
        RunSpec(out="run\ntouch /tmp/pwned")
    with pytest.raises(InputError, match="'\\\\x00'"):
        RunSpec(topology="a\0b")


def write_campaign(path, factors, repeats=1):
    path.write_text(f"""
[campaign]
analysis = "rmsd"
repeats = {repeats}
[input]
topology = "{sys.executable}"
trajectory = ["{sys.executable}"]
[resources."local.localhost"]
cpus = 2
walltime = 10
[factors]
{factors}
""")
    return str(path)


def test_a_campaign_of_a_million_experiments_needs_yes(tmp_path):
    from trajflow.workflows.campaign.spec import load_campaign, MAX_EXPERIMENTS
    ranks = ", ".join(str(i) for i in range(1, 1001))
    path = write_campaign(tmp_path / "big.toml", f"ranks = [{ranks}]", repeats=1000)
    with pytest.raises(InputError, match="1,000,000 experiments.*--yes"):
        load_campaign(path)
    assert MAX_EXPERIMENTS == 10_000


@pytest.mark.parametrize("content", [b"[campaign]\nname = \"\xff\xfe\"\n",
                                     b"x = " + b"[" * 50_000 + b"]" * 50_000,
                                     b"[campaign\n"])
def test_a_campaign_file_that_is_not_toml_text_is_one_line(tmp_path, content):
    from trajflow.workflows.campaign.spec import load_campaign
    path = tmp_path / "c.toml"
    path.write_bytes(content)
    with pytest.raises(InputError) as err:
        load_campaign(str(path))
    assert "\n" not in str(err.value).strip()


def test_a_run_handed_over_says_interrupted_once_its_holder_is_gone(tmp_path):
    """Interrupted at any moment, a run folder says so: the provisional outcome is 'not
    ended' while the lock's holder lives, a failure once it is gone, and a whole result
    still counts."""
    from trajflow.workflows.run.rundir_lock import RunLock
    d = str(tmp_path)
    rundir.record_outcome(d, "failed", "the first attempt failed")
    rundir.begin_attempt(d)
    lock = RunLock(d).acquire()
    rundir.record_handed_over(d)
    assert rundir.read_outcome(d) is None  # the lock is held: the run goes on
    lock.release()
    # a pid of this host that is gone: the lock's own word says nothing of a live run
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / rundir.LOCK).write_text(f"host {os.uname().nodename} pid {gone.pid}\n")
    held_elsewhere = subprocess.Popen(  # the run's process that inherited the lock holds it
        [sys.executable, "-c", "import fcntl, os, sys, time; "
         "fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_EX); "
         "print('held', flush=True); time.sleep(30)", os.path.join(d, rundir.LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert held_elsewhere.stdout.readline().strip() == "held"
        assert rundir.read_outcome(d) is None
    finally:
        held_elsewhere.kill()
        held_elsewhere.wait()
    (tmp_path / rundir.LOCK).write_text("host a-login-node pid 7\n")
    assert rundir.read_outcome(d) is None  # another node's: flock may not reach across
    (tmp_path / rundir.LOCK).write_text(f"host {os.uname().nodename} pid {gone.pid}\n")
    outcome = rundir.read_outcome(d)
    assert outcome["status"] == "failed" and outcome["error"] == rundir.INTERRUPTED
    assert not rundir.outcome_said(d)
    rundir.begin_attempt(d)  # resumed: the interruption is kept as an earlier attempt
    rundir.record_outcome(d, "done")
    assert [e["error"] for e in rundir.read_outcome(d)["earlier"]] == [
        "the first attempt failed", rundir.INTERRUPTED]  # the failure before it kept too
    other = tmp_path / "cancelled"
    other.mkdir()
    rundir.record_outcome(str(other), "failed", "it failed")
    rundir.begin_attempt(str(other))
    rundir.record_handed_over(str(other))
    rundir.withdraw_handover(str(other))  # cancelled before it began: the failure comes back
    assert rundir.read_outcome(str(other))["error"] == "it failed"
    rundir.record_handed_over(d)
    (tmp_path / rundir.RESULT).write_bytes(b"")
    assert rundir.read_outcome(d) is None  # the result was whole before it could say
    os.remove(tmp_path / rundir.RESULT)
    (tmp_path / rundir.REMOTE).write_text("{}")
    assert rundir.read_outcome(d) is None  # a fetched remote run: the cluster says


def test_a_temporary_name_is_new_and_never_a_link(tmp_path):
    final = str(tmp_path / "x.json")
    names = {rundir.temporary_name(final) for _ in range(50)}
    assert len(names) == 50
    assert all(os.path.isfile(n) and not os.path.islink(n) for n in names)
