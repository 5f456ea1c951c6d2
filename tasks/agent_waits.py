"""A pilot's agent looks for work sooner: its scheduler waits at most AGENT_IDLE_S
between looks when idle, instead of RADICAL-Pilot's fixed 0.1 s.

RADICAL-Pilot 1.103's agent scheduler sleeps 0.1 s whenever a pass of its loop found
nothing to do (`radical/pilot/agent/scheduler/base.py`, "FIXME: configurable"): a task
sent to an idle pilot waited 0.02-0.13 s to be given cores, in a warm run of 0.7-0.8 s.
The module calls `time.sleep`; it is given a `time` whose sleep is capped, and nothing
else of it changes. Applied in the agent's component starter (component_starter.py,
started by agent_start.py) before any component is forked, so only the agent's own
processes look sooner: the client's, and any other Python's, are as RADICAL makes them.

Only modules the starter has imported already are capped, never one imported for this:
the Popen executor's watcher also sleeps (0.05 s), but importing its module installs
RADICAL's SIGTERM and SIGINT handlers (they end the executor's tasks and not the
process), which every bridge and component forked from the starter would inherit.
"""
import logging
import sys
import time

log = logging.getLogger(__name__)

AGENT_IDLE_S = 0.01
# the modules whose idle sleeps are capped (in 1.103 the scheduler's only sleep; imported
# with radical.pilot, as the starter imports it)
IDLE_WAITS = ("radical.pilot.agent.scheduler.base",)


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
    of those capped (one not imported, or whose `time` is something else, is left
    alone and said in the log)."""
    capped = []
    for name in modules:
        module = sys.modules.get(name)
        if module is not None and getattr(module, "time", None) is time:
            module.time = CappedSleeps(longest)
            capped.append(name)
        else:
            log.debug("%s is not imported or has no time module of its own: not capped", name)
    return capped
