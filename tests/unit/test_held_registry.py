"""Where held pilots are found, without a pilot: names, the private folder's checks,
the socket reached through the folder's descriptor, one message per line, stale
records, and a fake holder that answers the client's requests."""
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from trajflow.workflows.errors import InputError
from trajflow.workflows.run import held_client, held_registry as reg


@pytest.fixture
def pilots(tmp_path, monkeypatch):
    root = tmp_path / ("a-long-folder-name-" * 6) / "pilots"  # past a socket path's 107 bytes
    monkeypatch.setenv(reg.PILOTS_ENV, str(root))
    return root


@pytest.mark.parametrize("name", ["a", "adk-2", "x.y_z", "A" * 64])
def test_good_names(name):
    assert reg.check_name(name) == name


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a/b", "a b", "A" * 65, "é", None,
                                  "-x", "a\n"])
def test_bad_names_are_refused(name):
    with pytest.raises(InputError, match="pilot name"):
        reg.check_name(name)


def test_the_folder_is_made_private_and_checked(pilots):
    root = reg.pilots_root()
    assert root == str(pilots) and oct(os.stat(root).st_mode & 0o777) == "0o700"
    os.chmod(root, 0o750)
    with pytest.raises(InputError, match="open to others.*chmod 700"):
        reg.pilots_root()
    os.chmod(root, 0o700)
    os.chown(root, 65534, 65534)
    try:
        with pytest.raises(InputError, match="belongs to user id 65534"):
            reg.pilots_root()
    finally:
        os.chown(root, os.getuid(), os.getgid())
    os.rmdir(root)
    other = pilots.parent / "elsewhere"
    other.mkdir(mode=0o700)
    os.symlink(other, root)
    with pytest.raises(InputError, match="not a plain folder"):
        reg.pilots_root()


def test_a_socket_past_107_bytes_is_reached_through_the_folder(pilots):
    folder = reg.pilot_folder("p")
    os.mkdir(folder, 0o700)
    assert len(os.path.join(folder, reg.SOCKET)) > 107
    server = reg.listen(folder)
    assert oct(os.stat(os.path.join(folder, reg.SOCKET)).st_mode & 0o777) == "0o600"
    client = reg.connect(folder)
    conn, _ = server.accept()
    reg.send(client, {"op": "status"})
    assert reg.Messages(conn).receive() == {"op": "status"}
    for s in (client, conn, server):
        s.close()
    with pytest.raises(ConnectionRefusedError):
        reg.connect(folder)  # nobody listens: refused at once, never waited on


def test_messages_are_one_json_object_per_line(tmp_path):
    a, b = socket.socketpair()
    messages = reg.Messages(b)
    a.sendall(b'[1, 2]\n')
    with pytest.raises(ValueError, match="not a JSON object"):
        messages.receive()
    def write_long():  # more than a socket's buffer holds; cut off when refused
        try:
            a.sendall(b"x" * (reg.MAX_MESSAGE_BYTES + 10) + b"\n")
        except OSError:
            pass
    writer = threading.Thread(target=write_long, daemon=True)
    writer.start()
    with pytest.raises(ValueError, match="too long"):
        messages.receive()
    b.close()
    writer.join(10)
    a.close()
    a, b = socket.socketpair()
    a.close()
    with pytest.raises(EOFError):
        reg.Messages(b).receive()


def test_a_record_is_data_checked_field_by_field(pilots):
    folder = reg.pilot_folder("r")
    os.mkdir(folder, 0o700)
    good = {"name": "r", "pid": 1, "state": "active", "started": 1.0, "resource": "x",
            "cpus": 2, "walltime": 30, "idle_timeout": 60.0, "session_dir": None, "error": None}
    reg.write_record(folder, good)
    assert reg.read_record(folder) == good
    for bad in ({**good, "pid": "1"}, {**good, "state": "odd"}, {**good, "cpus": True}, [1]):
        reg.write_record(folder, bad)
        assert reg.read_record(folder) is None
    os.remove(os.path.join(folder, reg.RECORD))
    os.mkfifo(os.path.join(folder, reg.RECORD))  # a FIFO would hang a plain read
    assert reg.read_record(folder) is None


def test_a_dead_holder_is_stale_and_removed_by_the_next_command(pilots):
    folder = reg.pilot_folder("gone")
    os.mkdir(folder, 0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    reg.write_record(folder, {"name": "gone", "pid": dead.pid, "state": "active", "started": 1.0,
                              "resource": "local.localhost", "cpus": 1, "walltime": 5,
                              "idle_timeout": 0, "session_dir": None, "error": None})
    server = reg.listen(folder)
    server.close()  # the socket file stays, as a killed holder leaves it
    assert reg.is_stale(folder)
    with pytest.raises(InputError, match="'gone' has ended"):
        held_client.held_status("gone")
    assert not os.path.exists(folder)
    assert held_client.list_held() == []
    # another program at a recorded pid is not a holder
    assert not reg.holder_alive(os.getpid())


def test_a_pilot_held_on_another_login_node_is_never_removed_from_here(pilots):
    """A home folder shared by a cluster's login nodes: a holder on another host does
    not answer this one's socket and is not in this /proc; its folder stays, and the
    refusal names the host to ask."""
    folder = reg.pilot_folder("there")
    os.mkdir(folder, 0o700)
    dead_here = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_here.wait()
    reg.write_record(folder, {"name": "there", "pid": dead_here.pid, "state": "active",
                              "started": 1.0, "resource": "local.localhost", "cpus": 1,
                              "walltime": 5, "idle_timeout": 0, "session_dir": None,
                              "error": None, "host": "login-7.other"})
    reg.listen(folder).close()
    assert not reg.is_stale(folder)
    with pytest.raises(InputError, match="held on login-7.other, not on this host .*"
                                         "--remote USER@login-7.other"):
        held_client.held_status("there")
    assert os.path.isdir(folder)
    assert [s["name"] for s in held_client.list_held()] == ["there"]
    assert os.path.isdir(folder)


def test_the_client_asks_a_holder_and_refusals_say_what_to_do(pilots):
    """A fake holder answering status on the real socket: the client's side."""
    folder = reg.pilot_folder("fake")
    os.mkdir(folder, 0o700)
    server = reg.listen(folder)
    answer = {"name": "fake", "state": "active", "resource": "local.localhost", "cpus": 3,
              "walltime": 10, "walltime_left_s": 120.0, "idle_s": 5.0, "idle_timeout_s": 60.0,
              "session_dir": "/s", "error": None, "running": 1, "queued": 2, "busy_cores": 2,
              "pid": os.getpid()}

    def serve():
        for _ in range(2):
            conn, _ = server.accept()
            reg.Messages(conn).receive()
            reg.send(conn, answer)
            conn.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert held_client.held_status("fake") == answer
    pilot = held_client.HeldPilot("fake", progress=False)
    assert (pilot.cpus, pilot.resource, pilot.session_dir) == (3, "local.localhost", "/s")
    thread.join(5)
    server.close()
    with pytest.raises(InputError, match="no pilot named 'other' is held.*trajflow pilot list"):
        held_client.held_status("other")
    line = __import__("trajflow.workflows.cli.commands", fromlist=["x"])._held_line(answer)
    assert line.startswith("fake: active on local.localhost, 2 of 3 cores busy, 1 run(s) "
                           "running, 2 queued, 2.0 min of walltime left")


def test_a_holders_request_is_checked(tmp_path):
    from trajflow.workflows.run.held_holder import _run_message, HeldRequest
    with pytest.raises(InputError, match="absolute path"):
        _run_message({"plan": "relative/plan.json"})
    with pytest.raises(InputError, match="true or false"):
        _run_message({"plan": "/p/plan.json", "resume": "yes"})
    with pytest.raises(InputError, match="not a held pilot's start request"):
        HeldRequest.from_dict({"name": "x", "pilot": "local.localhost"})
    request = HeldRequest.from_dict(json.loads(json.dumps(
        {"name": "x", "pilot": {"resource": "local.localhost", "cpus": 1}, "idle_timeout_s": 60})))
    assert request.pilot.cpus == 1 and request.idle_timeout_s == 60.0


def test_a_run_the_holder_plans_is_a_built_in_one_and_a_refusal_leaves_nothing(pilots,
                                                                               tmp_path):
    """The holder plans only trajflow's own analyses (a user's code is never imported
    there), an older holder plans none, and a run it refuses or breaks off leaves no
    folder behind (a fake holder on the real socket)."""
    from trajflow.workflows.run.held_holder import _run_message, receive_first
    from trajflow.workflows.run.spec import RunSpec
    spec = {"out": "/o", "topology": "/t.psf", "analysis": "mine.py:f"}
    with pytest.raises(InputError, match="built-in analyses only"):
        _run_message({"spec": spec, "asked_at": 1.0})
    assert _run_message({"spec": dict(spec, analysis="rmsd"), "asked_at": 1.0})["spec"]
    builtin = RunSpec(topology="t.psf", trajectory=["t.dcd"], analysis="rmsd")
    assert held_client.can_plan_there(builtin, {"plans_runs": True})
    assert not held_client.can_plan_there(builtin, {"cpus": 2})  # an older holder
    assert not held_client.can_plan_there(RunSpec(topology="t.psf", trajectory=["t.dcd"],
                                                  analysis="mine.py:f"))
    assert not held_client.can_plan_there(RunSpec(trajectory=["t.dcd"], analysis="rmsd"))

    folder = reg.pilot_folder("fake")
    os.mkdir(folder, 0o700)
    server = reg.listen(folder)
    status = {"name": "fake", "state": "active", "resource": "local.localhost", "cpus": 2,
              "walltime": 10, "session_dir": "/s", "plans_runs": True}
    got = []

    def serve(answers):
        conn, _ = server.accept()  # the client's status request
        reg.Messages(conn).receive()
        reg.send(conn, status)
        conn.close()
        for answer in answers:
            conn, _ = server.accept()
            message, lock_fd = receive_first(conn)
            got.append((message, lock_fd is not None))
            os.close(lock_fd)
            if answer is not None:
                reg.send(conn, answer)
            conn.close()
    thread = threading.Thread(target=serve, args=([{"invalid": "--select 'x' matches 0 atoms"},
                                                    None],), daemon=True)
    thread.start()
    pilot = held_client.HeldPilot("fake", progress=False)
    run = RunSpec(topology="t.psf", trajectory=["t.dcd"], analysis="rmsd",
                  out=str(tmp_path / "refused"))
    with pytest.raises(InputError, match="^--select 'x' matches 0 atoms$"):
        pilot.submit_spec(run)
    with pytest.raises(InputError, match="did not plan the run"):
        pilot.submit_spec(dataclasses.replace(run, out=str(tmp_path / "broken")))
    thread.join(5)
    server.close()
    assert not (tmp_path / "refused").exists() and not (tmp_path / "broken").exists()
    (message, with_lock), _ = got
    assert with_lock and message["spec"]["out"] == str(tmp_path / "refused")
    assert os.path.isabs(message["spec"]["topology"]) and message["spec"]["analysis"] == "rmsd"
