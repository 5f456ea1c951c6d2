"""A pilot's agent looks for work sooner, and sleeps while it has none: its scheduler's
idle sleep ends the moment a task or a freed slot is queued for it (or after
QUEUED_IDLE_S), instead of RADICAL-Pilot's fixed 0.1 s.

RADICAL-Pilot 1.103's agent scheduler sleeps 0.1 s whenever a pass of its loop found
nothing to do (`radical/pilot/agent/scheduler/base.py`, "FIXME: configurable"): a task
sent to an idle pilot waited 0.02-0.13 s to be given cores, in a warm run of 0.7-0.8 s.
The module calls `time.sleep`; it is given a `time` whose sleep is capped, and nothing
else of it changes. Capped at 0.01 s, the scheduler's process woke ~50 times a second
on an idle held pilot (0.6 CPU-s every 30 s); so in the process that runs its loop
(`_schedule_tasks`) the sleep waits on the loop's two queues' pipes instead, which a
task to place or a slot freed makes readable (a sleep of AGENT_IDLE_S where they
cannot be found). And the Popen executor's watcher, every 0.05 s, publishes the tasks
that ended since its last look to the scheduler, an empty list when none did: 20
messages a second through a bridge to the scheduler's two processes, which woke its
loop as often. Those empty lists are not sent (`skip_empty_publishes`).

The Popen executor's watcher looks at its running tasks every 0.05 s: a task that
ended waited ~0.025 s on average (up to 0.05) to be seen, in a warm `Backend` run of
0.48 s. In the executing component's process, its watcher waits on a pidfd per
running task and on a pipe its watch queue's put writes to, for at most those
0.05 s (`see_task_exits_at_once`; the Popen module is patched once the component's
factory imports it there, never in the starter: its import installs RADICAL's
signal handlers).

agent_0 reads two queues (tasks from the client, tasks done to send back), each in
turn for up to 200 ms. Where their bridges hold a request until a message comes
(quiet_bridges.py), waiting 200 ms on one would keep the other's message waiting; so
in agent_0's process (tasks/agent_start.py) a component waits on all its inputs at
once, then takes from each what has come (`wait_on_all_inputs`). Applied in the agent's component starter (component_starter.py,
started by agent_start.py) before any component is forked, so only the agent's own
processes look sooner: the client's, and any other Python's, are as RADICAL makes them.

Only modules the starter has imported already are capped, never one imported for this:
the Popen executor's watcher also sleeps (0.05 s), but importing its module installs
RADICAL's SIGTERM and SIGINT handlers (they end the executor's tasks and not the
process), which every bridge and component forked from the starter would inherit.
"""
import logging
import multiprocessing.connection
import os
import queue
import sys
import time

import zmq

from trajflow.tasks.quiet_components import close_fd, drain, pidfd_of, readable

log = logging.getLogger(__name__)

AGENT_IDLE_S = 0.01   # the longest idle sleep where nothing can end it sooner
QUEUED_IDLE_S = 0.5   # the longest idle wait on the scheduler's queues
# the modules whose idle sleeps are capped (in 1.103 the scheduler's only sleep; imported
# with radical.pilot, as the starter imports it)
IDLE_WAITS = ("radical.pilot.agent.scheduler.base",)
SCHEDULER = "AgentSchedulingComponent"  # in IDLE_WAITS[0]: its loop's queues wake it
SCHEDULER_QUEUES = ("_queue_sched", "_queue_unsched")  # multiprocessing.Queue each
EXIT_POLL_S = 0.05   # RADICAL's watcher pause (cancellations and timeouts are seen then)
MAX_PIDFDS = 256     # tasks waited on by pidfd (file descriptors are a budget)
INPUT_WAIT_MS = 200  # RADICAL's own wait on one input, here on all of them at once
# channels on which an empty list says nothing (the scheduler releases no slot for it)
NOTHING_IF_EMPTY = ("agent_unschedule_pubsub",)


class CappedSleeps:
    """The `time` module as one module sees it, with its sleeps at most `longest`, or,
    where `wakers` (readable connections) are set, a wait of `woken_longest` ended by
    the first that has data."""

    def __init__(self, longest, woken_longest=QUEUED_IDLE_S):
        self.longest = longest
        self.woken_longest = woken_longest
        self.wakers = ()

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        if self.wakers:  # (the loop's 0.1 s: nothing but its queues brings it work)
            multiprocessing.connection.wait(self.wakers, self.woken_longest)
        else:
            time.sleep(min(seconds, self.longest))


def wake_on_queues(component_class, sleeps, method="_schedule_tasks",
                   queues=SCHEDULER_QUEUES):
    """In the process that runs `component_class.method` (the scheduler's loop, in a
    process of its own), `sleeps` ends when one of its `queues` has data."""
    original = getattr(component_class, method)

    def woken_by_its_queues(self, *args, **kwargs):
        readers = [getattr(getattr(self, name, None), "_reader", None) for name in queues]
        if all(hasattr(reader, "fileno") for reader in readers):
            sleeps.wakers = tuple(readers)
        else:
            log.debug("%s has not the queues %s: its idle sleeps stay short",
                      component_class.__name__, queues)
        return original(self, *args, **kwargs)

    setattr(component_class, method, woken_by_its_queues)


def skip_empty_publishes(component_class, channels=NOTHING_IF_EMPTY):
    """A component of `component_class` (RADICAL's BaseComponent) does not publish an
    empty list on `channels`."""
    original = component_class.publish

    def publish_unless_empty(self, pubsub, msg, topic=None):
        if pubsub in channels and isinstance(msg, list) and not msg:
            return None
        return original(self, pubsub, msg, topic)

    component_class.publish = publish_unless_empty


class TakesWhatCame:
    """A component's input getter whose get waits for nothing: its component has
    waited on all its inputs already (wait_on_all_inputs)."""

    def __init__(self, getter):
        self._getter = getter

    def __getattr__(self, name):
        return getattr(self._getter, name)

    def get_nowait(self, qname=None, timeout=None):
        return self._getter.get_nowait(qname=qname, timeout=0)


def wait_on_all_inputs(component_class, wait_ms=INPUT_WAIT_MS):
    """Components of `component_class` (RADICAL's BaseComponent) in this process wait up
    to `wait_ms` for a message on any of their inputs, then take from each what came."""
    original_work_cb = component_class.work_cb
    original_get_input_ep = component_class.get_input_ep

    def get_input_ep(self, qname):
        getter = original_get_input_ep(self, qname)
        if all(hasattr(getter, name) for name in ("_q", "_lock", "_requested")):
            return TakesWhatCame(getter)
        log.debug("an input getter of %s is not as expected: it waits as RADICAL's", qname)
        return getter

    def work_cb(self):
        inputs = [(entry["queue"], entry["qname"]) for entry in list(self._inputs.values())]
        waiting = [(getter._getter, qname) for getter, qname in inputs
                   if isinstance(getter, TakesWhatCame)]
        if waiting:
            wait_for_any(waiting, wait_ms)
        return original_work_cb(self)

    component_class.get_input_ep = get_input_ep
    component_class.work_cb = work_cb


def wait_for_any(getters, wait_ms):
    """Each of RADICAL's interactive `getters` (getter, qname) has a request out (as its
    get_nowait sends one); wait up to `wait_ms` for any answer."""
    from radical.utils import as_bytes
    poller = zmq.Poller()
    for getter, qname in getters:
        with getter._lock:
            if not getter._requested:
                getter._q.send_multipart([as_bytes(qname or "default")])
                getter._requested = True
        poller.register(getter._q, zmq.POLLIN)
    poller.poll(timeout=wait_ms)


def see_task_exits_at_once(factory_class=None):
    """The Popen executor made by `factory_class` (RADICAL's AgentExecutingComponent)
    from now on watches its tasks with `watch_until_an_exit`."""
    if factory_class is None:
        from radical.pilot.agent.executing.base import AgentExecutingComponent as factory_class
    made = factory_class.create  # (bound to the factory class)
    if getattr(made, "_trajflow_exits", False):
        return

    def create(cls, cfg, session):
        from radical.pilot.agent.executing import popen
        popen.Popen._watch = watch_until_an_exit
        return made(cfg, session)
    create._trajflow_exits = True
    factory_class.create = classmethod(create)


def watch_until_an_exit(self):
    """The Popen executor's watch loop (radical/pilot/agent/executing/popen.py), whose
    pause of 0.05 s ends when a task's process ends (the first MAX_PIDFDS of them) or a
    task is put to watch."""
    to_watch = []
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    put = self._watch_queue.put

    def put_and_wake(item, *args, **kwargs):
        put(item, *args, **kwargs)
        try:
            os.write(wake_write, b"t")
        except OSError:
            pass  # awake already (or the loop has ended)
    self._watch_queue.put = put_and_wake
    pidfds = {}  # a watched process' pid -> its pidfd
    try:
        while not self._term.is_set():
            count = 0
            try:
                while count < 100:  # RADICAL's MAX_QUEUE_BULKSIZE
                    to_watch.append(self._watch_queue.get_nowait())
                    count += 1
            except queue.Empty:
                pass
            self._check_running(to_watch)
            if not count:
                readable([wake_read, *_pidfds_of(to_watch, pidfds)], EXIT_POLL_S)
                drain(wake_read)
    except Exception as error:
        self._log.exception('Error in ExecWorker watch loop (%s)' % error)
    finally:
        self._watch_queue.put = put
        for fd in (wake_read, wake_write, *pidfds.values()):
            close_fd(fd)


def _pidfds_of(tasks, pidfds):
    """The pidfds of the tasks' processes, MAX_PIDFDS at most (opened once each; those
    of processes no longer watched closed; the others are seen at the pause's end)."""
    pids = {task["proc"].pid for task in tasks if task.get("proc") is not None}
    for pid in set(pidfds) - pids:
        close_fd(pidfds.pop(pid))
    for pid in sorted(pids - set(pidfds))[:max(0, MAX_PIDFDS - len(pidfds))]:
        fd = pidfd_of(pid)
        if fd is not None:
            pidfds[pid] = fd
    return list(pidfds.values())


def shorten_agent_waits(longest=AGENT_IDLE_S, modules=IDLE_WAITS):
    """Cap the sleeps of `modules` (their names) that use the `time` module; the names
    of those capped (one not imported, or whose `time` is something else, is left
    alone and said in the log)."""
    capped = []
    for name in modules:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "time", None) is time:
            module.time = CappedSleeps(longest)
            capped.append(name)
            if hasattr(module, SCHEDULER):
                wake_on_queues(getattr(module, SCHEDULER), module.time)
        else:
            log.debug("%s is not imported or has no time module of its own: not capped", name)
    return capped
