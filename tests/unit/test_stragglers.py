"""The straggler judge on synthetic groups with known answers (no pilot)."""
import random

import pytest

from trajflow.workflows.profile.stragglers import describe, fast_mode, judge_group


def member(rank, io=1.0, compute=1.0, open_=0.1, wait=0.0, host="n0", frames=100, mode="mpi",
           launch=0.0, comm=0.0):
    total = io + compute + open_ + wait + comm
    return {"rank": rank, "block": rank, "host": host, "frames": frames, "mode": mode,
            "t_start": 0.0, "t_stop": total, "t_open_topology": open_, "t_io": io,
            "t_compute": compute, "t_comm": comm, "t_wait": wait, "t_launch": launch,
            "t_total": total, "t_work": total - wait + launch}


def with_barrier(members):
    """Every rank waits at the barrier for the slowest: t_wait = slowest work - own work."""
    end = max(m["t_work"] for m in members)
    for m in members:
        m["t_wait"] = end - m["t_work"]
        m["t_total"] = m["t_work"] + m["t_wait"]
        m["t_stop"] = m["t_total"]
    return members


def test_one_slow_rank_among_72_is_flagged_with_its_phase_and_victims():
    rng = random.Random(1)
    members = [member(r, io=1.0 + rng.uniform(-0.05, 0.05), host=f"n{r // 24}") for r in range(72)]
    members[17] = member(17, io=7.0, host="n0")
    flags = judge_group(with_barrier(members), ("run", "analyze"))
    assert [(f["kind"], f["rank"], f["cause"]) for f in flags] == [("rank", 17, "io")]
    f = flags[0]
    assert f["ratio"] == pytest.approx(8.1 / 2.1, rel=0.03)
    # its excess over the others' typical work (2.1 s, +-0.05 of I/O), computed here from the
    # members' own numbers; the 71 others waited at the barrier for it, each at most that
    others = sorted(1.0 + 1.0 + 0.1 + (m["t_io"] - 1.0) for m in members if m["rank"] != 17)
    typical = (others[35] + others[34]) / 2  # the median of 71... and of 72 lies between
    assert f["excess_s"] == pytest.approx(8.1 - typical, abs=0.01)
    waits = [8.1 - w for w in others]  # the slowest's work minus each one's own
    assert f["victims_wait_s"] == pytest.approx(sum(min(w, 8.1 - typical) for w in waits),
                                                abs=71 * 0.01)
    assert f["victims_wait_s"] == pytest.approx(71 * 6.0, abs=71 * 0.06)
    assert len(f["victims"]) == 5 and f["victims"][0]["wait_s"] >= f["victims"][-1]["wait_s"]


def test_a_whole_slow_host_is_one_flag_judged_against_the_fast_mode():
    """24 of 48 ranks, all on host n1, 3x slower in I/O: the median sits inside the slow
    half, so the old rule flagged nothing; the fast mode is the baseline."""
    rng = random.Random(2)
    members = [member(r, io=1.0 + rng.uniform(-0.05, 0.05), host="n0") for r in range(24)]
    members += [member(r, io=5.0 + rng.uniform(-0.2, 0.2), host="n1") for r in range(24, 48)]
    flags = judge_group(with_barrier(members), ("run", "analyze"))
    assert len(flags) == 1, [describe(f) for f in flags]
    [f] = flags
    assert f["kind"] == "host" and f["host"] == "n1" and f["ranks"] == list(range(24, 48))
    assert f["cause"] == "io" and f["baseline"] == "fast mode"
    assert f["baseline_s"] == pytest.approx(2.1, abs=0.06)
    assert f["ratio"] == pytest.approx(6.1 / 2.1, rel=0.05)
    assert "host n1 (ranks 24-47)" in describe(f)
    # the 24 healthy ranks waited for the slow host: the slowest's work (2.1 + 4 + up to
    # 0.2) minus each one's own, each counted up to the host's excess over the fast mode
    fast = sorted(2.1 + (m["t_io"] - 1.0) for m in members[:24])
    slow = sorted(2.1 + (m["t_io"] - 1.0) for m in members[24:])
    excess = (slow[11] + slow[12]) / 2 - (fast[11] + fast[12]) / 2
    assert 3.75 <= excess <= 4.25 and f["excess_s"] == pytest.approx(excess, abs=0.05)
    assert f["victims_wait_s"] == pytest.approx(sum(min(slow[-1] - w, excess) for w in fast),
                                                abs=24 * 0.05)


def test_a_pair_is_judged_by_its_ratio():
    [f] = judge_group([member(0), member(1, compute=5.0)], ("run", "analyze"))
    assert f["kind"] == "pair" and f["rank"] == 1 and f["cause"] == "compute"
    assert f["ratio"] == pytest.approx(6.1 / 2.1)
    assert judge_group([member(0), member(1, compute=1.5)], ("run", "analyze")) == []  # 1.2x
    assert judge_group([member(0)], ("run", "analyze")) == []


def test_one_mode_and_noise_flag_nothing():
    rng = random.Random(3)
    one_mode = [member(r, io=1.0, compute=1.0) for r in range(16)]
    assert judge_group(one_mode) == []
    assert fast_mode([m["t_work"] for m in one_mode])[1] == "median"
    noisy = [member(r, io=rng.uniform(0.7, 1.3), compute=rng.uniform(0.7, 1.3),
                    open_=rng.uniform(0.05, 0.15), host=f"n{r % 3}") for r in range(64)]
    assert judge_group(with_barrier(noisy)) == []


def test_a_phase_far_out_of_line_is_flagged_though_the_total_is_not():
    """Rank 5's open takes 1.0 s against 0.1 s (10x) while its total stays 1.4x."""
    members = [member(r) for r in range(8)]
    members[5] = member(5, open_=1.0)
    [f] = judge_group(with_barrier(members), ("run", "analyze"))
    assert f["kind"] == "phase" and f["rank"] == 5 and f["cause"] == "open"
    assert f["phase_s"] == pytest.approx(1.0) and f["phase_baseline_s"] == pytest.approx(0.1)
    assert f["excess_s"] == pytest.approx(0.9)
    assert "open phase 1.00 s vs 0.10 s" in describe(f)


def test_the_gathers_root_and_queued_tasks_are_not_phase_outliers():
    members = [member(r, comm=0.05) for r in range(6)]
    members[0] = member(0, comm=0.6)  # rank 0 receives everything
    assert judge_group(with_barrier(members)) == []
    tasks = [member(r, mode="tasks", launch=0.2) for r in range(6)]
    tasks[4] = member(4, mode="tasks", launch=2.0)  # waited for a core
    tasks[4]["t_work"] -= 2.0  # its queue wait is not its work
    assert judge_group(tasks) == []


def test_a_lone_fast_member_is_not_the_baseline():
    members = [member(r, io=2.0) for r in range(10)]
    members[3] = member(3, io=0.2)  # one short block (e.g. cached)
    assert fast_mode([m["t_work"] for m in members])[1] == "median"
    assert judge_group(members) == []


def test_with_no_straggler_the_critical_path_is_still_named():
    """A Bridges-like 72-rank run: rank 5's open takes 1.75x the others' and sets the
    end, but is not late enough to flag; the report names it, its phase and ratio."""
    from trajflow.workflows.profile.inspection import straggler_lines
    members = with_barrier([member(r, open_=0.175 if r == 5 else 0.1) for r in range(72)])
    for m in members:
        m.update(run="bridges", task="analyze")
    assert judge_group(members, ("bridges", "analyze", "")) == []
    lines = straggler_lines({"stragglers": [], "records": members})
    assert lines[0].startswith("stragglers: none")
    assert "critical path of bridges analyze: rank 5 worked longest, 0.075 s more than the " \
           "median member; its open took 0.175 s, 1.75x the median" in lines[1], lines
    # what inspect --json gives: the same numbers the text names
    from trajflow.workflows.profile.inspection import critical_paths
    [path] = critical_paths(members)
    assert (path["member"], path["rank"], path["phase"]) == ("rank 5", 5, "open")
    assert path["late_s"] == pytest.approx(0.075) and path["ratio"] == pytest.approx(1.75)


def test_a_split_tasks_critical_path_names_its_segment():
    """Split tasks in tasks mode have no block of their own: the one that set the stage's
    end is named by the segment it wrote (it read "block None")."""
    from trajflow.workflows.profile.inspection import critical_path_lines
    members = []
    for segment in range(4):
        m = member(0, io=3.0 if segment == 2 else 1.0, mode="tasks")
        m.pop("block")
        m.update(run="adk", task="split", segment=segment, io="split")
        members.append(m)
    lines = critical_path_lines(members)
    assert lines and "critical path of adk split: segment 2 worked longest, 2.000 s" in lines[0], \
        lines


def test_flags_of_a_run_too_short_to_judge_are_set_aside_with_the_reason():
    from trajflow.workflows.profile.inspection import straggler_lines
    members = [member(r, io=1.0) for r in range(4)]
    members[2] = member(2, io=3.0)
    for m in members:
        m.update(run="short", task="analyze")
    flags = judge_group(with_barrier(members), ("short", "analyze", ""))
    assert flags
    for f in flags:
        f["run"] = "short"
    lines = straggler_lines({"stragglers": flags, "records": members,
                             "not_judged": {"short": "the analysis took 0.50 s"}})
    assert lines == ["stragglers of short: not judged: the analysis took 0.50 s"]
    assert straggler_lines({"stragglers": flags, "records": members})[0] == "stragglers (most harmful first):"
