"""How ranks share frames (tasks/schedules.py), how their rows are put back in order
(tasks/analyze.py), and what the profile says a schedule did (schedule_effects.py)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from trajflow.tasks.analyze import chunk_order, join_pieces
from trajflow.tasks.modes import MODES
from trajflow.tasks.parts import read_part, write_part
from trajflow.tasks.plan import balanced_blocks
from trajflow.tasks.schedules import CHUNKS_PER_BLOCK, MIN_CHUNK_FRAMES, SCHEDULES
from trajflow.workflows.profile.schedule_effects import mpi_effect, mpi_lines, schedule_advice


class _Plan:
    def __init__(self, n_frames, n_blocks):
        self.blocks = balanced_blocks(n_frames, n_blocks)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(1, 5000), st.integers(1, 64))
def test_dynamic_chunks_cover_every_frame_once_inside_its_block(n_frames, n_blocks):
    n_blocks = min(n_blocks, n_frames)
    plan = _Plan(n_frames, n_blocks)
    chunks = SCHEDULES["dynamic"].chunks(plan)
    assert [c.id for c in chunks] == list(range(len(chunks)))
    assert np.array_equal(np.concatenate([np.arange(c.start, c.stop) for c in chunks]),
                          np.arange(n_frames))  # in frame order, none twice, none lost
    for c in chunks:
        lo, hi = plan.blocks[c.block]
        assert lo <= c.start < c.stop <= hi
    per_block = np.bincount([c.block for c in chunks], minlength=n_blocks)
    sizes = [hi - lo for lo, hi in plan.blocks]
    assert all(n <= CHUNKS_PER_BLOCK for n in per_block)
    assert all(n == 1 or size // n >= MIN_CHUNK_FRAMES for n, size in zip(per_block, sizes))
    order = SCHEDULES["dynamic"].claim_order(chunks)
    assert sorted(c.id for c in order) == [c.id for c in chunks]
    # ranks starting together begin in different blocks
    assert [c.block for c in order[:n_blocks]] == list(range(n_blocks))


def test_static_chunks_are_the_blocks():
    plan = _Plan(98, 3)
    assert [(c.block, c.start, c.stop) for c in SCHEDULES["static"].chunks(plan)] == \
        [(0, 0, 33), (1, 33, 66), (2, 66, 98)]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(2, 300), st.integers(1, 6), st.randoms(use_true_random=False))
def test_rows_gathered_rank_after_rank_come_back_in_frame_order(tmp_path_factory, n_frames,
                                                                n_ranks, rnd):
    """However the chunks fell to the ranks, and whatever rows a chunk has (one per
    frame, or one pickled blob per chunk), the root writes them in chunk order (the part
    read back, its checksum over what was written)."""
    n_ranks = min(n_ranks, n_frames)
    chunks = SCHEDULES["dynamic"].chunks(_Plan(n_frames, n_ranks))
    owners = [rnd.randrange(n_ranks) for _ in chunks]
    layout = {"frame": (np.dtype(np.int64), ()), "blob": (np.dtype(np.uint8), ()),
              "xyz": (np.dtype(np.float32), (3,))}
    per_rank = []
    for rank in range(n_ranks):
        mine = [c for c, o in zip(chunks, owners) if o == rank]
        rnd.shuffle(mine)  # the order a rank claimed them in
        pieces = [(c.id, {"frame": np.arange(c.start, c.stop),
                          "blob": np.full(c.id % 3 + 1, c.id, dtype=np.uint8),
                          "xyz": np.tile(np.arange(c.start, c.stop, dtype=np.float32)[:, None],
                                         (1, 3))}) for c in mine]
        per_rank.append(join_pieces(pieces, layout))
    gathered = {k: np.concatenate([arrays[k] for arrays, _ in per_rank]) for k in layout}
    part = str(tmp_path_factory.mktemp("part") / "mpi.h5")
    write_part(part, gathered, {}, row_order=chunk_order([rows for _, rows in per_rank]))
    ordered, _ = read_part(part)
    assert np.array_equal(ordered["frame"], np.arange(n_frames))
    assert np.array_equal(ordered["xyz"][:, 2], np.arange(n_frames))
    assert np.array_equal(ordered["blob"], np.concatenate(
        [np.full(c.id % 3 + 1, c.id, dtype=np.uint8) for c in chunks]))


def _rank(rank, frames, seconds, schedule, n_chunks=8, t0=100.0):
    """A rank's record whose chunks ran back to back, `seconds` in all."""
    step = seconds / n_chunks
    chunks = [[rank * n_chunks + i, rank, 0, 0, t0 + i * step, t0 + (i + 1) * step]
              for i in range(n_chunks)]
    intervals = [["compute", c[4], c[5]] for c in chunks]
    return {"task": "analyze", "mode": "mpi", "rank": rank, "frames": frames,
            "schedule": schedule, "chunks": chunks, "intervals": intervals,
            "t_io": 0.0, "t_compute": seconds}


def test_a_dynamic_run_with_a_slow_rank_says_how_the_schedule_helped():
    """Rank 1 at a quarter of rank 0's speed did a fifth of the frames, both ending
    together: static halves would have taken 2.5x as long."""
    members = [_rank(0, 8000, 2.0, "dynamic"), _rank(1, 2000, 2.0, "dynamic")]
    effect = mpi_effect(members)
    assert effect["slow"] == [(1, 0.25, 0.2)]
    assert effect["static_s"] == 5000 / 1000  # rank 1's half at 1,000 frames/s
    assert effect["balanced_s"] == 10000 / 5000
    lines = mpi_lines(effect)
    assert lines[0] == ("rank 1 ran at 0.25x the others' speed; dynamic scheduling gave it 20% "
                        "of the frames")
    assert "3.00 s sooner than static blocks would have" in lines[1]


def test_a_static_run_with_a_slow_rank_is_advised_a_dynamic_schedule():
    members = [_rank(0, 5000, 1.25, "static", 1), _rank(1, 5000, 5.0, "static", 1)]
    plan = type("Plan", (), {"execution": MODES["mpi"]})()
    text = schedule_advice(plan, members)
    assert "--schedule dynamic" in text and "about 3.0 s sooner" in text
    even = [_rank(0, 5000, 1.25, "static", 1), _rank(1, 5000, 1.3, "static", 1)]
    assert schedule_advice(plan, even) == ""


def test_a_dynamic_run_of_equal_ranks_whose_chunks_cost_much_is_advised_static():
    """Equal speeds, and a gap of 10 % of each chunk between chunks (claims, seeks)."""
    members = []
    for rank in (0, 1):
        rec = _rank(rank, 5000, 1.0, "dynamic")
        for i, c in enumerate(rec["chunks"]):  # 10 ms between chunks of 125 ms
            c[4] += 0.01 * i
            c[5] += 0.01 * i
        rec["intervals"] = [["compute", c[4], c[5]] for c in rec["chunks"]]
        members.append(rec)
    plan = type("Plan", (), {"execution": MODES["mpi"]})()
    assert "--schedule static" in schedule_advice(plan, members)


def test_a_dynamic_runs_slow_rank_cost_what_a_healthy_rank_would_have_saved():
    """Rank 1 at a quarter of rank 0's speed, both ending at 2 s with 8,000 and 2,000
    frames: it is flagged (its frames took 4x as long each), and it cost the 0.75 s a
    healthy rank would have saved (10,000 frames at 2 x 4,000 per s: 1.25 s), not the
    6 s its frames-scaled duration exceeds the other's by."""
    from trajflow.workflows.profile.stragglers import judge_group
    members = [{**_rank(r, f, 2.0, "dynamic"), "t_work": 2.0, "t_total": 2.0, "t_start": 100.0,
                "t_stop": 102.0, "t_wait": 0.0} for r, f in ((0, 8000), (1, 2000))]
    [flag] = judge_group(members, ("run", "analyze"))
    assert flag["rank"] == 1
    assert abs(flag["impact_s"] - 0.75) < 1e-9
