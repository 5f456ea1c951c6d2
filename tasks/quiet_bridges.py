"""RADICAL-Pilot's ZMQ bridges wait for messages instead of polling every 10 ms: a
held pilot that has nothing to do costs a little, not half a core.

Measured on an idle held local pilot (RADICAL-Pilot 1.103, this 2-core machine): its
~25 processes used 12.5 CPU-s every 30 s, 42 % of one core, for nothing. A queue
bridge (`radical/utils/zmq/queue.py`) answers every get request at once, with an empty
list when it holds nothing, and sleeps 10 ms between polls of 10 ms; each component
asks again as soon as it is answered, so bridge and component played ping-pong
~90 times a second (0.4 CPU-s per 30 s each). A pubsub bridge polls every 10 ms.

Here, in the processes started by trajflow's component starter (component_starter.py:
the bridges of the client holding the pilot and of the agent), `Bridge.create` makes
these instead of RADICAL's, and so does the client's proxy (`radical/pilot/proxy.py`,
whose task queue both ends of a pilot read):
- `HeldRequestsQueue`: a get request for an empty queue is held, and answered the
  moment a message for it arrives (sooner than RADICAL's, which the asker sees only
  at its next ask). Its get socket is a ROUTER, which speaks to RADICAL's REQ getters
  as its REP did. Held until a message comes (HELD_MAX_S at most: a connection across
  machines then carries something now and then) on the queues in HELD_QUEUES, each read
  by components that read no other queue, or that wait on all their queues at once
  (agent_0, as tasks/agent_start.py runs it: agent_waits.wait_on_all_inputs;
  RADICAL's reads its two in turn, and a held request on one keeps the other waiting
  up to 200 ms: the return of finished tasks, where a cluster's agent runs in a
  virtualenv of its own); on the others, answered empty after EMPTY_ANSWER_AFTER_S,
  about when RADICAL's would.
- `WaitingPubSub`: the same forwarding as RADICAL's, woken by a message, not a timer.
Both still look at their stop flag every IDLE_POLL_MS; RADICAL ends them by signal.
"""
import collections
import errno
import time

import zmq
from radical.utils.zmq import pubsub, queue


# RADICAL's own, kept before make_quiet_bridges swaps them
RadicalQueue = queue.Queue
RadicalPubSub = pubsub.PubSub

IDLE_POLL_MS = 1000  # how often an idle bridge looks at its stop flag
HEARTBEAT_MS = 5000  # a held request's connection is pinged this often
# a held request is answered empty after this all the same: a connection across
# machines (agent_0's to the client's proxy, over TCP) carries something that often,
# and a firewall or tunnel that drops idle connections does not drop it
HELD_MAX_S = 10.0
# a queue not held answers an empty request after this: RADICAL's answers as soon as
# its loop of two 10 ms polls and a 10 ms sleep gets to it, which paces the askers that
# ask again at once (EnTK's threads; agent_0 where not run by agent_start)
EMPTY_ANSWER_AFTER_S = 0.02
# the queues whose readers wait on nothing else, or on all their queues at once
# (radical/pilot: register_input calls; one getter socket per input of a component)
HELD_QUEUES = frozenset({
    "pmgr_launching_queue",
    "tmgr_staging_input_queue", "tmgr_scheduling_queue", "tmgr_staging_output_queue",
    "agent_staging_input_queue", "agent_scheduling_queue", "agent_executing_queue",
    "agent_staging_output_queue",
    "agent_collecting_queue", "proxy_task_queue",  # agent_0's two
})
# EnTK's queue names each read alone, with a getter of its own (radical/entk:
# rp/task_manager.py, wfprocessor.py); held as long as it takes
ENTK_HELD_QNAMES = frozenset({"pending", "completed"})
ENTK_SYNC_QNAMES = ("tmgr-to-sync", "cb-to-sync")  # its synchronizer's, read as one
ENTK_SYNC_HOLD_S = 0.1


def make_quiet_bridges():
    """Swap RADICAL's Queue and PubSub bridge classes in this process (the ones
    `ru.zmq.Bridge.create` imports when it makes a bridge) for the waiting ones."""
    queue.Queue = HeldRequestsQueue
    pubsub.PubSub = WaitingPubSub


class HeldRequestsQueue(RadicalQueue):
    """RADICAL's Queue bridge whose get requests wait for a message: for as long as it
    takes on HELD_QUEUES, up to EMPTY_ANSWER_AFTER_S on the others."""

    def longest_hold_s(self, qname):
        """How long a request for `qname` may wait for a message."""
        return HELD_MAX_S if self._channel in HELD_QUEUES else EMPTY_ANSWER_AFTER_S

    def stream_of(self, qname):
        """The buffer that a message put for `qname` joins, and a request reads."""
        return qname

    def _bridge_initialize(self):
        super()._bridge_initialize()
        # a ROUTER in place of the REP, at a new address (read after this)
        self._get.close(linger=0)
        self._get = self._ctx.socket(zmq.ROUTER)
        self._get.linger = queue._LINGER_TIMEOUT
        self._get.hwm = queue._HIGH_WATER_MARK
        # an answer to an asker that has gone raises, and goes to the next one; an asker
        # whose connection died unsaid is found gone by ZMTP's heartbeat
        self._get.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._get.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self._get.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        self._addr_get = queue.zmq_bind(self._get)

    def _bridge_work(self):
        try:
            serve_held_requests(self)
        except Exception:
            self._log.exception('bridge failed')


def serve_held_requests(bridge):
    """The bridge's loop: buffer what is put, answer each get request with up to a
    bulk of its queue's messages, holding it while there are none (an empty answer
    after the bridge's `longest_hold_s`). Queue names the bridge
    reads as one (`stream_of`) share one buffer, in the order put."""
    bridge.nin = bridge.nout = bridge.last = 0
    buffered = collections.defaultdict(collections.deque)  # stream -> messages
    waiting = collections.defaultdict(collections.deque)   # stream -> Request
    poller = zmq.Poller()
    poller.register(bridge._put, zmq.POLLIN)
    poller.register(bridge._get, zmq.POLLIN)
    while not bridge._term.is_set():
        events = dict(queue.no_intr(poller.poll, timeout=_poll_ms(waiting)))
        touched = set()
        if bridge._put in events:
            for qname, msgs in _drain_puts(bridge):
                stream = bridge.stream_of(qname)
                buffered[stream].extend(msgs)
                bridge.nin += len(msgs)
                touched.add(stream)
        if bridge._get in events:
            for asker, qname in _drain_requests(bridge):
                stream = bridge.stream_of(qname)
                waiting[stream].append(
                    Request(asker, qname, time.monotonic() + bridge.longest_hold_s(qname)))
                touched.add(stream)
        for stream in touched:
            _answer_waiting(bridge, buffered[stream], waiting[stream])
        _answer_expired(bridge, waiting)


Request = collections.namedtuple("Request", "asker qname until")  # until: answered empty


def _poll_ms(waiting):
    """Until the first held request is due an empty answer, or IDLE_POLL_MS (a few
    requests wait at a time: one per asker)."""
    due = [r.until for requests in waiting.values() for r in requests]
    if not due:
        return IDLE_POLL_MS
    return max(0, min(IDLE_POLL_MS, int((min(due) - time.monotonic()) * 1000) + 1))


def _drain_puts(bridge):
    while True:
        try:
            data = bridge._put.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return
        if len(data) != 2:
            raise RuntimeError('%d frames unsupported' % len(data))
        qname = queue.as_string(queue.from_msgpack(data[0]))
        msgs = queue.from_msgpack(data[1])
        queue.log_bulk(bridge._log, '<> %s' % qname, msgs)
        yield qname, msgs


def _drain_requests(bridge):
    while True:
        try:
            frames = bridge._get.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return
        # a REQ's request through a ROUTER: its routing id, the empty delimiter, qname
        asker, request = frames[0], frames[-1]
        yield asker, queue.as_string(request) or 'default'


def _answer_waiting(bridge, messages, requests):
    """Give the buffered messages to the askers in the order they asked, a bulk each;
    an asker that has gone is skipped and its bulk goes to the next."""
    while messages and requests:
        request = requests.popleft()
        bulk = [messages.popleft() for _ in range(min(bridge._bulk_size, len(messages)))]
        if not _answer(bridge, request, bulk):
            messages.extendleft(reversed(bulk))


def _answer_expired(bridge, waiting):
    """An empty answer to each request held as long as it may be."""
    now = time.monotonic()
    for requests in waiting.values():
        for request in [r for r in requests if r.until <= now]:
            requests.remove(request)
            _answer(bridge, request, [])


def _answer(bridge, request, bulk):
    """Send `bulk` to its asker as RADICAL's REP would; False where the asker has gone."""
    qname = request.qname
    try:
        bridge._get.send_multipart([request.asker, b'', queue.to_msgpack(qname),
                                    queue.to_msgpack(bulk)])
    except zmq.ZMQError as error:
        if error.errno != errno.EHOSTUNREACH:
            raise
        return False
    queue.log_bulk(bridge._log, '>< %s' % qname, bulk)
    bridge.nout += len(bulk)
    bridge.last = time.time()
    return True


class EntkQueue(HeldRequestsQueue):
    """EnTK's one queue bridge of a run (its AppManager's, in the client): the requests
    of its task manager and dequeue threads, each of which reads one queue name alone,
    wait for a message. Its synchronizer asks for two names in turn (tasks submitted,
    tasks' states), each answer blocking it, and treats their messages alike
    (AppManager._get_message_to_sync): here both are one stream, in the order put,
    and a request for either is answered by a message for either, or empty after
    ENTK_SYNC_HOLD_S (it looks at its stop flag between answers: EnTK joins it)."""

    def longest_hold_s(self, qname):
        if qname in ENTK_SYNC_QNAMES:
            return ENTK_SYNC_HOLD_S
        return HELD_MAX_S if qname in ENTK_HELD_QNAMES else EMPTY_ANSWER_AFTER_S

    def stream_of(self, qname):
        return ENTK_SYNC_QNAMES[0] if qname in ENTK_SYNC_QNAMES else qname


class WaitingPubSub(RadicalPubSub):
    """RADICAL's PubSub bridge, forwarding when a message comes instead of every 10 ms."""

    def _bridge_work(self):
        forward = {self._xsub: self._xpub,   # subscriptions, to the publishers
                   self._xpub: self._xsub}   # messages, to the subscribers
        while not self._term.is_set():
            events = dict(pubsub.no_intr(self._poll.poll, timeout=IDLE_POLL_MS))
            for source in events:
                while True:
                    try:
                        msg = source.recv(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    forward[source].send(msg)
                    pubsub.log_bulk(self._log, '<> %s' % self.uid, [msg])


def quiet_proxy_bridges():
    """The bridges of this process' RADICAL proxy (made in a process it forks) are the
    waiting ones too; once."""
    from radical.pilot import proxy
    quiet_bridges_of(proxy)


def quiet_bridges_of(module, queue_class=None):
    """The bridges `module` makes with `ru.zmq.Queue` and `ru.zmq.PubSub` are the
    waiting ones (its queues of `queue_class`); once."""
    if not isinstance(module.ru, UtilsWithQuietBridges):
        module.ru = UtilsWithQuietBridges(module.ru, queue_class or HeldRequestsQueue)


class UtilsWithQuietBridges:
    """radical.utils as one module sees it: its zmq's Queue and PubSub are the waiting
    ones, everything else is RADICAL's."""

    def __init__(self, ru, queue_class):
        self._ru = ru
        self.zmq = ZmqWithQuietBridges(ru.zmq, queue_class)

    def __getattr__(self, name):
        return getattr(self._ru, name)


class ZmqWithQuietBridges:
    """radical.utils.zmq as one module sees it: its Queue and PubSub are the waiting
    ones."""
    PubSub = WaitingPubSub

    def __init__(self, zmq_module, queue_class):
        self._zmq = zmq_module
        self.Queue = queue_class

    def __getattr__(self, name):
        return getattr(self._zmq, name)
