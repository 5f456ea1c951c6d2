"""Inspect runs: every task's and rank's phases on one timeline, stragglers found and explained.

Reads only RUNDIR: plan.json, profile/*.jsonl (the tasks' own timing records)
and radical/*/ (each task's RADICAL-Pilot profile, copied there by the
client). RADICAL's per-rank records do not say which rank they are, and
radical.analytics pairs the first rank's start with the next stop, so rank
truth comes from our records; RADICAL gives each task's launch time.

Stragglers are judged by stragglers.py among like members (the ranks of
one MPI task, the tasks of one stage).
"""
import csv
import glob
import json
import os
from trajflow.tasks.plan import PLAN_FILE, RunPlan

from .stragglers import MIN_GROUP, describe, judge, judged_groups, phase_times

def load_run(rundir):
    """(plan, records) of one run; records are the profile lines, with RADICAL launch times."""
    rundir = os.path.abspath(rundir)
    plan_path = os.path.join(rundir, PLAN_FILE)
    if not os.path.exists(plan_path):
        raise FileNotFoundError(f"{rundir} is not a trajflow run (no {PLAN_FILE})")
    plan = RunPlan.load(plan_path)
    records = []
    for path in sorted(glob.glob(os.path.join(rundir, "profile", "*.jsonl"))):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    rec["source"] = os.path.basename(path)
                    records.append(rec)
    launches = radical_launch_starts(rundir)
    for rec in records:
        start = launches.get(rec.get("rp_task_id"))
        rec["t_launch"] = max(0.0, rec["t_start"] - start) if start else 0.0
        rec["t_work"] = rec["t_total"] - rec.get("t_wait", 0.0) + rec["t_launch"]
        rec["run"] = os.path.basename(rundir)
    return plan, records


def radical_launch_starts(rundir):
    """RADICAL task id -> the time its launch began, from the copied task profiles."""
    starts = {}
    for prof in glob.glob(os.path.join(rundir, "radical", "*", "*.prof")):
        with open(prof, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.rstrip("\n").split(",")
                if len(parts) >= 5 and parts[1] == "launch_start":
                    starts.setdefault(parts[4], float(parts[0]))
    return starts


def group_key(rec):
    """Like with like: the ranks of one MPI task, or the tasks of one stage."""
    return (rec["run"], rec["task"], rec.get("io", ""))


def find_stragglers(records):
    """Flags with the numbers behind them, most harmful first (see stragglers.py)."""
    return judge(records, group_key)


def advice(plan, records):
    """Paper 000, section 8: what t_compute/t_IO says to do for this run."""
    analyze = [r for r in records if r["task"] == "analyze"]
    if not analyze:
        return {"ratio": None, "text": "no analyze records: the run did not reach the analyze stage"}
    t_io = sum(r["t_io"] for r in analyze)
    t_compute = sum(r["t_compute"] for r in analyze)
    ratio = t_compute / t_io if t_io > 0 else float("inf")
    if ratio >= 100:
        text = f"compute bound (t_compute/t_IO = {ratio:.1f}): it scales; add ranks."
    elif plan.io == "shared":
        text = (f"I/O bound (t_compute/t_IO = {ratio:.2f}): every rank reads the one shared file; "
                "use --io split or --io h5md (paper 000 section 8).")
    else:
        text = (f"I/O bound (t_compute/t_IO = {ratio:.2f}) with --io {plan.io}: the split already "
                "removes file contention; at scale prefer H5MD with one-frame chunks and MPI-IO.")
    comm = sum(r["t_comm"] for r in analyze)
    if plan.mode == "mpi" and comm > 0.1 * max(r["t_total"] for r in analyze):
        if plan.analysis == "rmsd" and plan.gather == "gatherv":
            # paper 000: a one-sided gather pays off when the result arrays are small
            text += " The gather takes over 10% of the job: try --gather rma (one-sided puts)."
        else:
            text += (" The gather takes over 10% of the job: the result arrays are large; "
                     "--mode tasks hands each block over as a file instead.")
    return {"ratio": ratio, "t_io": t_io, "t_compute": t_compute, "text": text}


def phase_table(records):
    cols = ["open", "io", "compute", "wait", "comm", "write", "launch", "other"]
    head = f"{'run':16s} {'task':8s} {'rank':>4s} {'block':>5s} {'frames':>7s} " + \
        " ".join(f"{c:>8s}" for c in cols) + f" {'total':>8s}"
    lines = [head, "-" * len(head)]
    for r in sorted(records, key=lambda r: (r["run"], r["t_start"], r.get("rank", 0))):
        p = phase_times(r)
        p["wait"] = r.get("t_wait", 0.0)
        lines.append(f"{r['run'][:16]:16s} {r['task']:8s} {r.get('rank', 0):4d} "
                     f"{str(r.get('block', '')):>5s} {str(r.get('frames', '')):>7s} " +
                     " ".join(f"{p[c]:8.3f}" for c in cols) + f" {r['t_total']:8.3f}")
    return "\n".join(lines)


def straggler_lines(flags, records):
    judged, small = judged_groups(records, group_key)
    if not flags:
        if not judged:
            return [f"stragglers: not judged (every group has fewer than {MIN_GROUP} members)"]
        return [f"stragglers: none (in {judged} group(s) of {MIN_GROUP} or more members)"]
    return ["stragglers (most harmful first):"] + ["  " + describe(f) for f in flags]


def slowest_rank_phases(records):
    """The analyze stage's time per phase as the job sees it: the slowest rank's
    (or task's) open, io, compute, comm, wait and total; None without analyze records."""
    analyze = [r for r in records if r["task"] == "analyze"]
    if not analyze:
        return None
    phases = {p: max(phase_times(r)[p] for r in analyze) for p in ("open", "io", "compute", "comm")}
    phases["wait"] = max(r.get("t_wait", 0.0) for r in analyze)
    phases["total"] = max(r["t_total"] for r in analyze)
    return phases


def speedup(n, t, n0, t0):
    """S(N) = N0 t(N0) / t(N), as if the baseline scaled perfectly up to N0; E = S / N."""
    s = n0 * t0 / t if t > 0 else None
    return s, (s / n if s is not None else None)


def scaling(runs):
    """S(N) and E(N) per phase over runs of the same input and analysis at different rank counts."""
    rows = []
    by_input = {}
    for plan, records in runs:
        phases = slowest_rank_phases(records)
        if phases is None:
            continue
        key = (plan.input_checksum, plan.analysis, plan.io, plan.mode)
        by_input.setdefault(key, []).append((plan.n_blocks, phases))
    for key, points in by_input.items():
        points.sort(key=lambda p: p[0])
        n0, base = points[0]
        for n, ph in points:
            row = {"analysis": key[1], "io": key[2], "mode": key[3], "N": n}
            for p, t in ph.items():
                row[f"t_{p}"] = t
                row[f"S_{p}"], row[f"E_{p}"] = speedup(n, t, n0, base[p])
            rows.append(row)
    return rows


def inspect_runs(rundirs):
    runs = [load_run(d) for d in rundirs]
    records = [r for _, rs in runs for r in rs]
    flags = find_stragglers(records)
    advices = {os.path.basename(p.workdir): advice(p, rs) for p, rs in runs}
    return {"runs": [p.to_dict() for p, _ in runs], "records": records, "stragglers": flags,
            "advice": advices, "scaling": scaling(runs) if len(runs) > 1 else []}


def summary_text(report):
    lines = [phase_table(report["records"]), ""]
    lines += straggler_lines(report["stragglers"], report["records"])
    for run, a in report["advice"].items():
        lines.append(f"advice for {run}: {a['text']}")
    if report["scaling"]:
        lines.append("\nscaling (slowest rank per phase; S = t(N0) N0 / t(N), E = S / N):")
        lines.append(f"  {'analysis':10s} {'io':7s} {'mode':6s} {'N':>3s} {'t_total':>9s} "
                     f"{'S':>6s} {'E':>6s} {'E_io':>6s} {'E_compute':>9s}")
        for r in report["scaling"]:
            lines.append(f"  {r['analysis']:10s} {r['io']:7s} {r['mode']:6s} {r['N']:3d} "
                         f"{r['t_total']:9.3f} {r['S_total']:6.2f} {r['E_total']:6.2f} "
                         f"{_fmt(r['E_io']):>6s} {_fmt(r['E_compute']):>9s}")
    return "\n".join(lines)


def _fmt(v):
    return "n/a" if v is None else f"{v:.2f}"


def write_json(report, path):
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)


FLAG_COLUMNS = ["run", "task", "kind", "rank", "ranks", "block", "host", "duration_s",
                "baseline", "baseline_s", "ratio", "threshold_s", "cause", "excess_s",
                "impact_s", "victims_wait_s"]


def write_csv(report, path):
    """One row per task/rank record (intervals left out); then, under a header of
    their own, one row per straggler flag with its numbers and the sentence the
    terminal prints."""
    keys = sorted({k for r in report["records"] for k in r if k != "intervals"})
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["kind"] + keys)
        for r in report["records"]:
            w.writerow(["record"] + [r.get(k, "") for k in keys])
        w.writerow([])
        w.writerow(["kind"] + FLAG_COLUMNS + ["description"])
        for f in report["stragglers"]:
            w.writerow(["straggler"] + [" ".join(map(str, f[c])) if c == "ranks" and f.get(c)
                                        else f.get(c, "") for c in FLAG_COLUMNS] + [describe(f)])
