"""Testing hooks that inject known faults; inert unless their variable is set.

TRAJFLOW_TEST_DELAY=<block>:<phase>:<seconds>[,...] makes that block sleep in
that phase (open, io, compute, comm), so that tests can check the profiler
finds exactly that straggler and names that phase.
"""
import os
import time

_PHASE_ALIASES = {"open": "open", "io": "io", "compute": "compute", "comm": "comm"}


def _parse_delays():
    spec = os.environ.get("TRAJFLOW_TEST_DELAY", "").strip()
    delays = {}
    if not spec:
        return delays
    for item in spec.split(","):
        try:
            block, phase, seconds = item.split(":")
            delays[(int(block), _PHASE_ALIASES[phase])] = float(seconds)
        except (ValueError, KeyError):
            raise SystemExit(f"TRAJFLOW_TEST_DELAY={spec!r}: expected <block>:<phase>:<seconds> "
                             f"with phase one of {sorted(_PHASE_ALIASES)}")
    return delays


_DELAYS = _parse_delays()
_DONE = set()


def delay(block, phase):
    """Sleep once per (block, phase) when asked to by TRAJFLOW_TEST_DELAY."""
    key = (block, phase)
    if key in _DELAYS and key not in _DONE:
        _DONE.add(key)
        time.sleep(_DELAYS[key])
