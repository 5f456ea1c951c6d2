"""RADICAL's process watchers, components' main threads and timed callbacks, and ZMQ listeners, as
trajflow makes them (tasks/quiet_components.py):
it finds a watched process dead as RADICAL's does (and acts as told), woken by the
death instead of looking every 50 ms."""
import subprocess
import sys
import time

import pytest

from processes import thread_wakes

from trajflow.tasks import quiet_components

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def radicals_listeners_restored(monkeypatch):
    """RADICAL's Subscriber and Pipe as they were, after each test (quiet_components()
    patches them for the process)."""
    from radical.utils.zmq.pipe import Pipe
    from radical.utils.zmq.pubsub import Subscriber
    for cls, name in ((Subscriber, "_start_listener"), (Subscriber, "_get_nowait"),
                      (Pipe, "__init__"), (Pipe, "_listener")):
        monkeypatch.setattr(cls, name, cls.__dict__[name])


@pytest.fixture
def pubsub_bridge(tmp_path):
    """Makes a started RADICAL pubsub bridge of a name; each stopped after the test."""
    import radical.utils as ru
    made = []

    def make(name):
        made.append(ru.zmq.PubSub(name, cfg={"uid": name, "path": str(tmp_path)}))
        made[-1].start()
        return made[-1]
    yield make
    for bridge in made:
        bridge.stop()


@pytest.fixture
def watcher_class(monkeypatch):
    """RADICAL's PWatcher class, patched for this test only; its look without cause
    far later than any wait below: what is seen is seen because of a pidfd, or of a
    watch() that woke it."""
    import radical.utils as ru

    class Watcher(ru.PWatcher):
        pass

    monkeypatch.setattr(quiet_components, "RESCAN_S", 30.0)
    quiet_components.quiet_process_watchers(Watcher)
    return Watcher


def until(check, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def watching_a_sleeper(watcher_class):
    """A watcher whose action is NOTHING, its calls listed, watching a new sleeping child:
    (watcher, the pids it acted on, the child)."""
    import radical.utils as ru
    acted = []
    watcher = watcher_class(action=ru.PWatcher.NOTHING, uid="test.pw")
    watcher._nothing = acted.append
    child = sleeper()
    watcher.watch(child.pid)
    return watcher, acted, child


def test_a_watched_process_that_ends_is_found_at_once_and_acted_on(watcher_class):
    watcher, acted, child = watching_a_sleeper(watcher_class)
    time.sleep(0.5)
    assert thread_wakes(watcher._thread, 1.0) <= 3
    child.kill()
    child.wait()  # reaped: dead to RADICAL's kill(pid, 0) too
    assert until(lambda: acted == [child.pid], seconds=2.0)  # not at the 30 s look
    assert watcher._pids == []


def test_a_pid_watched_while_the_watcher_sleeps_is_watched_at_once(watcher_class):
    import radical.utils as ru
    acted = []
    watcher = watcher_class(action=ru.PWatcher.NOTHING, uid="test.pw")
    watcher._nothing = acted.append
    time.sleep(0.5)  # asleep, watching nothing
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    watcher.watch(ended.pid)  # dead already
    assert until(lambda: acted == [ended.pid], seconds=2.0)


def test_an_ended_process_not_yet_reaped_is_polled_until_it_is(watcher_class):
    """A zombie is alive to RADICAL's kill(pid, 0): it is polled (every 50 ms), not
    acted on, and acted on once reaped, as by RADICAL's watcher."""
    watcher, acted, child = watching_a_sleeper(watcher_class)
    time.sleep(1.5)
    child.kill()
    time.sleep(0.5)
    assert acted == [] and watcher._pids == [child.pid]
    child.wait()
    assert until(lambda: acted == [child.pid], seconds=2.0)


def test_a_pid_that_cannot_be_waited_on_is_polled(watcher_class, monkeypatch):
    import radical.utils as ru
    monkeypatch.setattr(quiet_components, "pidfd_of", lambda pid: None)
    acted = []
    watcher = watcher_class(action=ru.PWatcher.NOTHING, uid="test.pw")
    watcher._nothing = acted.append
    child = sleeper()
    watcher.watch(child.pid)
    time.sleep(0.3)
    child.kill()
    child.wait()
    assert until(lambda: acted == [child.pid], seconds=2.0)


def test_radicals_own_watcher_class_is_patched_once(monkeypatch):
    import radical.utils as ru
    for name in ("__init__", "watch", "_watch"):
        monkeypatch.setattr(ru.PWatcher, name, getattr(ru.PWatcher, name))  # restored after
    quiet_components.quiet_process_watchers()
    watch = ru.PWatcher.watch
    quiet_components.quiet_process_watchers()
    assert ru.PWatcher._watch is quiet_components.watch_with_pidfds and ru.PWatcher.watch is watch


def test_a_components_main_thread_waits_for_its_stop_without_waking():
    import threading
    import radical.utils as ru
    from radical.pilot.utils.component import BaseComponent

    class Component(BaseComponent):
        def __init__(self):  # (RADICAL's needs a session; only the stop flag is used)
            self._term = threading.Event()

    class Watcher(ru.PWatcher):
        pass

    quiet_components.quiet_components(Component, Watcher)
    component = Component()
    waiting = threading.Thread(target=component.wait)
    waiting.start()
    time.sleep(0.3)
    assert thread_wakes(waiting, 1.0) <= 3 and waiting.is_alive()
    start = time.monotonic()
    component._term.set()
    waiting.join(5)
    assert not waiting.is_alive() and time.monotonic() - start < 0.5


def test_a_timed_callback_is_called_when_due_and_sleeps_between():
    """RADICAL's timed callbacks (the pilot manager's heartbeat, agent_0's lifetime
    check) are called at most every `timer` s, stop at False or at the component's
    stop, and their thread sleeps until due instead of looking every 10 ms."""
    import threading
    import radical.utils as ru
    from radical.pilot.utils.component import BaseComponent

    class Component(BaseComponent):
        def __init__(self):  # (RADICAL's needs a session)
            self._uid, self._log = "comp.0000", ru.Logger("test.comp", targets="null")
            self._cb_lock, self._threads, self._term = threading.RLock(), {}, threading.Event()

    class Watcher(ru.PWatcher):
        pass

    quiet_components.quiet_components(Component, Watcher)
    component = Component()
    calls, data_calls = [], []

    def heartbeat():
        calls.append(time.monotonic())
        return True

    def twice(cb_data):
        data_calls.append(cb_data)
        return len(data_calls) < 2

    component.register_timed_cb(heartbeat, timer=0.4)
    with pytest.raises(ValueError):  # one of a name, as RADICAL's
        component.register_timed_cb(heartbeat, timer=1)
    component.register_timed_cb(twice, cb_data="x", timer=0.1)
    time.sleep(1.5)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert 3 <= len(calls) <= 5 and all(gap >= 0.35 for gap in gaps), gaps
    assert data_calls == ["x", "x"]  # ended at its False
    thread = component._threads["comp.0000.idler.heartbeat"]
    assert thread_wakes(thread, 0.3) <= 3
    start = time.monotonic()
    component._term.set()
    thread.join(5)
    assert not thread.is_alive() and time.monotonic() - start < 0.5


def test_radicals_listeners_sleep_until_a_message_or_their_stop(tmp_path, pubsub_bridge):
    """A subscriber's and a pipe's listener (the client holds a dozen) wake for a
    message or for their stop, not every 500 ms / 10 ms; stopped, they end at once."""
    import radical.utils as ru
    quiet_components.waking_rp_listeners()
    quiet_components.waking_rp_listeners()  # once
    bridge = pubsub_bridge("state_pubsub")
    got = []
    subscriber = ru.zmq.Subscriber("state_pubsub", url=bridge.addr_sub, path=str(tmp_path))
    on_state = lambda topic, msg: got.append(msg)  # noqa: E731
    subscriber.subscribe("state", cb=on_state)
    publisher = ru.zmq.Publisher("state_pubsub", url=bridge.addr_pub, path=str(tmp_path))
    time.sleep(0.5)
    assert thread_wakes(subscriber._thread, 1.0) <= 3
    publisher.put("state", {"uid": "task.0"})
    assert until(lambda: got == [{"uid": "task.0"}])
    start = time.monotonic()
    subscriber.unsubscribe(on_state)  # stops and joins its listener
    assert subscriber._thread is None and time.monotonic() - start < 1.0

    pulled = []
    pull = ru.zmq.Pipe(ru.zmq.MODE_PULL)
    pull.register_cb(pulled.append)
    push = ru.zmq.Pipe(ru.zmq.MODE_PUSH, url=str(pull.url))
    time.sleep(0.3)
    assert thread_wakes(pull._thread, 1.0) <= 3
    push.put({"uid": "comp.0"})
    assert until(lambda: pulled == [{"uid": "comp.0"}])
    start = time.monotonic()
    pull.stop()
    assert time.monotonic() - start < 1.0


def test_a_subscriber_given_its_callback_when_made_sleeps_too(tmp_path, pubsub_bridge):
    """(RADICAL's constructor starts its listener: the flag is swapped there as well)"""
    import radical.utils as ru
    quiet_components.waking_rp_listeners()
    bridge = pubsub_bridge("ctrl_pubsub")
    got = []
    subscriber = ru.zmq.Subscriber("ctrl_pubsub", url=bridge.addr_sub, topic="ctrl",
                                   cb=lambda topic, msg: got.append(msg), path=str(tmp_path))
    publisher = ru.zmq.Publisher("ctrl_pubsub", url=bridge.addr_pub, path=str(tmp_path))
    time.sleep(0.5)
    assert thread_wakes(subscriber._thread, 1.0) <= 3
    publisher.put("ctrl", {"cmd": "x"})
    assert until(lambda: got == [{"cmd": "x"}])
    start = time.monotonic()
    subscriber._stop_listener(force=True)
    assert time.monotonic() - start < 0.4  # (RADICAL's poll: up to 0.5 s)