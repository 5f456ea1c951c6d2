"""RADICAL's bridges, as trajflow's component starter makes them (tasks/quiet_bridges.py),
deliver what RADICAL's deliver, in the same order and bulks, to RADICAL's own putters,
getters, publishers and subscribers, and wait for messages instead of waking every
10 ms: an idle held pilot's ~25 processes used 42 % of a core by waking."""
import threading
import time

import pytest

from processes import thread_wakes

from trajflow.tasks import quiet_bridges

pytestmark = pytest.mark.timeout(120)

HELD = "agent_scheduling_queue"        # one of HELD_QUEUES
NOT_HELD = "client_queue"    # not in HELD_QUEUES: answered empty after EMPTY_ANSWER_AFTER_S


@pytest.fixture(autouse=True)
def long_idle_poll(monkeypatch):
    """A bridge's idle look at its stop flag far longer than any wait below: what is
    delivered is delivered because it came, not because a timer went off."""
    monkeypatch.setattr(quiet_bridges, "IDLE_POLL_MS", 20_000)


def bridge_of(kind, name, tmp_path, **cfg):
    bridge = kind(name, cfg={"uid": name, "path": str(tmp_path), **cfg})
    bridge.start()
    return bridge


@pytest.fixture
def queue_bridges(tmp_path):
    made = []

    def make(name=HELD, kind=quiet_bridges.HeldRequestsQueue, **cfg):
        made.append(bridge_of(kind, name, tmp_path, **cfg))
        return made[-1]
    yield make
    for bridge in made:
        bridge.stop()  # (its thread is a daemon; it ends at its next look)


def putter_getter(bridge, tmp_path, getters=1):
    import radical.utils as ru
    putter = ru.zmq.Putter(bridge.channel, url=bridge.addr_put, path=str(tmp_path))
    made = [ru.zmq.Getter(bridge.channel, url=bridge.addr_get, path=str(tmp_path))
            for _ in range(getters)]
    return putter, made


def put_later(putter, msgs, after_s, qname="default"):
    timer = threading.Timer(after_s, putter.put, args=(msgs,), kwargs={"qname": qname})
    timer.start()
    return timer


def test_a_request_to_an_empty_queue_waits_and_is_answered_when_a_message_comes(
        queue_bridges, tmp_path):
    bridge = queue_bridges()
    putter, (getter,) = putter_getter(bridge, tmp_path)
    assert getter.get_nowait(timeout=300) is None  # held: no empty answer
    put_later(putter, [{"uid": "task.0"}], after_s=0.3)
    start = time.monotonic()
    got = getter.get_nowait(timeout=10_000)
    waited = time.monotonic() - start
    assert got == [{"uid": "task.0"}]
    assert 0.25 < waited < 2.0  # when it came, not at the bridge's next look (20 s)


def test_a_queue_not_held_answers_an_empty_request_about_when_radicals_does(
        queue_bridges, tmp_path):
    """Its askers that ask again at once (EnTK's synchronizer, two queue names in turn)
    are answered empty within tens of ms, as by RADICAL's, and the bridge sleeps."""
    for kind in (quiet_bridges.HeldRequestsQueue, quiet_bridges.RadicalQueue):
        bridge = queue_bridges(NOT_HELD, kind=kind)
        _, (getter,) = putter_getter(bridge, tmp_path)
        start = time.monotonic()
        assert [getter.get_nowait(timeout=5000) for _ in range(5)] == [[]] * 5, kind
        assert time.monotonic() - start < 2.0
    bridge = queue_bridges(NOT_HELD)
    assert thread_wakes(bridge._bridge_thread, 1.0) <= 3  # no asker: asleep


def test_entks_queue_holds_the_names_read_alone_and_answers_the_others(
        queue_bridges, tmp_path):
    bridge = queue_bridges("re.session.test", kind=quiet_bridges.EntkQueue)
    putter, (task_manager, synchronizer) = putter_getter(bridge, tmp_path, getters=2)
    assert synchronizer.get_nowait(qname="tmgr-to-sync", timeout=5000) == []
    assert task_manager.get_nowait(qname="pending", timeout=300) is None  # held
    putter.put([{"type": "workload"}], qname="pending")
    assert task_manager.get_nowait(qname="pending", timeout=5000) == [{"type": "workload"}]


def test_messages_keep_their_order_queue_names_and_bulks(queue_bridges, tmp_path):
    bridge = queue_bridges(bulk_size=2)
    putter, (getter,) = putter_getter(bridge, tmp_path)
    putter.put([{"n": n} for n in range(5)], qname="pilot.0000")
    putter.put([{"n": "other"}], qname="pilot.0001")
    time.sleep(0.2)
    bulks = [getter.get_nowait(qname="pilot.0000", timeout=5000) for _ in range(3)]
    assert bulks == [[{"n": 0}, {"n": 1}], [{"n": 2}, {"n": 3}], [{"n": 4}]]
    assert getter.get_nowait(qname="pilot.0001", timeout=5000) == [{"n": "other"}]


def test_waiting_getters_are_answered_in_the_order_they_asked(queue_bridges, tmp_path):
    bridge = queue_bridges()
    putter, getters = putter_getter(bridge, tmp_path, getters=3)
    for getter in getters:
        assert getter.get_nowait(timeout=100) is None
    for n in range(3):
        putter.put([{"n": n}])
        time.sleep(0.1)
    assert [getter.get_nowait(timeout=5000) for getter in getters] == \
        [[{"n": 0}], [{"n": 1}], [{"n": 2}]]


def test_a_message_for_an_asker_that_has_gone_goes_to_the_next(queue_bridges, tmp_path):
    bridge = queue_bridges()
    putter, (gone, staying) = putter_getter(bridge, tmp_path, getters=2)
    assert gone.get_nowait(timeout=100) is None
    assert staying.get_nowait(timeout=100) is None
    gone._q.close(linger=0)
    time.sleep(0.5)  # the bridge has seen it go
    putter.put([{"uid": "task.1"}])
    assert staying.get_nowait(timeout=5000) == [{"uid": "task.1"}]


def test_a_held_queue_sleeps_while_idle_where_radicals_wakes_every_10ms(
        queue_bridges, tmp_path):
    wakes = {}
    for kind in (quiet_bridges.HeldRequestsQueue, quiet_bridges.RadicalQueue):
        bridge = queue_bridges(kind=kind)
        _, (getter,) = putter_getter(bridge, tmp_path)
        waiting = threading.Thread(target=getter.get_nowait, kwargs={"timeout": 1500})
        waiting.start()
        wakes[kind.__name__] = thread_wakes(bridge._bridge_thread, 1.0)
        waiting.join()
    assert wakes["HeldRequestsQueue"] <= 3, wakes
    assert wakes["Queue"] >= 20, wakes  # RADICAL's: a poll, a poll and a sleep of 10 ms


def test_pubsub_forwards_when_a_message_comes_and_sleeps_otherwise(tmp_path):
    import radical.utils as ru
    received = []
    wakes = {}
    for kind in (quiet_bridges.WaitingPubSub, quiet_bridges.RadicalPubSub):
        bridge = bridge_of(kind, "state_pubsub", tmp_path)
        subscriber = ru.zmq.Subscriber("state_pubsub", url=bridge.addr_sub, path=str(tmp_path))
        subscriber.subscribe("state", cb=lambda topic, msg: received.append((topic, msg)))
        publisher = ru.zmq.Publisher("state_pubsub", url=bridge.addr_pub, path=str(tmp_path))
        time.sleep(0.5)  # subscribed (ZMQ's slow joiner)
        wakes[kind.__name__] = thread_wakes(bridge._bridge_thread, 1.0)
        received.clear()
        publisher.put("state", {"uid": "task.0", "state": "DONE"})
        deadline = time.monotonic() + 2.0
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
        assert received == [("state", {"uid": "task.0", "state": "DONE"})], kind
        bridge.stop()
    assert wakes["WaitingPubSub"] <= 3, wakes
    assert wakes["PubSub"] >= 20, wakes


def test_a_component_reading_two_held_queues_takes_from_whichever_has_a_message(
        queue_bridges, tmp_path):
    """agent_0 reads the client's tasks and the tasks done, both held: it waits on both
    at once (agent_waits.wait_on_all_inputs), so neither waits for the other's poll."""
    from trajflow.tasks.agent_waits import TakesWhatCame, wait_for_any
    proxy = queue_bridges("proxy_task_queue")
    collecting = queue_bridges("agent_collecting_queue")
    (proxy_putter, (proxy_getter,)) = putter_getter(proxy, tmp_path)
    (collecting_putter, (collecting_getter,)) = putter_getter(collecting, tmp_path)
    inputs = [(proxy_getter, "pilot.0000"), (collecting_getter, "default")]
    start = time.monotonic()
    wait_for_any(inputs, 300)  # nothing yet: the whole wait
    assert 0.25 < time.monotonic() - start < 5
    put_later(collecting_putter, [{"uid": "task.done"}], after_s=0.3)
    start = time.monotonic()
    wait_for_any(inputs, 20_000)
    assert time.monotonic() - start < 5  # woken by the second queue's message
    assert TakesWhatCame(proxy_getter).get_nowait(qname="pilot.0000", timeout=200) is None
    assert TakesWhatCame(collecting_getter).get_nowait(timeout=200) == [{"uid": "task.done"}]
    proxy_putter.put([{"uid": "task.new"}], qname="pilot.0000")
    wait_for_any(inputs, 20_000)
    assert TakesWhatCame(proxy_getter).get_nowait(qname="pilot.0000") == [{"uid": "task.new"}]


def test_a_modules_radical_makes_the_quiet_bridges_and_nothing_else_changes(tmp_path):
    import types
    import radical.utils as ru
    module = types.SimpleNamespace(ru=ru)
    quiet_bridges.quiet_bridges_of(module, quiet_bridges.EntkQueue)
    quiet_bridges.quiet_bridges_of(module)  # once: the first stays
    assert module.ru.zmq.Queue is quiet_bridges.EntkQueue
    assert module.ru.zmq.PubSub is quiet_bridges.WaitingPubSub
    assert module.ru.zmq.Getter is ru.zmq.Getter and module.ru.Config is ru.Config
    assert ru.zmq.Queue is quiet_bridges.RadicalQueue  # RADICAL's own, for everyone else


def test_bridges_made_by_radical_are_the_quiet_ones_once_swapped(monkeypatch, tmp_path):
    import radical.utils as ru
    from radical.utils.zmq import pubsub, queue
    monkeypatch.setattr(queue, "Queue", queue.Queue)
    monkeypatch.setattr(pubsub, "PubSub", pubsub.PubSub)
    quiet_bridges.make_quiet_bridges()
    cfg = {"uid": HELD, "path": str(tmp_path)}
    assert type(ru.zmq.Bridge.create(HELD, cfg=cfg)) is quiet_bridges.HeldRequestsQueue
    cfg = {"uid": "control_pubsub", "path": str(tmp_path)}
    assert type(ru.zmq.Bridge.create("control_pubsub", cfg=cfg)) is quiet_bridges.WaitingPubSub


def test_entks_synchronizer_gets_either_of_its_two_names_in_the_order_put(
        queue_bridges, tmp_path):
    """EnTK's synchronizer asks for 'tmgr-to-sync', then 'cb-to-sync', each answer
    blocking it; it treats their messages alike: a request for either is answered by
    the oldest message of either, at once, or empty after ENTK_SYNC_HOLD_S."""
    bridge = queue_bridges("re.session.sync", kind=quiet_bridges.EntkQueue, bulk_size=1)  # EnTK's
    putter, (synchronizer,) = putter_getter(bridge, tmp_path)
    start = time.monotonic()
    assert synchronizer.get_nowait(qname="tmgr-to-sync", timeout=5000) == []
    assert time.monotonic() - start >= quiet_bridges.ENTK_SYNC_HOLD_S * 0.9
    put_later(putter, [{"uid": "task.0", "state": "DONE"}], after_s=0.05, qname="cb-to-sync")
    got = synchronizer.get_nowait(qname="tmgr-to-sync", timeout=5000)
    if got == []:  # (a slow machine: the put came after the hold)
        got = synchronizer.get_nowait(qname="cb-to-sync", timeout=5000)
    assert got == [{"uid": "task.0", "state": "DONE"}]
    putter.put([{"n": 1}], qname="tmgr-to-sync")
    putter.put([{"n": 2}], qname="cb-to-sync")
    putter.put([{"n": 3}], qname="tmgr-to-sync")
    time.sleep(0.2)
    assert [synchronizer.get_nowait(qname=name, timeout=5000)
            for name in ("cb-to-sync", "tmgr-to-sync", "cb-to-sync")] == \
        [[{"n": 1}], [{"n": 2}], [{"n": 3}]]
