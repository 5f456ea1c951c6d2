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
import re
import shlex
from trajflow.tasks.exit_codes import ANALYSIS_RAISED
from trajflow.tasks.modes import is_mpi_rank
from trajflow.tasks.plan import is_finite_number, PlanError, RunPlan
from trajflow.tasks.timing import PHASES
from trajflow.tasks.rundir import OUTCOME, PLAN, read_lines, read_outcome, read_record, write_text
from trajflow.workflows.profile.init_wait import attribute_init_waits
from trajflow.workflows.profile.advice import advice, compare_strategies, slow_host_advice
from trajflow.workflows.profile.judgeable import stragglers_not_judged
from trajflow.workflows.profile.schedule_effects import schedule_lines
from trajflow.workflows.profile.stragglers import (SHOWN_PHASES, critical_path, describe, judge, judged_groups,
                                                   MIN_GROUP, phase_times)
from trajflow.workflows.profile.timing_tables import read_tables
from trajflow.workflows.profile.wall_time import describe as describe_wall
from trajflow.workflows.errors import InputError
from trajflow.tasks.stages import remaining_specs  # what a resume runs again



def load_run(rundir, notes=None):
    """(plan, records) of one run; records are the profile lines, with RADICAL launch times.
    A folder may come from anyone: InputError for a plan that is not trajflow's; files
    that are not plain (a FIFO would hang the read) and lines that are not records are
    skipped, each with a line in `notes`."""
    rundir = os.path.abspath(rundir)
    plan_path = os.path.join(rundir, PLAN)
    if not os.path.exists(plan_path):
        raise FileNotFoundError(f"{rundir} is not a trajflow run (no {PLAN})")
    try:
        plan = RunPlan.load(plan_path)
    except PlanError as exc:
        raise InputError(str(exc)) from None
    plan.workdir = rundir  # a folder moved or copied elsewhere reads from where it is
    notes = [] if notes is None else notes
    records = []
    for path in plain_files(os.path.join(rundir, "profile", "*.jsonl"), notes):
        skipped = 0
        for line in read_lines(path):
            if line.strip():
                rec = _record(line)
                if rec is None:
                    skipped += 1
                    continue
                rec["source"] = os.path.basename(path)
                records.append(rec)
        if skipped:
            notes.append(f"{path}: {skipped} line(s) that are not timing records skipped")
    radical = radical_task_events(rundir, notes)
    attribute_init_waits(records)
    for rec in records:
        # a record that says its session takes that session's events only (a resumed run's
        # task ids repeat); an older one, whatever its id has
        rec["radical"] = radical.get((rec.get("rp_session"), rec.get("rp_task_id")), {})
        start = rec["radical"].get("launch_start")
        rec["t_launch"] = max(0.0, rec["t_start"] - start) if start else 0.0
        queued, cores = rec["radical"].get("queued"), rec["radical"].get("cores")
        # waiting in the agent's scheduler for cores (others' or the run's own tasks')
        rec["t_queued"] = max(0.0, cores - queued) if queued and cores else 0.0
        rec["t_work"] = rec["t_total"] - rec.get("t_wait", 0.0) + rec["t_launch"]
        rec["run"] = os.path.basename(rundir)
    return plan, records


# RADICAL's events kept per task (their name, or (name, state) for a state change) and
# the name given here: the scheduler's lines say when it waited for cores and got them
RADICAL_EVENTS = {"launch_start": "launch_start", "rank_start": "rank_start",
                  "rank_stop": "rank_stop", "launch_stop": "launch_stop",
                  ("advance", "AGENT_SCHEDULING"): "queued", "schedule_ok": "cores",
                  "unschedule_stop": "released"}
LAST_OF = ("rank_stop", "launch_stop", "released")  # the others: the first


def radical_task_events(rundir, notes=None):
    """(RADICAL session, task id) -> {event: time} from the copied task profiles: when
    it came to the agent's scheduler ("queued"), got its cores ("cores"), its launch
    began, its first rank started and its last rank stopped, its launch ended, and the
    scheduler took its cores back ("released").
    A resumed run's attempts ran in sessions of their own, whose task ids repeat;
    (None, task id) holds a task id's events of every session (for records that do not
    say their session: an older trajflow's)."""
    events = {}
    for prof in plain_files(os.path.join(rundir, "radical", "*", "*.prof"),
                            [] if notes is None else notes):
        session = kept_task_session(os.path.dirname(prof))
        for line in read_lines(prof):
            parts = line.rstrip("\n").split(",")
            if len(parts) < 5:
                continue
            name = RADICAL_EVENTS.get(parts[1]) or (
                RADICAL_EVENTS.get((parts[1], parts[5])) if len(parts) > 5 else None)
            if name is None:
                continue
            try:
                when = float(parts[0])
            except ValueError:
                continue
            if not is_finite_number(when):
                continue
            pick = max if name in LAST_OF else min
            for key in {(session, parts[4]), (None, parts[4])}:
                task = events.setdefault(key, {})
                task[name] = pick(task.get(name, when), when)
    return events


SESSION_IN_PATH = re.compile(r"(re\.session\.[A-Za-z0-9._-]+)")


def kept_task_session(folder):
    """The RADICAL session a kept task ran in, from its outcome.json's sandbox path
    (…/re.session.X/pilot.0000/task.000001), or None."""
    record = read_record(os.path.join(folder, OUTCOME))
    sandbox = record.get("sandbox") if isinstance(record, dict) else None
    found = SESSION_IN_PATH.search(sandbox) if isinstance(sandbox, str) else None
    return found.group(1) if found else None


def plain_files(pattern, notes):
    """The plain files matching `pattern`, sorted; a FIFO, device or link planted there
    is skipped with a note (reading a FIFO would hang)."""
    found = []
    for path in sorted(glob.glob(pattern)):
        if os.path.islink(path) or not os.path.isfile(path):
            notes.append(f"{path}: not a plain file, skipped")
        else:
            found.append(path)
    return found


# the keys every timing record has, as numbers (tasks/timing.py writes them)
RECORD_NUMBERS = ("t_start", "t_stop", "t_total")


def _record(line):
    """One profile line as a record, or None where it is not one trajflow wrote."""
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    for key, value in rec.items():
        if key.startswith("t_") and value is not None and not is_finite_number(value):
            return None
    if not all(rec.get(k) is not None for k in RECORD_NUMBERS):
        return None
    for key in ("rp_task_id", "rp_session", "host"):  # names: keys of the reader's tables
        if rec.get(key) is not None and not isinstance(rec[key], str):
            return None
    for key in ("rank", "block", "frames", "size"):
        if rec.get(key) is not None and (isinstance(rec[key], bool) or not isinstance(rec[key], int)):
            return None
    for phase in PHASES:  # a record of an older trajflow may lack a phase added since
        if rec.setdefault(f"t_{phase}", 0.0) is None:
            return None  # a phase said but not timed: trajflow writes each as a number
    if not isinstance(rec.get("task"), str) or not isinstance(rec.get("intervals", []), list):
        return None
    for interval in rec.get("intervals", []):
        if not (isinstance(interval, list) and len(interval) == 3 and isinstance(interval[0], str)
                and all(is_finite_number(t) for t in interval[1:])):
            return None
    return rec


def rank_spans(rec):
    """(name, category, start, stop) of every timed interval of one rank, and RADICAL's
    share around it: "launch" (RADICAL's launch_start to the first rank's start),
    "start-up" (that to the rank's first timestamp: interpreter, imports) and "exit"
    (its last timestamp to RADICAL's last rank_stop). What the timeline and the trace draw."""
    rp = rec.get("radical") or {}
    spans = [(name, "phase", a, b) for name, a, b in rec.get("intervals", [])]
    if not spans:  # a timing table: its phases have no order, one span holds them
        spans = [("rank", "phase", rec["t_start"], rec["t_start"] + rec["t_total"])]
    if "queued" in rp and "cores" in rp:
        spans.append(("queued", "radical", rp["queued"], rp["cores"]))
    if "launch_start" in rp and "rank_start" in rp:
        spans.append(("launch", "radical", rp["launch_start"], rp["rank_start"]))
        spans.append(("start-up", "radical", rp["rank_start"], rec["t_start"]))
    elif rec.get("t_launch"):
        spans.append(("launch", "radical", rec["t_start"] - rec["t_launch"], rec["t_start"]))
    if "rank_stop" in rp:
        spans.append(("exit", "radical", rec["t_stop"], rp["rank_stop"]))
    return [s for s in spans if s[3] > s[2]]


def group_key(rec):
    """Like with like: the ranks of one MPI task, or the tasks of one stage."""
    return (rec["run"], rec["task"], rec.get("io", ""))


def find_stragglers(records):
    """Flags with the numbers behind them, most harmful first (see stragglers.py)."""
    return judge(records, group_key)


def phase_table(records):
    cols = SHOWN_PHASES
    width = max([16] + [len(r["run"]) for r in records])  # whole names: they tell runs apart
    head = f"{'run':{width}s} {'task':8s} {'rank':>4s} {'block':>5s} {'frames':>7s} " + \
        " ".join(f"{c:>8s}" for c in cols) + f" {'total':>8s}"
    lines = [head, "-" * len(head)]
    for r in sorted(records, key=lambda r: (r["run"], r["t_start"], r.get("rank", 0))):
        p = phase_times(r)
        p["wait"] = r.get("t_wait", 0.0)
        lines.append(f"{r['run']:{width}s} {r['task']:8s} {r.get('rank', 0):4d} "
                     f"{str(r.get('block', '')):>5s} {str(r.get('frames', '')):>7s} " +
                     " ".join(f"{p[c]:8.3f}" for c in cols) + f" {r['t_total']:8.3f}")
    return "\n".join(lines)


def straggler_lines(report):
    """The stragglers as the terminal says them; the flags of a run the report did not
    judge (`not_judged`: run -> why, too short) are set aside with that reason."""
    flags, records, not_judged = (report["stragglers"], report["records"],
                                  report.get("not_judged") or {})
    aside = [f"stragglers of {run}: not judged: {why}" for run, why in sorted(not_judged.items())
             if any(f["run"] == run for f in flags)]
    flags = [f for f in flags if f["run"] not in not_judged]
    if aside and not flags:
        return aside
    return aside + _judged_lines(flags, records)


def _judged_lines(flags, records):
    judged, small = judged_groups(records, group_key)
    if not flags:
        if not judged:
            return [f"stragglers: not judged (every group has fewer than {MIN_GROUP} members)"]
        return ([f"stragglers: none (in {judged} group(s) of {MIN_GROUP} or more members)"]
                + critical_path_lines(records) + schedule_effect_lines(records))
    return (["stragglers (most harmful first):"] + ["  " + describe(f) for f in flags]
            + schedule_effect_lines(records))


def schedule_effect_lines(records):
    """What each analyze group's schedule did (schedule_effects.py)."""
    groups = {}
    for rec in records:
        groups.setdefault(group_key(rec), []).append(rec)
    return [f"  schedule of {run} {task}: {line}" for (run, task, _), members in groups.items()
            for line in schedule_lines(members)]


def critical_paths(records):
    """For each judged group, the member that set its end, by how much and why, as
    plain data (what `inspect --json` gives under "critical_paths")."""
    groups = {}
    for rec in records:
        groups.setdefault(group_key(rec), []).append(rec)
    out = []
    for (run, task, _), members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        path = critical_path(members)
        if path["late_s"] <= 0:
            continue
        m = path["member"]
        out.append({"run": run, "task": task, "member": member_name(m), "rank": m.get("rank"),
                    "block": m.get("block"), "host": m.get("host"), "late_s": path["late_s"],
                    "phase": path["phase"], "phase_s": path["phase_s"], "ratio": path["ratio"]})
    return out


def critical_path_lines(records):
    """critical_paths as the terminal says them."""
    lines = []
    for p in critical_paths(records):
        ratio = f", {p['ratio']:.2f}x the median" if p["ratio"] else ""
        lines.append(f"  critical path of {p['run']} {p['task']}: {p['member']} worked longest, "
                     f"{p['late_s']:.3f} s more than the median member; its {p['phase']} took "
                     f"{p['phase_s']:.3f} s{ratio}")
    return lines


def member_name(rec):
    """A group's member as the user knows it: an MPI rank, a tasks-mode block, or the
    segment a split task wrote."""
    if not is_mpi_rank(rec):
        for key in ("block", "segment"):
            if rec.get(key) is not None:
                return f"{key} {rec[key]}"
    return f"rank {rec.get('rank', 0)}"


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
    """S(N) and E(N) per phase over runs of the same input, analysis and strategy at two or
    more rank counts; nothing for a strategy run at one rank count."""
    rows = []
    by_input = {}
    for plan, records in runs:
        phases = slowest_rank_phases(records)
        if phases is None:
            continue
        key = (plan.input_checksum, plan.analysis, plan.io, plan.mode, plan.gather, plan.schedule)
        by_input.setdefault(key, []).append((plan.n_workers, phases))
    for key, points in by_input.items():
        if len({n for n, _ in points}) < 2:
            continue  # one rank count: S = N and E = 1 would read as perfect scaling
        points.sort(key=lambda p: p[0])
        n0, base = points[0]
        for n, ph in points:
            row = {"analysis": key[1], "io": key[2], "mode": key[3], "N": n}
            for p, t in ph.items():
                row[f"t_{p}"] = t
                row[f"S_{p}"], row[f"E_{p}"] = speedup(n, t, n0, base[p])
            rows.append(row)
    return rows


def how_it_ended(rundir, plan) -> dict:
    """How a run ended, from RUNDIR alone: {"ok": bool, "lines": [...]}. A run that did
    not end done says what failed, where (stage, task, attempt, exit code) and why
    (its stderr's last lines), and what `--resume` would run again."""
    outcome = read_outcome(rundir) or {}
    name = os.path.basename(rundir)
    earlier = ["  resumed after it failed" + (f" at its {e['stopped_at']} stage"
                                                if e.get("stopped_at") else "")
               + (f": {e['error']}" if e.get("error") else "") + "".join(
                   f"; {task.splitlines()[0]}" for task in e.get("failed_tasks") or [])
               for e in outcome.get("earlier", [])]
    damage = result_damage(plan) if os.path.exists(plan.result_path()) else None
    if os.path.exists(plan.result_path()) and outcome.get("status", "done") == "done" and not damage:
        lines = [f"{name}: done: {plan.result_path()}"] + earlier
        pickled = pickled_results(plan)
        if pickled:
            lines.append(f"  {len(pickled)} result(s) stored with pickle ({', '.join(pickled)}), "
                         f"not loaded unless trusted: open_run({rundir!r}, trust=True) if you "
                         "trust who wrote the run")
        return {"ok": True, "lines": lines}
    if damage:
        return {"ok": False, "lines": [f"{name}: DAMAGED: {plan.result_path()}: {damage}; start "
                                       "a new run, or restore the file"] + earlier}
    if not outcome:
        lines = [f"{name}: NOT ENDED: no {OUTCOME} (still running, or the process that ran it "
                 "was killed)"]
    else:
        where = f" at its {outcome['stopped_at']} stage" if outcome.get("stopped_at") else ""
        lines = [f"{name}: FAILED{where}" + (f": {outcome['error']}" if outcome.get("error") else "")]
        lines += ["  " + line for task in outcome.get("failed_tasks", [])
                  for line in task.splitlines()]
        lines += [line.replace("resumed after it failed", "failed before too")
                  for line in earlier]
    if plan.backend:
        lines.append("  MDAnalysis' run() through trajflow.Backend: run it again")
        return {"ok": False, "lines": lines}
    if any(re.search(rf"with exit code {ANALYSIS_RAISED}\b", task)
           for task in outcome.get("failed_tasks", [])):
        lines.append("  the analysis' own code raised: fix it and start a new run (a resume "
                     "would raise again, and refuses changed analysis code)")
        return {"ok": False, "lines": lines}
    again = {stage: len(specs) for stage, specs in remaining_specs(plan, plan.path(PLAN)).items()
             if specs}
    redo = ", ".join(f"{n} {stage} task(s)" for stage, n in again.items())
    lines.append(f"  `trajflow run --resume {shlex.quote(rundir)}` runs {redo} again and keeps "
                 "the rest")
    return {"ok": False, "lines": lines}


def result_damage(plan):
    """Why the result file is not a result trajflow wrote (not HDF5, not a plain file,
    empty), or None. Cheap: its signature, not its data."""
    path = plan.result_path()
    if os.path.islink(path) or not os.path.isfile(path):
        return "not a plain file"
    if plan.backend:
        return None if os.path.getsize(path) > 0 else "empty"
    import h5py
    try:
        return None if h5py.is_hdf5(path) else "not an HDF5 file"
    except OSError as exc:
        return f"cannot be read ({exc})"


def pickled_results(plan):
    """The results stored with pickle (opened only with trust), by name; a Backend run's
    results are all one pickle."""
    if plan.backend:
        return ["the Backend run's results"]
    import h5py
    from trajflow.tasks.mda_analyses import PICKLE_SUFFIX
    found = []
    try:
        with h5py.File(plan.result_path(), "r") as f:
            f.visit(lambda name: found.append(name[:-len(PICKLE_SUFFIX)].split("/", 1)[-1])
                    if name.endswith(PICKLE_SUFFIX) else None)
    except OSError:
        return []
    return found


def inspect_runs(rundirs, tables=(), trust=False):
    """The report of trajflow runs and of timing tables of any tool (timing_tables.py).
    `trust`: the HTML report may unpickle results stored with pickle (runs their code)."""
    folder_notes = []
    runs = [load_run(d, folder_notes) for d in rundirs]
    table_records, notes = read_tables(tables)
    notes = folder_notes + notes
    records = [r for _, rs in runs for r in rs] + table_records
    flags = find_stragglers(records)
    advices = {os.path.basename(p.workdir): advice(p, rs) for p, rs in runs}
    not_judged = {}  # a run too short to judge: its flags are start-up noise, set aside
    for p, rs in runs:
        name = os.path.basename(p.workdir)
        why = stragglers_not_judged(rs)
        if why:
            not_judged[name] = why
        else:
            advices[name]["text"] += slow_host_advice([f for f in flags if f["run"] == name])
    for f in flags:
        f["judged"] = f["run"] not in not_judged
    return {"runs": [p.to_dict() for p, _ in runs], "tables": [os.path.abspath(t) for t in tables],
            "endings": {os.path.basename(p.workdir): how_it_ended(p.workdir, p) for p, _ in runs},
            "notes": notes, "records": records, "stragglers": flags,
            "critical_paths": critical_paths(records), "advice": advices,
            "not_judged": not_judged,
            "comparisons": compare_strategies(runs), "scaling": scaling(runs), "trust": trust}


def summary_text(report):
    lines = [line for ending in report.get("endings", {}).values() for line in ending["lines"]]
    lines += [phase_table(report["records"]), ""] + report.get("notes", [])
    lines += straggler_lines(report)
    for run, a in report["advice"].items():
        if (a.get("times") or {}).get("wall"):
            lines.append(f"wall time of {run}: {describe_wall(a['times']['wall'])}")
        lines.append(f"advice for {run}: {a['text']}")
    if report.get("comparisons"):
        lines.append("strategies measured side by side (analyze stage + split/convert):")
        lines += ["  " + line for line in report["comparisons"]]
    if report["scaling"]:
        lines.append("\nscaling (slowest rank per phase; S = t(N0) N0 / t(N), E = S / N):")
        lines.append(f"  {'analysis':10s} {'io':7s} {'mode':6s} {'N':>3s} {'t_total':>9s} "
                     f"{'S':>6s} {'E':>6s} {'E_io':>6s} {'E_compute':>9s}")
        for r in report["scaling"]:
            lines.append(f"  {r['analysis']:10s} {r['io']:7s} {r['mode']:6s} {r['N']:3d} "
                         f"{r['t_total']:9.3f} {r['S_total']:6.2f} {r['E_total']:6.2f} "
                         f"{fmt_or_na(r['E_io']):>6s} {fmt_or_na(r['E_compute']):>9s}")
    return "\n".join(lines)


def fmt_or_na(v):
    """A number for a table, or n/a where there is none."""
    return "n/a" if v is None else f"{v:.2f}"


def write_json(report, path, user_target=True):
    """The report as JSON into `path` (a file the user named: a link of theirs is followed)."""
    write_text(path, json.dumps(report, indent=1, default=str), user_target=user_target)


FLAG_COLUMNS = ["run", "task", "kind", "rank", "ranks", "block", "host", "duration_s",
                "baseline", "baseline_s", "ratio", "threshold_s", "cause", "excess_s",
                "impact_s", "victims_wait_s"]


def write_csv(report, path):
    """One row per task/rank record (intervals left out); then, under a header of
    their own, one row per straggler flag with its numbers and the sentence the
    terminal prints."""
    keys = sorted({k for r in report["records"] for k in r if k not in ("intervals", "radical")})
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["kind"] + keys)
        for r in report["records"]:  # a nested value (a rank's cpu_neighbours) as JSON
            w.writerow(["record"] + [json.dumps(r[k]) if isinstance(r.get(k), (dict, list))
                                     else r.get(k, "") for k in keys])
        w.writerow([])
        w.writerow(["kind"] + FLAG_COLUMNS + ["description"])
        for f in report["stragglers"]:
            w.writerow(["straggler"] + [" ".join(map(str, f[c])) if c == "ranks" and f.get(c)
                                        else f.get(c, "") for c in FLAG_COLUMNS] + [describe(f)])
