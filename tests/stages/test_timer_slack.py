"""A task started by a local pilot inherits the timer slack its pilot's process gave
RADICAL (tasks/placement.py) and drops it as `trajflow.tasks` is imported, before
its own waits begin: a real process started with the pilot's slack."""
import os
import subprocess
import sys

import pytest

from trajflow.tasks.placement import (DEFAULT_TIMER_SLACK_NS, RADICAL_TIMER_SLACK_NS,
                                      timer_slack_ns)

pytestmark = pytest.mark.skipif(timer_slack_ns() is None, reason="the kernel has no timerslack_ns")

# as a RADICAL process starts a task: the slack set, then exec (which keeps it)
LAUNCH = f"""
import ctypes, os, sys
assert ctypes.CDLL(None).prctl(29, ctypes.c_ulong({RADICAL_TIMER_SLACK_NS}), 0, 0, 0) == 0
os.execv(sys.executable, [sys.executable, "-c", sys.argv[1]])
"""
READ = "print(open('/proc/self/timerslack_ns').read().strip(), end=' ')"


def test_a_task_drops_the_pilots_timer_slack_and_a_plain_process_keeps_it():
    task = subprocess.run([sys.executable, "-c", LAUNCH, f"{READ}; import trajflow.tasks; {READ}"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert task.stdout.split() == [str(RADICAL_TIMER_SLACK_NS), str(DEFAULT_TIMER_SLACK_NS)], task
    other = subprocess.run([sys.executable, "-c", LAUNCH, f"import os; {READ}"],
                           capture_output=True, text=True, timeout=120, check=True, env=os.environ)
    assert other.stdout.split() == [str(RADICAL_TIMER_SLACK_NS)], other
