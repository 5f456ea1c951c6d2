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


def ranks(wait, total=10.0, host=None, n=2, neighbours=None):
    """n analyze ranks' records; the first one with what it measured of its node."""
    recs = [{"task": "analyze", "rank": r, "t_total": total, "t_cpu_wait": wait,
             "host": host or socket.gethostname()} for r in range(n)]
    if neighbours is not None:
        recs[0]["cpu_neighbours"] = {"window_s": total, "node_cpus": 2, "by_kind": {
            kind: sum(s for _, _, k, s in neighbours if k == kind)
            for kind in ("this run", "other runs", "RADICAL", "other")},
            "top": [list(e) for e in neighbours]}
    return recs


def test_a_wait_for_a_cpu_is_answered_by_who_was_measured_to_hold_it():
    """The culprit is the one the node's first rank measured: another program is named
    (the agent is not blamed), RADICAL gets the kept core, the run's own ranks fewer
    ranks; a record without the measurement says so and advises nothing."""
    other = cpu_wait_note(ranks(2.0, neighbours=[["stress-ng", 4242, "other", 7.5],
                                                 ["python3", 17, "RADICAL", 0.4]]))
    assert "waited 4.0 s of their 20.0 s (20%)" in other
    assert "other used 7.5 CPU-s, RADICAL used 0.4 CPU-s" in other
    assert "stress-ng pid 4242, other, 7.5 s" in other
    assert "neither trajflow's nor RADICAL's" in other and "agent_core" not in other
    agent = cpu_wait_note(ranks(2.0, neighbours=[["python3", 17, "RADICAL", 3.0]]))
    assert "local.localhost_agent_core" in agent
    there = cpu_wait_note(ranks(2.0, host="node-that-is-not-here",
                                neighbours=[["python3", 17, "RADICAL", 3.0]]))
    assert "blocked_cores" in there and "agent_core" not in there
    own = cpu_wait_note(ranks(2.0, neighbours=[["python", 99, "this run", 5.0]]))
    assert "fewer ranks" in own and "agent" not in own
    little = cpu_wait_note(ranks(2.0, neighbours=[["python3", 17, "RADICAL", 0.3]]))
    assert "too little to explain the wait" in little and "agent_core" not in little
    empty = cpu_wait_note(ranks(2.0, neighbours=[]))
    assert "no other process was seen" in empty and "(most" not in empty
    unmeasured = cpu_wait_note(ranks(2.0))
    assert unmeasured.endswith("who held it was not measured (records of an older trajflow).")
    planted = ranks(2.0)
    planted[0]["cpu_neighbours"] = {"by_kind": {"other": "x"}, "top": [["a", "b", "c", "d"]]}
    assert "not measured" in cpu_wait_note(planted)


def spinner(cpu_s, *words, title=None, retitled=False):
    """A command: Python spins `cpu_s` of CPU, says so, then sleeps; `words` follow on its
    command line (as a task's: trajflow.tasks.analyze --plan RUNDIR/plan.json); `title`:
    its process name (PR_SET_NAME, as RADICAL's components rename themselves)."""
    import sys
    code = (f"import time\nwhile time.process_time() < {cpu_s}: pass\n"
            "print(1, flush=True)\ntime.sleep(30)")
    if title:
        code = f"import ctypes\nctypes.CDLL(None).prctl(15, {title!r}.encode(), 0, 0, 0)\n" + code
    if retitled:  # as a task forked by the pilot's task server shows its command line
        code = ("import setproctitle\nsetproctitle.setproctitle("
                f"{' '.join(['python', '-m', *words])!r})\n") + code
    return [sys.executable, "-c", code, *words]


def measured_beside(sampler, commands):
    """(sampler.measure() taken once every command has spun, their Popens), every
    process named however loaded the machine; the commands are ended, by pid."""
    import subprocess
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in commands]
    try:
        for p in procs:
            assert p.stdout.readline() == "1\n"
        return sampler.measure(top=10_000), procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=60)
            p.stdout.close()


def test_the_first_rank_of_a_node_measures_who_else_ran(tmp_path):
    """A process busy beside the rank is seen, named and counted as another's; the
    rank's own CPU is not counted."""
    from trajflow.tasks.cpu_neighbours import CpuNeighbours, first_on_node
    assert first_on_node(3, {"MPI_LOCALRANKID": "0"}) and not first_on_node(0, {"SLURM_LOCALID": "1"})
    assert first_on_node(0, {}) and not first_on_node(1, {})
    seen, [busy] = measured_beside(CpuNeighbours(str(tmp_path)), [spinner(0.5)])
    [mine] = [e for e in seen["top"] if e[1] == busy.pid]
    assert mine[2] == "other" and mine[3] >= 0.45, seen
    assert seen["by_kind"]["other"] >= mine[3] and seen["node_cpus"] == os.cpu_count()


@pytest.mark.parametrize("retitled", [False, True])
def test_radicals_renamed_components_and_other_runs_are_named_so(tmp_path, retitled):
    """RADICAL's components title themselves rp.<uid> (their command line replaced):
    they are RADICAL's; another trajflow run's task is another run's; this run's other
    rank is counted apart where it has a CPU of its own, its other tasks are this run's
    (also where its command line is one retitled string: a task forked by the pilot's
    task server)."""
    from trajflow.tasks.cpu_neighbours import CpuNeighbours
    mine = tmp_path / "mine"
    # command lines as a task's (python -m trajflow.tasks.analyze --plan RUNDIR/plan.json)
    as_task = ["trajflow.tasks.analyze", "--plan"]
    seen, procs = measured_beside(CpuNeighbours(str(mine)), [
        spinner(0.2, title="rp.agent_schedu"),
        spinner(0.2, *as_task, str(tmp_path / "other" / "plan.json"), retitled=retitled),
        spinner(0.2, *as_task, str(mine / "plan.json"), retitled=retitled),
        spinner(0.2, "trajflow.tasks.reduce", "--plan", str(mine / "plan.json"))])
    kinds = {pid: kind for _, pid, kind, _ in seen["top"]}
    assert kinds[procs[0].pid] == "RADICAL" and kinds[procs[1].pid] == "other runs", seen
    # this run's other rank has a CPU of its own (2 ranks, at least 2 CPUs): counted
    # apart, blamed for nothing; its reduce task is this run's
    assert procs[2].pid not in kinds and seen["run_ranks_here"] == 2, seen
    assert seen["own_ranks_s"] >= 0.15 and kinds[procs[3].pid] == "this run", seen


@pytest.mark.parametrize("wait, total", [(0.0, 10.0), (None, 10.0), (0.9, 10.0), (0.2, 1.0)])
def test_a_small_or_unknown_wait_is_not_said(wait, total):
    """Under a tenth of the ranks' time, or under half a second in all: not said."""
    assert cpu_wait_note(ranks(wait, total)) == ""


def test_one_measurement_a_node_counts_where_every_task_measured():
    """In tasks mode every task of a node measures, over windows that overlap: the
    longest one a host counts, not their sum."""
    from trajflow.workflows.profile.advice import cpu_neighbours
    recs = ranks(2.0, n=3, neighbours=[["stress-ng", 4242, "other", 7.5]])
    for r, seconds in zip(recs[1:], (3.0, 5.0)):
        r["cpu_neighbours"] = {"window_s": 5.0, "by_kind": {"other": seconds},
                               "top": [["stress-ng", 4242, "other", seconds]]}
    by_kind, top = cpu_neighbours(recs)
    assert by_kind == {"this run": 0.0, "other runs": 0.0, "RADICAL": 0.0, "other": 7.5}
    assert top == [("stress-ng", 4242, "other", 7.5)]
    recs[2]["host"] = "node-2"
    assert cpu_neighbours(recs)[0]["other"] == 7.5 + 5.0


def test_a_runs_ranks_that_outnumber_their_cpus_are_the_culprit(tmp_path):
    """Four ranks of one run (this process and three more) on the CPUs of this machine,
    which has fewer: they outnumber their CPUs, so their time is this run's."""
    from trajflow.tasks.cpu_neighbours import allowed_cpus, CpuNeighbours
    if len(allowed_cpus([os.getpid()])) >= 4:
        pytest.skip("this machine gives a process 4 CPUs or more: four ranks are not crowded")
    mine = tmp_path / "mine"
    seen, procs = measured_beside(CpuNeighbours(str(mine)), [
        spinner(0.2, "trajflow.tasks.analyze", "--plan", str(mine / "plan.json"))] * 3)
    kinds = {pid: kind for _, pid, kind, _ in seen["top"]}
    assert seen["run_ranks_here"] == 4 and seen["own_ranks_s"] == 0.0, seen
    assert all(kinds[p.pid] == "this run" for p in procs), seen
    assert seen["by_kind"]["this run"] >= 0.55  # each spun 0.2 CPU-s
