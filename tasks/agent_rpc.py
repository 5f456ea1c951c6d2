"""A pilot's agent sends its own RPC request again when no answer comes, so that a
request lost at its start no longer hangs the pilot.

RADICAL-Pilot 1.103's agent_0 subscribes to its control channel and, a few
milliseconds later, publishes its first RPC request on it (`prepare_env`, the
`rp` environment; `radical/pilot/utils/component.py` `_initialize`, then
`agent/agent_0.py` `initialize`). A ZMQ subscription takes effect only once its
connection to the channel's bridge is up (RADICAL waits 10 ms after connecting,
nothing after subscribing). A request that reaches the bridge first is dropped
(ZMQ's "slow joiner"), and `rpc()` then waits for ever: the pilot's job runs,
its agent never reports ready, and trajflow's start watch
(workflows/run/pilot_start.py) cancels it at the start bound (300 s). A
publisher and a subscriber made as RADICAL makes them, then one message
published, lost it 1 time in 30 on this 2-core workstation, idle or loaded.

Here the request is published again (the same uid) while no answer has come,
after RESEND_AFTER_S, and a request is handled once per uid however many times
it arrives. A copy is not answered again: the agent asks itself (its own
publisher and subscriber), so once a request came through, its answer does too.
A resend and the handler's own publishes come from two threads, so publishes
are made one at a time (a ZMQ socket is not thread-safe). Applied in the
agent's own process (tasks/agent_start.py) before its script runs, wherever the
agent starts through it (a pilot in this virtualenv); nothing else of RADICAL
changes.
"""
import os
import threading
import time

# the waits for an answer before the request is sent again (the last one repeats); the
# agent's first request took 0.4 s here, 1.9 s with 3 pilots starting on 2 cores
RESEND_AFTER_S = (3.0, 6.0, 12.0, 20.0)
HANDLED = "_trajflow_rpcs_handled"  # a component's set of the request uids it handled
# testing hook: "1" - the first send of each request is not made (lost, as at the start)
LOSE_FIRST_SEND = "TRAJFLOW_TEST_LOSE_FIRST_RPC"


def resend_waits():
    """The waits between sends (RESEND_AFTER_S), without end."""
    yield from RESEND_AFTER_S
    while True:
        yield RESEND_AFTER_S[-1]


def rpc_sent_until_answered(component, cmd, *args, rpc_addr=None, **kwargs):
    """RADICAL-Pilot's BaseComponent.rpc, whose request is published again while it
    is not answered."""
    import radical.utils as ru
    from radical.pilot import constants
    from radical.pilot.messages import RPCRequestMessage
    rpc_id = ru.generate_id("%s.rpc" % component._uid)
    request = RPCRequestMessage(uid=rpc_id, cmd=cmd, addr=rpc_addr, args=args,
                                kwargs=kwargs)
    waiting = {"req": request, "res": None, "evt": threading.Event(), "time": time.time()}
    component._rpc_reqs[rpc_id] = waiting
    try:
        lose_first = os.environ.get(LOSE_FIRST_SEND) == "1"
        for sends, wait_s in enumerate(resend_waits(), start=1):
            if not (lose_first and sends == 1):
                component.publish(constants.CONTROL_PUBSUB, request)
            if waiting["evt"].wait(wait_s):
                break
            component._log.warning("rpc request %s (%s) not answered after %d send(s), "
                                   "the last %.0f s ago: sent again", rpc_id, cmd, sends,
                                   wait_s)
    finally:
        del component._rpc_reqs[rpc_id]
    answer = waiting["res"]
    if answer.exc:
        raise RuntimeError("rpc failed: %s" % (answer.exc,))
    return answer.val


def handled_once(handle):
    """BaseComponent._handle_rpc_msg that handles a request it has a handler for once
    per uid (a request sent again after its first send came through is ignored)."""
    def handle_once(component, msg):
        handler = component._rpc_handlers.get(msg.cmd)
        if handler is not None and (not msg.addr or msg.addr == handler[1]):
            handled = component.__dict__.setdefault(HANDLED, set())
            if msg.uid in handled:
                component._log.debug("rpc request %s came again: handled already", msg.uid)
                return
            handled.add(msg.uid)
        handle(component, msg)
    handle_once.__wrapped__ = handle
    return handle_once


def one_at_a_time(publish):
    """BaseComponent.publish, never entered by two threads at once."""
    lock = threading.Lock()

    def publish_alone(component, *args, **kwargs):
        with lock:
            return publish(component, *args, **kwargs)
    publish_alone.__wrapped__ = publish
    return publish_alone


def resend_unanswered_rpcs(component_class=None):
    """Patch RADICAL-Pilot's component class (or `component_class`) in this process,
    once."""
    if component_class is None:
        from radical.pilot.utils.component import BaseComponent as component_class
    if hasattr(component_class._handle_rpc_msg, "__wrapped__"):
        return
    component_class.rpc = rpc_sent_until_answered
    component_class._handle_rpc_msg = handled_once(component_class._handle_rpc_msg)
    component_class.publish = one_at_a_time(component_class.publish)
