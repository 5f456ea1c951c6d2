"""A pilot's agent sends an unanswered RPC request again, and handles each request once
(tasks/agent_rpc.py): over a real RADICAL control channel (a ZMQ pub/sub bridge, its
publisher and subscriber as RADICAL makes them), whose first send is lost as ZMQ's slow
joiner loses it at the agent's start."""
import threading
import time

import pytest

from trajflow.tasks import agent_rpc

pytestmark = pytest.mark.timeout(120)

CONTROL = "control_pubsub"


class Silent:
    """RADICAL's logger's calls, said nowhere."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@pytest.fixture(autouse=True)
def short_waits(monkeypatch):
    monkeypatch.setattr(agent_rpc, "RESEND_AFTER_S", (0.5, 1.0))


@pytest.fixture
def control_channel(tmp_path):
    import radical.utils as ru
    bridge = ru.zmq.PubSub(CONTROL, cfg={"uid": "test.control.bridge", "path": str(tmp_path)})
    bridge.start()
    yield bridge
    bridge.stop()


def component_on(bridge, tmp_path, lose_first=0):
    """A RADICAL-Pilot component of a class patched as the agent's is, listening on the
    control channel; its first `lose_first` publishes are lost."""
    import radical.utils as ru
    from radical.pilot.utils.component import BaseComponent

    class Agent(BaseComponent):
        pass

    agent_rpc.resend_unanswered_rpcs(Agent)
    component = object.__new__(Agent)
    component.__dict__.update(_uid="agent_0", _log=Silent(), _rpc_reqs={}, _rpc_handlers={},
                              _cancel_list=[], _cancel_lock=threading.RLock())
    publisher = ru.zmq.Publisher(CONTROL, url=bridge.addr_pub, path=str(tmp_path))
    sends = []

    class Lossy:
        def put(self, topic, msg):
            sends.append(msg)
            if len(sends) > lose_first:
                publisher.put(topic, msg)

    component._publishers = {CONTROL: Lossy()}
    subscriber = ru.zmq.Subscriber(CONTROL, url=bridge.addr_sub, path=str(tmp_path))
    subscriber.subscribe(CONTROL, cb=component._control_cb, lock=threading.RLock())
    return component, sends


def test_a_lost_request_is_sent_again_and_answered_once(control_channel, tmp_path):
    agent, sends = component_on(control_channel, tmp_path, lose_first=1)
    calls = []
    agent.register_rpc_handler("prepare_env", lambda env_name: calls.append(env_name) or 7,
                               rpc_addr="pilot.0000")
    assert agent.rpc("prepare_env", env_name="rp", rpc_addr="pilot.0000") == 7
    assert calls == ["rp"]  # (RADICAL's own rpc() waited for ever: its one send was lost)
    requests = [m for m in sends if type(m).__name__ == "RPCRequestMessage"]
    assert len(requests) >= 2 and len({m.uid for m in requests}) == 1
    assert not agent._rpc_reqs


def test_a_request_that_comes_twice_is_handled_once(control_channel, tmp_path):
    """A slow handler's request is sent again meanwhile: the copy is not run again."""
    agent, sends = component_on(control_channel, tmp_path)
    calls = []

    def requests():
        return [m for m in sends if type(m).__name__ == "RPCRequestMessage"]

    def slow(env_name):  # answers once the request has been sent a third time
        calls.append(env_name)
        deadline = time.monotonic() + 30
        while len(requests()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        return "ok"

    agent.register_rpc_handler("prepare_env", slow, rpc_addr="pilot.0000")
    assert agent.rpc("prepare_env", env_name="rp", rpc_addr="pilot.0000") == "ok"
    assert len(requests()) >= 3 and calls == ["rp"]


def test_a_failed_handler_is_raised_as_radical_raises_it(control_channel, tmp_path):
    agent, _ = component_on(control_channel, tmp_path)

    def broken(env_name):
        raise OSError("no space left")

    agent.register_rpc_handler("prepare_env", broken)
    with pytest.raises(RuntimeError, match="rpc failed: .*no space left"):
        agent.rpc("prepare_env", env_name="rp")


def test_publishes_are_made_one_at_a_time(control_channel, tmp_path):
    """A resend (the asking thread) and the handler's answer (the listening thread) share
    one ZMQ socket, which is not thread-safe."""
    agent, _ = component_on(control_channel, tmp_path)
    inside, most = [0], [0]

    class Counting:
        def put(self, topic, msg):
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.01)
            inside[0] -= 1

    agent._publishers = {CONTROL: Counting()}
    threads = [threading.Thread(target=agent.publish, args=(CONTROL, {"cmd": "x"}))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most == [1]


def test_the_waits_go_on_at_the_last_one():
    waits = agent_rpc.resend_waits()
    assert [next(waits) for _ in range(5)] == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_the_testing_hook_loses_each_requests_first_send(control_channel, tmp_path,
                                                         monkeypatch):
    monkeypatch.setenv(agent_rpc.LOSE_FIRST_SEND, "1")
    agent, sends = component_on(control_channel, tmp_path)
    agent.register_rpc_handler("prepare_env", lambda env_name: env_name)
    t0 = time.monotonic()
    assert agent.rpc("prepare_env", env_name="rp") == "rp"
    assert time.monotonic() - t0 >= 0.5  # answered to the second send, made at 0.5 s
    assert [type(m).__name__ for m in sends] == ["RPCRequestMessage", "RPCResultMessage"]


@pytest.mark.parametrize("flags, forked, served", [
    ([], True, True),
    (["--no-task-server"], True, False),
    (["--no-forked-starts", "--no-task-server"], False, False),
])
def test_the_agents_requests_are_sent_again_whatever_else_is_turned_off(monkeypatch, flags,
                                                                         forked, served):
    """agent_start with its flags (TRAJFLOW_FORKED_STARTS=0 passes both): the patch is
    applied in every case, before the agent's script runs."""
    from trajflow.tasks import agent_start
    done = []
    monkeypatch.setattr(agent_start, "same_python_script", lambda name: "/venv/bin/" + name)
    monkeypatch.setattr(agent_start, "keep_inherited_placement", lambda: None)
    monkeypatch.setattr(agent_start, "use_forked_starts", lambda agent: done.append("forked"))
    monkeypatch.setattr(agent_start, "start_beside_agent", lambda: done.append("served"))
    from radical.pilot.utils.component import BaseComponent
    monkeypatch.setattr(agent_start, "resend_unanswered_rpcs",
                        lambda cls: done.append(("resend", cls)))
    monkeypatch.setattr(agent_start, "wait_on_all_inputs",
                        lambda cls: done.append(("all inputs", cls)))
    monkeypatch.setattr(agent_start, "quiet_components", lambda cls: done.append(("quiet", cls)))
    monkeypatch.setattr(agent_start, "run_as_main",
                        lambda script, args: done.append(("run", script, args)))
    agent_start.main([*flags, agent_start.AGENT, "pilot.0000"])
    assert done == (["forked"] * forked + ["served"] * served
                    + [("resend", BaseComponent), ("all inputs", BaseComponent),
                       ("quiet", BaseComponent),
                       ("run", "/venv/bin/" + agent_start.AGENT, ["pilot.0000"])])
