"""A pilot's agent looks for work sooner: its scheduler and executor wait at most
AGENT_IDLE_S between looks when idle, instead of RADICAL-Pilot's fixed 0.1 s and 0.05 s.

RADICAL-Pilot 1.103's agent scheduler sleeps 0.1 s whenever a pass of its loop found
nothing to do (`radical/pilot/agent/scheduler/base.py`, "FIXME: configurable"), and its
Popen executor's watcher 0.05 s: a task sent to an idle pilot waited 0.05-0.1 s to be
given cores, and its end was seen up to 0.05 s late, in a warm run of 0.7-0.8 s. Both
modules call `time.sleep`; each is given a `time` whose sleep is capped, and nothing
else of theirs changes. Applied in the agent's component starter
(component_starter.py, started by agent_start.py) before any component is forked, so
only the agent's own processes look sooner: the client's, and any other Python's, are
as RADICAL makes them.
"""
import logging
import time

log = logging.getLogger(__name__)

AGENT_IDLE_S = 0.01
# the modules whose idle sleeps are capped (their only sleeps in 1.103)
IDLE_WAITS = ("radical.pilot.agent.scheduler.base", "radical.pilot.agent.executing.popen")


class CappedSleeps:
    """The `time` module as one module sees it, with its sleeps at most `longest`."""

    def __init__(self, longest):
        self.longest = longest

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds):
        time.sleep(min(seconds, self.longest))


def shorten_agent_waits(longest=AGENT_IDLE_S, modules=IDLE_WAITS):
    """Cap the sleeps of `modules` (their names) that use the `time` module; the names
    of those capped (one missing, or whose `time` is something else, is left alone)."""
    import importlib
    capped = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "time", None) is time:
            module.time = CappedSleeps(longest)
            capped.append(name)
    return capped
