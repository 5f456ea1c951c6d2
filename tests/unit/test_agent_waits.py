"""A pilot's agent looks for work every 10 ms when idle (tasks/agent_waits.py): the
sleeps of the modules named are capped, nothing else of them changes, and a module that
is not as expected is left alone."""
import sys
import time
import types

from trajflow.tasks.agent_waits import CappedSleeps, IDLE_WAITS, shorten_agent_waits


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
    import subprocess
    said = subprocess.run([sys.executable, "-c", "import sys, time, radical.pilot\n"
                           f"for name in {IDLE_WAITS!r}:\n"
                           "    print(name in sys.modules and sys.modules[name].time is time)"],
                          capture_output=True, text=True, timeout=120)
    assert said.stdout.split() == ["True"] * len(IDLE_WAITS), said.stderr
