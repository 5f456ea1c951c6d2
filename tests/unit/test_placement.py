"""Tasks leave the cores kept for RADICAL's agent (tasks/placement.py), and the advice
says how long ranks waited for a CPU others held (no process started: the
affinity of this test's own process is changed and put back)."""
import os
import socket

import pytest

from trajflow.tasks.placement import (AGENT_CORES_ENV, agent_positions, DEFAULT_TIMER_SLACK_NS,
                                      drop_radical_timer_slack, leave_agent_cpus,
                                      RADICAL_TIMER_SLACK_NS, runqueue_wait_s, set_timer_slack,
                                      split_cpus, timer_slack_ns)
from trajflow.tasks.timing import RankTimer
from trajflow.workflows.profile.advice import cpu_wait_note

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")


@pytest.fixture
def restored_affinity():
    before = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, before)


@pytest.fixture
def restored_timer_slack():
    before = timer_slack_ns()
    yield
    if before is not None:
        set_timer_slack(before)


@pytest.mark.skipif(timer_slack_ns() is None, reason="the kernel has no timerslack_ns")
def test_a_task_that_inherited_radicals_timer_slack_goes_back_to_the_default(restored_timer_slack):
    assert set_timer_slack(RADICAL_TIMER_SLACK_NS)
    assert timer_slack_ns() == RADICAL_TIMER_SLACK_NS
    drop_radical_timer_slack()
    assert timer_slack_ns() == DEFAULT_TIMER_SLACK_NS
    assert set_timer_slack(3_000_000)  # a slack someone else chose is theirs
    drop_radical_timer_slack()
    assert timer_slack_ns() == 3_000_000


def test_the_kept_positions_are_read_from_the_environment():
    assert agent_positions({}) == ()
    assert agent_positions({AGENT_CORES_ENV: ""}) == ()
    assert agent_positions({AGENT_CORES_ENV: "3, 0"}) == (0, 3)


def test_positions_are_among_the_cpus_a_node_allows():
    """A job confined to CPUs 8-11 keeps CPU 8 for position 0, as RADICAL means it; a
    position past the node's CPUs keeps nothing; a node of kept CPUs alone keeps none."""
    assert split_cpus((0,), [8, 9, 10, 11]) == ([8], [9, 10, 11])
    assert split_cpus((1, 3), [8, 9, 10, 11]) == ([9, 11], [8, 10])
    assert split_cpus((7,), [8, 9]) == ([], [8, 9])
    assert split_cpus((0,), [8]) == ([], [8])


@needs_two
def test_a_task_leaves_the_agents_core(restored_affinity):
    assert leave_agent_cpus({AGENT_CORES_ENV: "0"}) == CPUS[1:]


@needs_two
def test_a_task_that_inherited_the_agents_pin_moves_to_the_other_cpus(restored_affinity):
    os.sched_setaffinity(0, {CPUS[0]})  # as a task started by the pinned agent is
    assert leave_agent_cpus({AGENT_CORES_ENV: "0"}) == CPUS[1:]


def test_without_kept_cores_a_task_stays(restored_affinity):
    assert leave_agent_cpus({}) == CPUS


def test_a_rank_records_its_cpus_and_its_wait_for_one():
    timer = RankTimer("analyze")
    record = timer.record()
    assert record["cpus"] == CPUS
    wait = runqueue_wait_s()
    if wait is None:
        assert record["t_cpu_wait"] is None
    else:
        assert 0.0 <= record["t_cpu_wait"] <= record["t_total"] + 0.01


def ranks(wait, total=10.0, host=None, n=2):
    return [{"task": "analyze", "rank": r, "t_total": total, "t_cpu_wait": wait,
             "host": host or socket.gethostname()} for r in range(n)]


def test_a_wait_for_a_cpu_worth_saying_is_said_with_who_held_it():
    here = cpu_wait_note(ranks(2.0))
    assert "waited 4.0 s of their 20.0 s (20%)" in here
    assert "RADICAL's agent and client and EnTK" in here and "local.localhost_agent_core" in here
    placed = ranks(2.0)
    for r in placed:
        r["cpus"] = CPUS[1:]
    if len(CPUS) > 1:  # RADICAL had a core of its own already: not suggested again
        text = cpu_wait_note(placed)
        assert "other programs running here" in text and "agent_core" not in text
    there = cpu_wait_note(ranks(2.0, host="node-that-is-not-here"))
    assert "other jobs or daemons" in there and "blocked_cores" in there


@pytest.mark.parametrize("wait, total", [(0.0, 10.0), (None, 10.0), (0.9, 10.0), (0.2, 1.0)])
def test_a_small_or_unknown_wait_is_not_said(wait, total):
    """Under a tenth of the ranks' time, or under half a second in all: not said."""
    assert cpu_wait_note(ranks(wait, total)) == ""
