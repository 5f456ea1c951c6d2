"""A pilot's agent looks for work every 10 ms when idle (tasks/agent_waits.py): the
sleeps of the modules named are capped, nothing else of them changes, and a module that
is not as expected is left alone."""
import subprocess
import sys
import time
import types

from trajflow.tasks.agent_waits import CappedSleeps, IDLE_WAITS, shorten_agent_waits


class Silent:
    """RADICAL's logger's calls, said nowhere."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def test_the_named_modules_sleep_at_most_the_cap_and_keep_the_rest_of_time(monkeypatch):
    waits = types.ModuleType("fake_scheduler")
    waits.time = time
    other = types.ModuleType("fake_other")
    other.time = "not the time module"
    monkeypatch.setitem(sys.modules, "fake_scheduler", waits)
    monkeypatch.setitem(sys.modules, "fake_other", other)
    capped = shorten_agent_waits(0.01, ("fake_scheduler", "fake_other", "fake_missing"))
    assert capped == ["fake_scheduler"] and other.time == "not the time module"
    assert "fake_missing" not in sys.modules  # nothing is imported for it
    t0 = time.perf_counter()
    waits.time.sleep(0.5)
    assert time.perf_counter() - t0 < 0.25  # capped at 10 ms (a busy machine: far below)
    assert isinstance(waits.time, CappedSleeps) and waits.time.time() > 1e9
    assert waits.time.monotonic() <= time.monotonic()
    short = time.perf_counter()
    waits.time.sleep(0.001)  # a shorter sleep than the cap is as asked
    assert time.perf_counter() - short < 0.25


def test_radical_pilots_agent_modules_are_the_ones_named_and_use_time():
    """The modules named come with radical.pilot's import (as the starter imports it) and
    call the time module (a release that moved them would leave the agent as RADICAL
    makes it: said here)."""
    said = subprocess.run([sys.executable, "-c", "import sys, time, radical.pilot\n"
                           f"for name in {IDLE_WAITS!r}:\n"
                           "    print(name in sys.modules and sys.modules[name].time is time)"],
                          capture_output=True, text=True, timeout=120)
    assert said.stdout.split() == ["True"] * len(IDLE_WAITS), said.stderr


def test_the_schedulers_idle_sleep_ends_when_its_queues_get_data():
    """The scheduler's loop sleeps until a task or a freed slot is queued for it
    (QUEUED_IDLE_S at most), not every 10 ms; without its queues, the capped sleep."""
    import multiprocessing
    import threading
    from trajflow.tasks.agent_waits import wake_on_queues

    class Scheduler:
        def __init__(self):
            self._queue_sched, self._queue_unsched = multiprocessing.Queue(), multiprocessing.Queue()

        def _schedule_tasks(self):
            return "looped"

    sleeps = CappedSleeps(0.01, woken_longest=0.3)
    wake_on_queues(Scheduler, sleeps)
    scheduler = Scheduler()
    assert scheduler._schedule_tasks() == "looped"
    assert len(sleeps.wakers) == 2
    t0 = time.perf_counter()
    sleeps.sleep(0.1)  # nothing queued: its whole wait (RADICAL's 0.1 s), not the cap
    assert 0.25 < time.perf_counter() - t0 < 5
    sleeps.woken_longest = 30.0
    threading.Timer(0.3, scheduler._queue_unsched.put, args=(["task.0"],)).start()
    t0 = time.perf_counter()
    sleeps.sleep(0.1)  # a slot freed after 0.3 s ends it
    assert 0.25 < time.perf_counter() - t0 < 10
    assert scheduler._queue_unsched.get(timeout=5) == ["task.0"]

    class Other:
        def _schedule_tasks(self):
            return "looped"

    short = CappedSleeps(0.01, woken_longest=30.0)
    wake_on_queues(Other, short)
    Other()._schedule_tasks()
    t0 = time.perf_counter()
    short.sleep(0.5)
    assert short.wakers == () and time.perf_counter() - t0 < 0.25


def test_an_empty_list_of_ended_tasks_is_not_published():
    """The executor's watcher sends the scheduler the tasks that ended every 0.05 s, an
    empty list when none did; those are not sent, everything else is."""
    from trajflow.tasks.agent_waits import skip_empty_publishes

    class Component:
        def __init__(self):
            self.sent = []

        def publish(self, pubsub, msg, topic=None):
            self.sent.append((pubsub, msg, topic))

    skip_empty_publishes(Component)
    component = Component()
    component.publish("agent_unschedule_pubsub", [])
    component.publish("agent_unschedule_pubsub", [{"uid": "task.0"}])
    component.publish("agent_unschedule_pubsub", {"uid": "task.1"})
    component.publish("state_pubsub", [], topic="state")
    assert component.sent == [("agent_unschedule_pubsub", [{"uid": "task.0"}], None),
                              ("agent_unschedule_pubsub", {"uid": "task.1"}, None),
                              ("state_pubsub", [], "state")]


def test_the_executor_sees_a_task_end_and_a_new_task_at_once(monkeypatch):
    """The Popen executor's watcher pauses until a watched task's process ends or a task
    is put to watch (EXIT_POLL_S at most, here far longer than any wait below)."""
    import queue
    import subprocess
    import threading
    from trajflow.tasks import agent_waits

    monkeypatch.setattr(agent_waits, "EXIT_POLL_S", 30.0)
    seen = []

    class Executor:  # what RADICAL's Popen executor gives its watch loop
        def __init__(self):
            self._watch_queue, self._term = queue.Queue(), threading.Event()
            self._log = Silent()

        def _check_running(self, to_watch):
            for task in list(to_watch):
                if task["proc"].poll() is not None:
                    seen.append((task["uid"], time.monotonic()))
                    to_watch.remove(task)

    executor = Executor()
    watcher = threading.Thread(target=agent_waits.watch_until_an_exit, args=(executor,))
    watcher.start()
    try:
        time.sleep(0.3)  # asleep, watching nothing
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
        executor._watch_queue.put({"uid": "task.0", "proc": proc})  # wakes it
        proc.wait()
        ended = time.monotonic()
        deadline = ended + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [uid for uid, _ in seen] == ["task.0"]
        assert seen[0][1] - ended < 5  # by its pidfd, not the 30 s pause
    finally:
        executor._term.set()
        executor._watch_queue.put({"uid": "wake", "proc": subprocess.Popen(["true"])})
        watcher.join(10)
    assert not watcher.is_alive()


def test_the_executor_factory_patches_popen_only_when_it_makes_one():
    """(the Popen module's import installs RADICAL's signal handlers: never in the
    starter, only in the executing component's process, by its factory)"""
    said = subprocess.run([sys.executable, "-c", (
        "import sys, radical.pilot\n"
        "from trajflow.tasks.agent_waits import see_task_exits_at_once\n"
        "see_task_exits_at_once(); see_task_exits_at_once()\n"
        "from radical.pilot.agent.executing.base import AgentExecutingComponent as A\n"
        "print('radical.pilot.agent.executing.popen' in sys.modules, A.create._trajflow_exits)\n"
        "try:\n"
        "    A.create({}, None)\n"
        "except Exception:\n"
        "    pass\n"
        "from radical.pilot.agent.executing import popen\n"
        "print(popen.Popen._watch.__name__)")],
        capture_output=True, text=True, timeout=120)
    assert said.stdout.split() == ["False", "True", "watch_until_an_exit"], said.stderr
