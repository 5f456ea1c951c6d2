"""The straggler judge: which members of a group ran late, why, and who waited.

A group is like with like: the ranks of one MPI task, or the tasks of one
stage. A member is a dict of seconds: `t_work` (its time without the wait
at the barrier, nor that in MPI_Init for the last rank: init_wait.py), the
phases (`t_open_topology`, `t_open_trajectory`, `t_io`, `t_compute`, `t_comm`,
`t_write`, `t_convert`, `t_launch`, `t_overhead`),
`t_wait`, and `rank`, `block`, `host`, `frames`, `t_start`, `t_stop` where
known (trajflow's own records, or a timing table of any MPI script).

The healthy baseline. Durations are normalised by frames (a block one frame
longer is not late). On real clusters a whole node is often slow: half the
ranks 2-4x the others, and the median sits inside the slow half. So the
sorted log-durations are scanned from the fastest up for the first gap of a
factor >= 1.5 (GAP) that has at least max(2, 10 %) of the members below it:
those are the fast mode, and its median and MAD are the baseline. Where no
such gap exists (one mode, or noise) the baseline is the whole group's
median and MAD, as the rule of ../shared/notes/method.md has it.

A member is flagged ("rank") when its duration exceeds baseline + 3 x 1.4826
x MAD, is >= 1.5 x the baseline, and is late by more than a floor (0.2 s and
5 % of the group's makespan). The phase holding the largest share of its
excess is the cause ("mixed" when none holds half). Where every member of a
host is flagged (two or more of them) and the group spans several hosts, one
"host" flag replaces theirs. A member within that rule whose one phase is
far out of line with the same phase of the healthy members (late by the
floor, beyond 3 MAD, and >= 3x their median) is flagged too ("phase"; the
launch phase only for MPI ranks, which start together: tasks queued for a
core are not late; not the comm and write phases of the gather's root, rank
0 or the rank a dynamic schedule found fastest, which receives and writes
what the others send). A group of two ("pair") is judged by the ratio of its
members alone (>= 1.5 and above the floor). Each flag says how much sooner
the group would have ended without it (`impact_s`) and what it cost the
others: the wait they spent at the barrier because of it (`victims_wait_s`,
each other member's wait up to the flag's excess, and the longest waiters).
"""
import math
import statistics

from trajflow.tasks.modes import is_mpi_rank, mode_named

PHASES = {"setup": ("t_setup", "t_finalize"),
          "open": ("t_open_topology", "t_open_trajectory", "t_open"), "io": ("t_io",),
          "compute": ("t_compute",), "comm": ("t_comm", "t_claim"),
          "write": ("t_write", "t_convert", "t_progress"),
          "launch": ("t_launch",), "other": ("t_overhead",)}
# the columns a table of ranks shows, in a rank's order (`wait` is the record's t_wait)
SHOWN_PHASES = ("setup", "open", "io", "compute", "wait", "comm", "write", "launch", "other")
MAD_SCALE = 1.4826
FLOOR_S = 0.2           # a straggler is late by more than this ...
FLOOR_SHARE = 0.05      # ... and by more than this share of the group's makespan
RATIO = 1.5             # ... and by at least this factor
GAP = 1.5               # a factor between two sorted durations that separates two modes
MIN_MODE_SHARE = 0.10   # the fast mode holds at least this share of the group (and 2 members)
PHASE_RATIO = 3.0       # a phase this many times the healthy members' is out of line
MIN_GROUP = 2


def phase_times(rec):
    return {p: sum(rec.get(k, 0.0) or 0.0 for k in keys) for p, keys in PHASES.items()}


def normalised_durations(members):
    """Each member's work time scaled to the group's median frames."""
    frames = [m.get("frames") or 0 for m in members]
    median_frames = statistics.median(frames) or 1
    return [m["t_work"] * (median_frames / f if f else 1.0) for m, f in zip(members, frames)]


def fast_mode(durations):
    """Indices of the healthy members and how the baseline was chosen ("fast mode" or
    "median"): the members below the first clear gap from the fastest up, if any."""
    order = sorted(range(len(durations)), key=lambda i: durations[i])
    need = max(2, math.ceil(MIN_MODE_SHARE * len(durations)))
    for k in range(need - 1, len(order) - 1):
        lo, hi = durations[order[k]], durations[order[k + 1]]
        if lo > 0 and hi / lo >= GAP:
            return order[:k + 1], "fast mode"
    return order, "median"


def judge_group(members, key=("", "")):
    """The flags of one group (see the module's docstring), most harmful first."""
    if len(members) < MIN_GROUP:
        return []
    dur = normalised_durations(members)
    makespan = (max(m.get("t_stop", 0.0) for m in members)
                - min(m.get("t_start", 0.0) for m in members))
    floor = max(FLOOR_S, FLOOR_SHARE * makespan)
    if len(members) == 2:
        return _judge_pair(members, dur, floor, key)
    healthy, how = fast_mode(dur)
    base_durs = [dur[i] for i in healthy]
    base = statistics.median(base_durs)
    mad = statistics.median(abs(d - base) for d in base_durs)
    threshold = max(base + 3 * MAD_SCALE * mad, RATIO * base, base + floor)
    healthy_members = [members[i] for i in healthy]
    phase_base = {p: statistics.median(phase_times(m)[p] for m in healthy_members) for p in PHASES}
    common = dict(run=key[0], task=key[1], group_size=len(members), baseline=how,
                  baseline_s=base, mad_s=mad, threshold_s=threshold,
                  median_s=base)  # the baseline, under the name reports have used
    flags, late = [], set()
    for i, (m, d) in enumerate(zip(members, dur)):
        if d > threshold:
            late.add(i)
            flags.append(_flag("rank", m, members, d, base, phase_base, common))
    flags = _merge_slow_hosts(flags, members, late, dur, base, phase_base, common)
    flags += _phase_outliers(members, late, healthy_members, phase_base, floor, common)
    return sorted(flags, key=lambda f: -f["impact_s"])


def _judge_pair(members, dur, floor, key):
    fast, slow = sorted(range(2), key=lambda i: dur[i])
    base = dur[fast]
    if base <= 0 or dur[slow] / base < RATIO or dur[slow] - base <= floor:
        return []
    phase_base = phase_times(members[fast])
    common = dict(run=key[0], task=key[1], group_size=2, baseline="the other member",
                  baseline_s=base, mad_s=0.0, threshold_s=max(RATIO * base, base + floor),
                  median_s=base)
    return [_flag("pair", members[slow], members, dur[slow], base, phase_base, common)]


def _cause(by_phase, excess):
    cause, top = max(by_phase.items(), key=lambda kv: kv[1])
    return cause if top >= 0.5 * excess else "mixed"


def _flag(kind, m, members, d, base, phase_base, common):
    excess = d - base
    by_phase = {p: t - phase_base[p] for p, t in phase_times(m).items()}
    others = [o for o in members if o is not m]
    return {**common, "kind": kind, "rank": m.get("rank"), "block": m.get("block"),
            "host": m.get("host"), "frames": m.get("frames"), "duration_s": d,
            "excess_s": excess, "ratio": d / base if base else float("inf"),
            "ratio_to_median": d / base if base else float("inf"),
            "cause": _cause(by_phase, excess), "excess_by_phase_s": by_phase,
            "impact_s": impact(m, members, excess), **victims(others, excess)}


def victims(others, excess):
    """What a late member cost the others: each one's wait at the barrier, up to the
    member's excess (a wait beyond it had another cause), summed; the longest waiters."""
    waits = sorted(((min(o.get("t_wait", 0.0) or 0.0, excess), o.get("rank")) for o in others),
                   reverse=True)
    waits = [(w, r) for w, r in waits if w > 0]
    return {"victims_wait_s": sum(w for w, _ in waits),
            "victims": [{"rank": r, "wait_s": w} for w, r in waits[:5]]}


def _merge_slow_hosts(flags, members, late, dur, base, phase_base, common):
    """One flag per host whose members are all late (two or more, several hosts in the group)."""
    hosts = {}
    for i, m in enumerate(members):
        hosts.setdefault(m.get("host"), []).append(i)
    if len(hosts) < 2:
        return flags
    merged, slow_hosts = [], set()
    for host, idx in hosts.items():
        if host is None or len(idx) < 2 or not all(i in late for i in idx):
            continue
        slow_hosts.add(host)
        ranks = [members[i] for i in idx]
        d = statistics.median(dur[i] for i in idx)
        excess = d - base
        by_phase = {p: statistics.median(phase_times(m)[p] for m in ranks) - phase_base[p]
                    for p in PHASES}
        others = [m for m in members if m.get("host") != host]
        merged.append({**common, "kind": "host", "host": host,
                       "ranks": sorted(m.get("rank") for m in ranks), "rank": None,
                       "block": None, "frames": sum(m.get("frames") or 0 for m in ranks),
                       "duration_s": d, "excess_s": excess,
                       "ratio": d / base if base else float("inf"),
                       "ratio_to_median": d / base if base else float("inf"),
                       "cause": _cause(by_phase, excess), "excess_by_phase_s": by_phase,
                       "impact_s": max(impact(m, members, dur[i] - base)
                                       for m, i in zip(ranks, idx)),
                       **victims(others, excess)})
    return [f for f in flags if f["host"] not in slow_hosts] + merged


def _phase_outliers(members, late, healthy, phase_base, floor, common):
    """Members within the total rule whose one phase is far out of line."""
    phases = [p for p in PHASES if p != "other"
              and (p != "launch" or all(is_mpi_rank(m) for m in members))]
    mads = {p: statistics.median(abs(phase_times(m)[p] - phase_base[p]) for m in healthy)
            for p in phases}
    flags = []
    for i, m in enumerate(members):
        if i in late:
            continue
        times = phase_times(m)
        root = m.get("rank") == m.get("gather_root", 0) and mode_named(m.get("mode")).collective
        out = {p: times[p] - phase_base[p] for p in phases
               if not (root and p in ("comm", "write"))  # the gather's root receives, writes
               if times[p] - phase_base[p] > max(floor, 3 * MAD_SCALE * mads[p])
               and times[p] >= PHASE_RATIO * phase_base[p]}
        if not out:
            continue
        cause = max(out, key=out.get)
        excess = out[cause]
        by_phase = {p: times[p] - phase_base[p] for p in PHASES}
        flags.append({**common, "kind": "phase", "rank": m.get("rank"), "block": m.get("block"),
                      "host": m.get("host"), "frames": m.get("frames"),
                      "duration_s": m["t_work"], "excess_s": excess,
                      "ratio": times[cause] / phase_base[cause] if phase_base[cause] else
                      float("inf"), "ratio_to_median": m["t_work"] / common["baseline_s"]
                      if common["baseline_s"] else float("inf"),
                      "phase_s": times[cause], "phase_baseline_s": phase_base[cause],
                      "cause": cause, "excess_by_phase_s": by_phase,
                      "impact_s": impact(m, members, excess),
                      **victims([o for o in members if o is not m], excess)})
    return flags


def impact(member, members, excess):
    """How much sooner the group would have ended had `member` not been late."""
    if is_mpi_rank(member) and member.get("schedule") == "dynamic":
        return dynamic_impact(member, members)
    if is_mpi_rank(member) or any(o.get("t_wait") for o in members):
        return excess  # the other ranks wait for it at the barrier
    if any(o.get("t_start", 0.0) >= member.get("t_stop", 0.0) for o in members if o is not member):
        return excess  # members ran one after another: everything after it was pushed back
    end = max(o.get("t_stop", 0.0) for o in members)
    others = max((o.get("t_stop", 0.0) for o in members if o is not member), default=0.0)
    return max(0.0, end - max(others, member.get("t_stop", 0.0) - excess))


def dynamic_impact(member, members):
    """On a dynamic schedule a slow rank does fewer frames and the others do not wait
    for it: it cost the group the difference between the loop's end and what the
    frames would have taken with it at the others' median speed."""
    def speed(m):
        work = m.get("t_work", m["t_total"])
        return (m.get("frames") or 0) / work if work > 0 else 0.0
    others = [speed(o) for o in members if o is not member]
    total = sum(m.get("frames") or 0 for m in members)
    healthy = sum(others) + (statistics.median(others) if others else speed(member))
    end = max(m.get("t_work", m["t_total"]) for m in members)
    return max(0.0, end - total / healthy) if healthy > 0 else 0.0


def judge(records, group_key):
    """Flags of every group of `records` (grouped by `group_key(record)`), most harmful first."""
    groups = {}
    for rec in records:
        groups.setdefault(group_key(rec), []).append(rec)
    flags = []
    for key, members in groups.items():
        flags += judge_group(members, key)
    return sorted(flags, key=lambda f: -f["impact_s"])


def judged_groups(records, group_key):
    """How many groups are large enough to judge, and how many are not."""
    sizes = {}
    for rec in records:
        sizes[group_key(rec)] = sizes.get(group_key(rec), 0) + 1
    judged = sum(1 for n in sizes.values() if n >= MIN_GROUP)
    return judged, len(sizes) - judged


def critical_path(members):
    """Who set a group's end: the member that worked longest (busy time, `t_work`: at a
    barrier every rank ends together, waiting for it), how much longer than the median
    member, and the phase holding most of its excess, as {"member", "late_s", "phase",
    "phase_s", "ratio"}. Named even when no member crosses the straggler rule."""
    def work(m):
        return m.get("t_work", m["t_total"])
    last = max(members, key=work)
    late = work(last) - statistics.median(work(m) for m in members)
    medians = {p: statistics.median(phase_times(m)[p] for m in members) for p in PHASES}
    mine = phase_times(last)
    phase = max(PHASES, key=lambda p: mine[p] - medians[p])
    return {"member": last, "late_s": late, "phase": phase, "phase_s": mine[phase],
            "ratio": mine[phase] / medians[phase] if medians[phase] > 0 else None}


def describe(flag):
    """One line of numbers for a flag, the same in the terminal, CSV and HTML."""
    where = (f"host {flag['host']} (ranks {rank_list(flag['ranks'])})" if flag["kind"] == "host"
             else f"rank {flag['rank']}" + (f" block {flag['block']}" if flag["block"] is not None
                                             else "") +
             (f" on {flag['host']}" if flag["host"] else ""))
    if flag["kind"] == "phase":
        numbers = (f"its {flag['cause']} phase {flag['phase_s']:.2f} s vs "
                   f"{flag['phase_baseline_s']:.2f} s for the healthy members "
                   f"({flag['ratio']:.1f}x; total {flag['duration_s']:.2f} s vs "
                   f"{flag['baseline_s']:.2f} s)")
    else:
        numbers = (f"{flag['duration_s']:.2f} s vs {flag['baseline']} {flag['baseline_s']:.2f} s "
                   f"({flag['ratio']:.1f}x, threshold {flag['threshold_s']:.2f} s); "
                   f"cause: {flag['cause']} (+{flag['excess_by_phase_s'].get(flag['cause'], flag['excess_s']):.2f} s "
                   f"of +{flag['excess_s']:.2f} s)")
    waited = (f"; others waited {flag['victims_wait_s']:.2f} s for it"
              if flag["victims_wait_s"] > 0 else "")
    return (f"{flag['run']} {flag['task']} [{flag['kind']}] {where}: {numbers}; the group would "
            f"have ended {flag['impact_s']:.2f} s sooner{waited}")


def rank_list(ranks):
    """Ranks as a reader wants them: 150-199 for a run of ranks, else 3,7,12."""
    ranks = [r for r in ranks if r is not None]
    if ranks and ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)
