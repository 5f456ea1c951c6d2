"""What a dynamic schedule did for a run, from its records alone.

MPI ranks record the chunks they ran (`chunks`: id, block, first and last
position + 1, start and end time); tasks record each copy of a block they
ran (`block_copies`: block, backup or not, won or not, times, chunks done).
From those: each rank's speed (frames per second of its chunks), the share
of frames the schedule gave it, how long static blocks would have taken at
the measured speeds, the per-chunk cost of scheduling, and which backup
copies won. Static runs are judged too: how much a dynamic schedule would
have saved.
"""
import statistics

from trajflow.tasks.modes import is_mpi_rank
from trajflow.workflows.profile.stragglers import FLOOR_S, FLOOR_SHARE

SLOW_SPEED = 0.8          # a rank below this share of the others' median speed is named
OVERHEAD_SHARE = 0.03     # scheduling costing more than this share of the work is worth a word
MIN_LOOP_S = 0.5          # a frames' loop shorter than this is too short to judge speeds by


def _busy(rec):
    """Seconds a rank spent in its frames: its chunks' spans, else its io + compute."""
    chunks = rec.get("chunks") or []
    return sum(c[5] - c[4] for c in chunks) or (rec.get("t_io", 0.0) + rec.get("t_compute", 0.0))


def rank_speeds(members):
    """[(member, frames per second)]; 0 for a member that analysed no frame (a rank
    a dynamic schedule gave no chunk: it was too slow to claim one)."""
    out = []
    for m in members:
        busy = _busy(m)
        out.append((m, m["frames"] / busy if m.get("frames") and busy > 0 else 0.0))
    return out


def mpi_effect(members):
    """For the ranks of one MPI analyze task: {"schedule", "slow": [(rank, speed ratio,
    share of frames)], "static_s", "loop_s", "balanced_s", "chunks", "overhead_s"}.
    `static_s`: the loop's span with balanced blocks at the measured speeds (the
    slowest rank's block), `balanced_s`: W / sum of speeds, the best any schedule
    can do; `loop_s`: the frames' loop's span as measured (first chunk's start to last
    chunk's end; a static run: its slowest block). None when the speeds are unknown."""
    speeds = rank_speeds(members)
    total = sum(m.get("frames") or 0 for m, _ in speeds)
    if len(speeds) < 2 or not total or not any(v for _, v in speeds):
        return None
    schedule = members[0].get("schedule", "static")
    slow = []
    for m, v in speeds:
        others = statistics.median(o for x, o in speeds if x is not m)
        if others > 0 and v < SLOW_SPEED * others:
            slow.append((m.get("rank"), v / others, (m.get("frames") or 0) / total))
    static_s = max(total / len(speeds) / v if v > 0 else float("inf") for _, v in speeds)
    balanced_s = total / sum(v for _, v in speeds)
    loop_s = max(_loop_span(m) for m in members)
    chunks = sum(len(m.get("chunks") or []) for m in members)
    overhead = sum(max(0.0, _loop_span(m) - _busy(m)) + _unaccounted(m) for m in members)
    return {"schedule": schedule, "slow": sorted(slow, key=lambda s: s[1]),
            "static_s": static_s, "balanced_s": balanced_s, "loop_s": loop_s,
            "chunks": chunks, "overhead_s": overhead,
            "work_s": sum(_busy(m) for m in members)}


def _loop_span(rec):
    chunks = rec.get("chunks") or []
    if not chunks:
        return _busy(rec)
    return max(c[5] for c in chunks) - min(c[4] for c in chunks)


def _unaccounted(rec):
    """Seconds inside a rank's chunks that were neither reading nor computing: what
    each chunk costs beyond its frames (a copy of a user's analysis, a seek)."""
    chunks = rec.get("chunks") or []
    if len(chunks) < 2:
        return 0.0
    lo, hi = min(c[4] for c in chunks), max(c[5] for c in chunks)
    inside = sum(min(t1, hi) - max(t0, lo) for name, t0, t1 in rec.get("intervals", [])
                 if name in ("io", "compute") and t1 > lo and t0 < hi)
    return max(0.0, sum(c[5] - c[4] for c in chunks) - inside)


def mpi_lines(effect):
    """What the schedule did, in words (nothing worth saying: no lines)."""
    if effect is None or effect["loop_s"] < MIN_LOOP_S:
        return []
    lines = []
    if effect["schedule"] == "dynamic":
        for rank, ratio, share in effect["slow"]:
            lines.append(f"rank {rank} ran at {ratio:.2f}x the others' speed; dynamic "
                         f"scheduling gave it {share:.0%} of the frames")
        saved = effect["static_s"] - effect["loop_s"]
        if effect["slow"] and 0 < saved < float("inf"):
            lines.append(f"the frames' loop ended {saved:.2f} s sooner than static blocks would "
                         f"have (estimated {effect['static_s']:.2f} s at the measured speeds; "
                         f"{effect['loop_s']:.2f} s measured, {effect['balanced_s']:.2f} s "
                         "the best any schedule could do)")
        per_chunk = effect["overhead_s"] / max(1, effect["chunks"])
        lines.append(f"{effect['chunks']} chunks, {per_chunk * 1e3:.2f} ms of scheduling each "
                     f"({effect['overhead_s'] / max(effect['work_s'], 1e-9):.1%} of the work)")
    else:
        saved = effect["static_s"] - effect["balanced_s"]
        if effect["slow"] and _worth(saved, effect["static_s"]):
            rank, ratio, _ = effect["slow"][0]
            lines.append(f"rank {rank} ran at {ratio:.2f}x the others' speed and had as many "
                         f"frames: a dynamic schedule would have ended the loop about "
                         f"{saved:.2f} s sooner ({effect['balanced_s']:.2f} s instead of "
                         f"{effect['static_s']:.2f} s)")
    return lines


def _worth(saved, of):
    """A saving as large as the straggler judge's floor (stragglers.py) is worth a word."""
    return saved > FLOOR_S and saved > FLOOR_SHARE * of


def backup_lines(members):
    """Tasks mode, dynamic: each backup copy and how it ended."""
    lines = []
    for m in members:
        for copy in m.get("block_copies") or []:
            if not copy["backup"]:
                continue
            took = copy["t_stop"] - copy["t_start"]
            if copy["won"]:
                lines.append(f"block {copy['block']}: a backup copy in the task of block "
                             f"{m.get('block')} won ({took:.2f} s; the original was late)")
            else:
                lines.append(f"block {copy['block']}: a backup copy in the task of block "
                             f"{m.get('block')} stopped after {copy['chunks_done']} of "
                             f"{copy['chunks']} chunks (the original published first)")
    return lines


def schedule_lines(members):
    """Lines for one group of analyze records (an MPI task's ranks, or a stage's tasks)."""
    if not members or members[0].get("task") != "analyze":
        return []
    if is_mpi_rank(members[0]):
        return mpi_lines(mpi_effect(members))
    return backup_lines(members)


def schedule_advice(plan, analyze):
    """A sentence recommending a schedule from what was measured, or ""."""
    if not plan.execution.collective:
        return ""
    effect = mpi_effect(analyze)
    if effect is None or effect["loop_s"] < MIN_LOOP_S:
        return ""
    if effect["schedule"] == "static":
        saved = effect["static_s"] - effect["balanced_s"]
        if effect["slow"] and _worth(saved, effect["static_s"]):
            return (f" The ranks ran at unequal speeds (the slowest {effect['slow'][0][1]:.2f}x "
                    f"the others'): --schedule dynamic gives a slow rank fewer frames, about "
                    f"{saved:.1f} s sooner here.")
        return ""
    share = effect["overhead_s"] / max(effect["work_s"], 1e-9)
    if not effect["slow"] and share > OVERHEAD_SHARE:
        return (f" The ranks ran at equal speeds and the dynamic schedule's {effect['chunks']} "
                f"chunks cost {share:.0%} of the work: --schedule static would be as balanced "
                "and cheaper.")
    return ""
