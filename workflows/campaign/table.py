"""The campaign table: one row per experiment, with its phases, stragglers, S(N) and E(N).

Times are the analyze stage as the job sees it, the slowest rank's (t_total,
t_IO, t_compute, t_wait, t_comm as Khoshlessan et al. 2019 define them; t_wait
also holds, since 0.22.1, a rank's wait in MPI_Init for the last rank to come:
profile/init_wait.py);
t_prepare is the split or H5MD conversion before it, shown apart (the campaign's
one shared H5MD conversion is charged to every experiment that used it). S(N) and
E(N) compare an experiment with the mean over repeats of the fewest-ranks
experiment of the same resource and strategy (analysis, io, mode, gather,
workload repeat), only where a strategy ran at two or more rank counts;
strategies are compared with each other at the same rank count.
"""
import csv
import os
import statistics

from trajflow.tasks.plan import load_json_record
from trajflow.tasks.rundir import read_outcome
from trajflow.workflows.campaign.folders import EXPERIMENTS_FILE
from trajflow.workflows.errors import InputError
from trajflow.workflows.profile.advice import comparison_line, prepare_seconds, strategy_flags
from trajflow.workflows.profile.inspection import (find_stragglers, fmt_or_na, load_run,
                                                   slowest_rank_phases, speedup)

COLUMNS = ["experiment", "resource", "analysis", "ranks", "io", "mode", "gather", "schedule",
           "repeat", "rep",
           "status", "t_total", "t_prepare", "t_IO", "t_compute", "t_wait", "t_comm", "t_open",
           "stragglers",
           "S", "E", "error"]
TABLE_FILE = "campaign.csv"


def strategy(row) -> tuple:
    """What must be equal for two experiments to lie on one scaling curve."""
    return (row["resource"], row["analysis"], row["io"], row["mode"], row["gather"], row["repeat"],
            row.get("schedule", "static"))


# what experiments.json holds for each experiment (campaign/run.py writes it)
EXPERIMENT_KEYS = {"id": str, "resource": str, "ranks": int, "io": str, "mode": str,
                   "gather": str, "rundir": str}


def read_experiments(cdir):
    """CAMPAIGN_DIR/experiments.json, checked: a campaign folder may come from anyone
    (InputError with one line, never a traceback; no run folder outside the campaign's)."""
    path = os.path.join(cdir, EXPERIMENTS_FILE)
    meta = load_json_record(path, InputError, 64 << 20)
    experiments = meta.get("experiments")
    if not isinstance(experiments, list) or not isinstance(meta.get("analysis"), str):
        raise InputError(f"{path}: no list of experiments and analysis: not a file trajflow "
                         "wrote")
    for e in experiments:
        if not isinstance(e, dict) or any(not isinstance(e.get(k), kind) or isinstance(e.get(k), bool)
                                          for k, kind in EXPERIMENT_KEYS.items()):
            raise InputError(f"{path}: an experiment without its {', '.join(EXPERIMENT_KEYS)}: "
                             "not a file trajflow wrote")
        if os.path.isabs(e["rundir"]) or ".." in e["rundir"].split(os.sep):
            raise InputError(f"{path}: experiment {e['id']!r:.40}: its folder {e['rundir']!r:.60} "
                             "is not inside the campaign's folder: not a file trajflow wrote")
    return meta


def experiment_rows(cdir):
    """Every experiment of the campaign in CAMPAIGN_DIR, done or not, as a dict."""
    meta = read_experiments(cdir)
    rows = []
    for e in meta["experiments"]:
        d = os.path.join(cdir, e["rundir"])
        outcome = read_outcome(d) or {"status": "not run"}
        row = {"experiment": e["id"], "resource": e["resource"], "analysis": meta["analysis"],
               "ranks": e["ranks"], "io": e["io"], "mode": e["mode"], "gather": e["gather"],
               "schedule": e.get("schedule", "static"),
               "repeat": e["repeat"], "rep": e["rep"], "status": outcome["status"],
               "error": outcome.get("error") or "; ".join(outcome.get("failed_tasks", []))[:300],
               "rundir": d}
        if outcome["status"] == "done":
            plan, records = load_run(d)
            row["schedule"] = plan.schedule  # what ran ("auto" resolved when planned)
            phases = slowest_rank_phases(records)
            if phases:
                row.update({"t_total": phases["total"],
                            "t_prepare": prepare_seconds(records),
                            "t_IO": phases["io"],
                            "t_compute": phases["compute"], "t_wait": phases["wait"],
                            "t_comm": phases["comm"], "t_open": phases["open"],
                            "stragglers": len(find_stragglers(records))})
        rows.append(row)
    _add_speedups(rows)
    return rows


def _by_strategy_and_ranks(rows):
    """strategy -> ranks -> the done experiments (repeats) at that point."""
    curves = {}
    for r in rows:
        if "t_total" in r:
            curves.setdefault(strategy(r), {}).setdefault(r["ranks"], []).append(r)
    return curves


def _baseline(by_n):
    """(N0, mean t_total at N0): the fewest-ranks point of a curve."""
    n0 = min(by_n)
    return n0, statistics.mean(r["t_total"] for r in by_n[n0])


def _add_speedups(rows):
    for by_n in _by_strategy_and_ranks(rows).values():
        if len(by_n) < 2:
            continue  # one rank count: no scaling to speak of (S = N, E = 1 would read as perfect)
        n0, t0 = _baseline(by_n)
        for members in by_n.values():
            for r in members:
                r["S"], r["E"] = speedup(r["ranks"], r["t_total"], n0, t0)


def write_table(rows, path):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in COLUMNS})
    return path


def _cell(v):
    return f"{v:.6f}" if isinstance(v, float) else ("" if v is None else v)


def curve_points(rows):
    """strategy -> [(N, mean t_total, std, S(N), E(N) of the means, repeats)] over done
    experiments; S and E are None for a strategy run at one rank count only."""
    out = {}
    for key, by_n in _by_strategy_and_ranks(rows).items():
        n0, t0 = _baseline(by_n)
        pts = []
        for n in sorted(by_n):
            t = [r["t_total"] for r in by_n[n]]
            s, e = speedup(n, statistics.mean(t), n0, t0) if len(by_n) > 1 else (None, None)
            pts.append((n, statistics.mean(t), statistics.stdev(t) if len(t) > 1 else 0.0, s, e,
                        len(t)))
        out[key] = pts
    return out


def summary_lines(rows):
    by_status = {}
    for r in rows:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    lines = ["experiments: " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))]
    for r in rows:
        if r["status"] != "done":
            lines.append(f"  {r['experiment']}: {r['status']}: {r['error']}")
    lines.append(f"{'resource':18s} {'io':7s} {'mode':6s} {'gather':8s} {'schedule':8s} "
                 f"{'K':>3s} {'N':>4s} "
                 f"{'t_total s':>10s} {'+-':>7s} {'S(N)':>6s} {'E(N)':>6s} {'reps':>4s}")
    for key, pts in sorted(curve_points(rows).items()):
        for n, t, sd, s, e, k in pts:
            lines.append(f"{key[0][:18]:18s} {key[2]:7s} {key[3]:6s} {key[4]:8s} {key[6]:8s} "
                         f"{key[5]:3d} {n:4d} "
                         f"{t:10.3f} {sd:7.3f} {fmt_or_na(s):>6s} {fmt_or_na(e):>6s} {k:4d}")
    if any(pts[0][3] is None for pts in curve_points(rows).values()):
        lines.append("(S and E n/a: that strategy ran at one rank count only)")
    compared = strategy_comparisons(rows)
    if compared:
        lines.append("strategies side by side (analyze t_total + split/convert, mean of repeats):")
        lines += ["  " + line for line in compared]
    across = resource_comparisons(rows)
    if across:
        lines.append("resources side by side (the same strategy at the same N; analyze t_total "
                     "+ split/convert, mean of repeats):")
        lines += ["  " + line for line in across]
    return lines


def _points(rows, key, label):
    """key(row) -> label(row) -> [(seconds with split/convert, of which split/convert)]."""
    points = {}
    for r in rows:
        if "t_total" in r:
            points.setdefault(key(r), {}).setdefault(label(r), []).append(
                (r["t_total"] + r["t_prepare"], r["t_prepare"]))
    return points


def resource_comparisons(rows):
    """Per strategy and rank count measured on several resources (clusters): which
    resource was fastest, by how much."""
    points = _points(rows, lambda r: (r["analysis"], strategy_flags(
        r["io"], r["mode"], r["gather"], r.get("schedule")), r["repeat"], r["ranks"]),
        lambda r: r["resource"])
    return [comparison_line(f"{analysis} {label} at N = {n}" + (f" K = {k}" if k != 1 else ""),
                            by) for (analysis, label, k, n), by in sorted(points.items())
            if len(by) > 1]


def strategy_comparisons(rows):
    """Per resource and rank count where several strategies were measured: which was
    fastest, the split or conversion counted (S and E of each strategy against its own
    fewest-ranks point cannot say that: the slowest strategy can have the best E)."""
    points = _points(rows, lambda r: (r["resource"], r["analysis"], r["repeat"], r["ranks"]),
                     lambda r: strategy_flags(r["io"], r["mode"], r["gather"], r.get("schedule")))
    return [comparison_line(f"{res} {analysis} at N = {n}" + (f" K = {k}" if k != 1 else ""), by)
            for (res, analysis, k, n), by in sorted(points.items()) if len(by) > 1]
