"""A rank's record names its time (tasks/timing.py): phases nest without counting a
second twice, the set-up from main() is the rank's own time, and what no phase names
(`t_overhead`) is what it says."""
import time

import pytest
from hypothesis import given, settings, strategies as st

from trajflow.tasks.timing import PHASES, RankTimer


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_an_inner_phase_is_cut_out_of_its_outer_one():
    timer = RankTimer("analyze")
    with timer.phase("setup"):
        busy(0.02)
        with timer.phase("open_trajectory"):
            busy(0.03)
        busy(0.01)
    totals = timer.totals()
    spans = sorted(timer.intervals, key=lambda iv: iv[1])
    assert [name for name, _, _ in spans] == ["setup", "open_trajectory", "setup"]
    for (_, _, end), (_, start, _) in zip(spans, spans[1:]):
        assert start >= end  # no second is in two intervals
    # each phase is its own fragments' time (at least what it was busy: a loaded machine
    # only lengthens them), and together they are the outer phase's whole span
    (_, a0, a1), (_, b0, b1), (_, c0, c1) = spans
    # (time.time() intervals around perf_counter() busy loops: a millisecond of slack)
    assert totals["t_open_trajectory"] == pytest.approx(b1 - b0) and b1 - b0 >= 0.029
    assert totals["t_setup"] == pytest.approx((a1 - a0) + (c1 - c0)) and a1 - a0 >= 0.019
    assert totals["t_setup"] + totals["t_open_trajectory"] == pytest.approx(c1 - a0, abs=1e-4)


@settings(max_examples=40, deadline=None)
@given(st.recursive(st.just([]), lambda inner: st.lists(
    st.tuples(st.sampled_from(PHASES), inner), max_size=3), max_leaves=12))
def test_nested_phases_never_overlap_and_cover_their_outermost(tree):
    """Whatever the nesting, the intervals are disjoint and together span exactly the
    outermost phases (nothing is counted twice, nothing inside them is lost)."""
    timer = RankTimer("analyze")

    def enter(nodes):
        for name, children in nodes:
            with timer.phase(name):
                enter(children)

    outer = []
    for name, children in tree:
        t0 = time.time()
        enter([(name, children)])
        outer.append(time.time() - t0)
    spans = sorted(timer.intervals, key=lambda iv: iv[1])
    for (_, a0, a1), (_, b0, _) in zip(spans, spans[1:]):
        assert a1 <= b0
    counted = sum(b - a for _, a, b in spans)
    assert counted <= sum(outer) + 1e-9
    assert counted >= sum(outer) - 2e-4 * max(1, len(spans))
    assert timer.open_phases == []


def test_setup_marks_start_the_clock_and_are_said_part_by_part():
    t0 = time.time()
    marks = [("plan", t0 - 0.5), ("imports", t0 - 0.4), ("mpi_init", t0 - 0.1)]
    timer = RankTimer("analyze", setup_marks=marks)
    with timer.phase("io"):
        busy(0.01)
    timer.t_stop = time.time()
    totals = timer.totals()
    assert timer.t_start == t0 - 0.5
    [(_, s0, s1)] = [iv for iv in timer.intervals if iv[0] == "setup"]
    assert (s0, totals["t_setup"]) == (t0 - 0.5, pytest.approx(s1 - s0)) and s1 - s0 >= 0.5
    parts = timer.info["setup_parts"]
    assert list(parts) == ["plan", "imports", "mpi_init"]
    assert parts["plan"] == pytest.approx(0.1) and parts["imports"] == pytest.approx(0.3)
    assert parts["mpi_init"] == pytest.approx(s1 - (t0 - 0.1))  # to the record's start
    # only the moments between the timer's own steps are in no phase
    assert 0 <= totals["t_overhead"] == pytest.approx(
        totals["t_total"] - totals["t_setup"] - totals["t_io"])


def test_time_outside_every_phase_is_reported_as_overhead():
    timer = RankTimer("analyze")
    with timer.phase("compute"):
        busy(0.01)
    before = time.time()
    busy(0.04)  # no phase: the record must say so, not hide it
    timer.t_stop = time.time()
    totals = timer.totals()
    assert totals["t_overhead"] == pytest.approx(totals["t_total"] - totals["t_compute"])
    assert totals["t_overhead"] >= timer.t_stop - before - 1e-3 >= 0.039


def test_a_phase_that_raises_is_still_timed_and_closed():
    timer = RankTimer("analyze")
    with pytest.raises(ZeroDivisionError):
        with timer.phase("setup"):
            with timer.phase("compute"):
                1 / 0
    assert [name for name, _, _ in timer.intervals] == ["setup", "compute", "setup"]
    assert timer.open_phases == []


def test_progress_is_written_in_a_named_phase(tmp_path):
    path = tmp_path / "progress" / "block_00000"
    timer = RankTimer("analyze", progress_path=str(path))
    with timer.phase("compute"):
        timer.progress(5)
    assert path.read_text() == "5\n"
    assert any(name == "progress" for name, _, _ in timer.intervals)
    with timer.phase("wait"):  # nothing new since: not written again
        pass
    assert sum(name == "progress" for name, _, _ in timer.intervals) == 1
