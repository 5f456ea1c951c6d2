"""What to do next, said only where a run's own numbers support it.

A run too short to judge gets no strategy advice, only how much of it was
the pilot and the launch. Otherwise the advice names the strategy the run
used, its t_compute/t_IO ratio, the split or conversion it paid for (shown
apart: it is not in the analyze stage's t_total), and the gather's share
with the result's real size. Where several runs of one input measured
alternatives at the same rank count, the measurement is the advice
(`compare_strategies`). The papers are cited by authors and year; the
documentation's references page (docs/explanation/references.md) gives their titles.
"""
import glob
import math
import os
import socket

from trajflow.tasks.io_strategies import GUIDELINES
from trajflow.tasks.modes import MODES
from trajflow.tasks.plan import is_finite_number
from trajflow.tasks.rundir import (KEPT_TASK_FILES, PILOT_EVENTS, PILOT_PROFILES, read_lines,
                                   read_outcome, SESSIONS)
from trajflow.workflows.profile.judgeable import too_short_for_advice
from trajflow.workflows.profile.schedule_effects import schedule_advice
from trajflow.workflows.profile.stragglers import phase_times, rank_list
from trajflow.workflows.profile.wall_time import describe as describe_wall, ended_at, wall_time

REFERENCES = {
    "Khoshlessan et al. 2019": (
        "M. Khoshlessan, I. Paraskevakos, G. C. Fox, S. Jha, O. Beckstein: Guidelines for "
        "obtaining ideal performance for parallel analysis of molecular dynamics trajectories "
        "with Python on HPC resources (2019)"),
    "Jakupovic and Beckstein 2021": (
        "E. Jakupovic, O. Beckstein: MPI-parallel molecular dynamics trajectory analysis with "
        "the H5MD format in the MDAnalysis Python package, Proc. 20th Python in Science Conf. "
        "(SciPy 2021)"),
    "Khoshlessan et al. 2017": (
        "M. Khoshlessan, I. Paraskevakos, S. Jha, O. Beckstein: Parallel analysis in MDAnalysis "
        "using the Dask parallel computing library, Proc. 16th Python in Science Conf. "
        "(SciPy 2017)"),
    "Taufer et al. 2002": (
        "M. Taufer, E. Perathoner, A. Cavalli, A. Caflisch, T. Stricker: Performance "
        "characterization of a molecular dynamics code on PC clusters: is there any easy "
        "parallelism in CHARMM? (IPDPS 2002)"),
}

JUDGE_S = 10.0           # how long an analysis must be for its strategy to be judged
COMPUTE_BOUND = 100.0    # t_compute / t_IO above this: compute bound
GATHER_SHARE = 0.1       # a gather over this share of the analyze stage is worth a word
LARGE_RESULT_B = 10e6    # result arrays this large make the gather a matter of volume
CPU_WAIT_SHARE = 0.1     # ranks waiting for a CPU this share of their time: worth a word
CPU_WAIT_MIN_S = 0.5     # ... and at least this long
CULPRIT_SHARE = 0.25     # a culprit's CPU time explains at least this share of the wait


def pilot_span(rundir):
    """(start, stop) of the pilot that ran this run (its last session's: a resumed run or
    a replaced pilot has several): the first and last lines of its bootstrapper's
    profile, kept in the session folder; None where it is not known."""
    sessions = [line for line in read_lines(os.path.join(rundir, SESSIONS)) if line.strip()]
    if not sessions:
        return None
    session = sessions[-1]
    times = []
    for prof in glob.glob(os.path.join(session, "pilot.*", "bootstrap_0.prof")):
        for line in read_lines(prof):
            head = line.split(",", 1)[0]
            try:
                when = float(head) if head[:1].isdigit() else None
            except ValueError:  # not RADICAL's: a folder may come from anyone
                continue
            if when is not None and math.isfinite(when):
                times.append(when)
    return (min(times), max(times)) if times else None


def prepare_seconds(records):
    """The split or H5MD conversion's seconds; a run that reused a campaign's shared
    H5MD copy is charged what making it took, so strategies compare as if run alone."""
    return sum(r.get("conversion_reused_s", r["t_total"]) for r in records if r["task"] == "split")


def pilot_active(rundir):
    """(start, active) of the pilot that ran this run: its bootstrapper's start and the
    moment RADICAL declared it active, from the lines the run kept (outcomes.py), or
    its session folder's profiles; None where not known."""
    lines = list(read_lines(os.path.join(rundir, KEPT_TASK_FILES, PILOT_EVENTS)))
    if not lines:
        sessions = [line for line in read_lines(os.path.join(rundir, SESSIONS)) if line.strip()]
        for name in (PILOT_PROFILES if sessions else ()):
            for prof in sorted(glob.glob(os.path.join(sessions[-1], "pilot.*", name))):
                lines += read_lines(prof)
    start = active = None
    for line in lines:
        parts = line.rstrip("\n").split(",")
        if len(parts) < 6:
            continue
        try:
            when = float(parts[0])
        except ValueError:  # not RADICAL's: a folder may come from anyone
            continue
        if not math.isfinite(when):
            continue
        if parts[1] == "bootstrap_0_start":
            start = when if start is None else min(start, when)
        elif parts[1] == "advance" and parts[5] == "PMGR_ACTIVE":
            active = when if active is None else min(active, when)
    return (start, active) if start is not None or active is not None else None


def stage_times(records):
    """Seconds, from the records: the analysis itself (the slowest analyze rank's open,
    I/O and compute), the analyze stage, the split or conversion, the launch of the
    tasks (RADICAL's share and the ranks' start-up) and the span of the tasks."""
    analyze = [r for r in records if r["task"] == "analyze"]
    first = min(r["t_start"] - r.get("t_launch", 0.0) for r in records)
    last = max(r["t_stop"] for r in records)
    times = {"analysis": max(sum(phase_times(r)[p] for p in ("open", "io", "compute"))
                             for r in analyze),
             "analyze_stage": max(r["t_stop"] for r in analyze)
             - min(r["t_start"] - r.get("t_launch", 0.0) for r in analyze),
             "prepare": prepare_seconds(records),
             "launch": sum(r.get("t_launch", 0.0) for r in records if r.get("rank", 0) == 0),
             "tasks_span": last - first}
    return times


def run_times(records, plan):
    """stage_times, and the run's wall time with where it went (`wall`, see
    wall_time.py; `whole` its sum), from the run's folder."""
    times = stage_times(records)
    outcome = read_outcome(plan.workdir) or {}
    times["wall"] = wall_time(records, plan.asked_at, outcome, pilot_active(plan.workdir),
                              ended_at(outcome))
    times["whole"] = times["wall"]["whole"]
    return times


def strategy_flags(io, mode, gather, schedule=None):
    """A strategy as the flags that ask for it; the gather only in mpi mode, the
    schedule only when neither the papers' static blocks nor left to auto."""
    return (f"--io {io} --mode {mode}" + (f" --gather {gather}" if MODES[mode].collective else "")
            + (f" --schedule {schedule}" if schedule not in (None, "static", "auto") else ""))


def advice(plan, records):
    """The advice for one run: {"text", "ratio", "t_io", "t_compute", "times"}."""
    analyze = [r for r in records if r["task"] == "analyze"]
    if not analyze:
        return {"ratio": None, "text": "no analyze records: the run did not reach the analyze stage"}
    times = run_times(records, plan)
    t_io = sum(r["t_io"] for r in analyze)
    t_compute = sum(r["t_compute"] for r in analyze)
    ratio = t_compute / t_io if t_io > 0 else float("inf")
    out = {"ratio": ratio, "t_io": t_io, "t_compute": t_compute, "times": times}
    if too_short_for_advice(times):  # nor its CPU wait: start-up noise, not a culprit
        out["text"] = too_short(plan, times)
        return out
    strategy = strategy_flags(plan.io, plan.mode, plan.gather)
    prepared = _prepared(plan, times)
    if ratio >= COMPUTE_BOUND:
        text = (f"compute bound with {strategy} (t_compute/t_IO = {ratio:.0f}): more ranks "
                f"shorten it ({GUIDELINES}).")
    else:
        text = plan.io_strategy.io_bound_advice(strategy, ratio, prepared)
    out["text"] = (text + _gather_note(plan, analyze, times) + schedule_advice(plan, analyze)
                   + cpu_wait_note(analyze))
    return out


def cpu_wait_note(analyze):
    """How long the analyze ranks were ready to run but waited for a CPU another process
    held (t_cpu_wait, Linux' run-queue wait), where it is a share worth saying, and who
    held it as the nodes' first ranks measured (tasks/cpu_neighbours.py), each culprit
    answered with its own remedy."""
    waits = [(r.get("t_cpu_wait") or 0.0, r["t_total"]) for r in analyze]
    wait, total = sum(w for w, _ in waits), sum(t for _, t in waits)
    if total <= 0 or wait < max(CPU_WAIT_MIN_S, CPU_WAIT_SHARE * total):
        return ""
    said = (f" The analyze ranks waited {wait:.1f} s of their {total:.1f} s ({wait / total:.0%}) "
            "for a CPU that other processes held")
    by_kind, top = cpu_neighbours(analyze)
    if by_kind is None:
        return said + "; who held it was not measured (records of an older trajflow)."
    busy = {kind: s for kind, s in by_kind.items() if s >= 0.05}
    if not busy:
        return said + "; no other process was seen using a CPU meanwhile (one that started " \
                      "and ended between the measurements is not seen)."
    culprit = max(busy, key=busy.get)
    explained = busy[culprit] >= CULPRIT_SHARE * wait
    said += ("; meanwhile on their nodes " + ", ".join(
        f"{kind} used {seconds:.1f} CPU-s" for kind, seconds in
        sorted(busy.items(), key=lambda kv: -kv[1])))
    if top:
        said += " (most: " + ", ".join(f"{name} pid {pid}, {kind}, {seconds:.1f} s"
                                       for name, pid, kind, seconds in top[:3]) + ")"
    if not explained:  # too little to have kept the ranks waiting: no culprit named
        return said + ": too little to explain the wait (a process that started and ended " \
                      "between the measurements is not seen)."
    return said + REMEDIES[culprit](analyze)


def cpu_neighbours(analyze):
    """({kind: CPU seconds}, [(name, pid, kind, seconds)], most first) from the records
    that measured them, one a host (its longest window: in tasks mode every task of a
    node measures, and their windows overlap); (None, []) where none did. A folder may
    come from anyone: entries that are not what cpu_neighbours.py writes are left out."""
    by_host = {}
    for r in analyze:
        seen = r.get("cpu_neighbours")
        if (isinstance(seen, dict) and isinstance(seen.get("by_kind"), dict)
                and is_finite_number(seen.get("window_s"))):
            best = by_host.get(r.get("host"))
            if best is None or seen["window_s"] > best["window_s"]:
                by_host[r.get("host")] = seen
    if not by_host:
        return None, []
    by_kind, top = {}, []
    for seen in by_host.values():
        for kind, seconds in seen["by_kind"].items():
            if kind in REMEDIES and is_finite_number(seconds) and seconds >= 0:
                by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        for entry in seen.get("top") if isinstance(seen.get("top"), list) else []:
            if (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                    and isinstance(entry[1], int) and entry[2] in REMEDIES
                    and is_finite_number(entry[3])):
                name = "".join(c if c.isprintable() else "?" for c in entry[0][:32])
                top.append((name, entry[1], entry[2], float(entry[3])))
    return by_kind, sorted(top, key=lambda e: -e[3])


def _radical_remedy(analyze):
    here = all(r.get("host") == socket.gethostname() for r in analyze)
    if here:
        return (": RADICAL's agent and client share the ranks' cores here. --resource "
                "local.localhost_agent_core keeps CPU 0 for them (its ranks then ran as fast "
                "as under plain mpiexec, at one core fewer), or give the run fewer ranks "
                "than cores.")
    return (": RADICAL's agent shares the ranks' cores on the pilot's first node. A resource "
            "config's system_architecture.blocked_cores keeps cores for the agent, which "
            "trajflow's ranks then leave.")


REMEDIES = {
    "RADICAL": _radical_remedy,
    "other runs": lambda analyze: (": other trajflow runs on the same pilot held the cores; "
                                   "send fewer runs at once, or hold a pilot with more cores."),
    "this run": lambda analyze: (": the run's own processes (more ranks on a node than the "
                                 "CPUs they may use, or its launcher); give it fewer ranks "
                                 "than the cores left to it."),
    "other": lambda analyze: (": programs that are neither trajflow's nor RADICAL's ran on "
                              "the ranks' cores. Run when they have ended, or give the run "
                              "fewer ranks than the cores they leave free."),
}


def slow_host_advice(flags):
    """A sentence per host the straggler judge found slow as a whole (all its ranks
    late): on a cluster that is a node to leave out, not ranks to rebalance."""
    return "".join(
        f" Host {f['host']} was slow as a whole in {f['task']} (ranks {rank_list(f['ranks'])}, "
        f"{f['ratio']:.1f}x the healthy ranks' time, mostly {f['cause']}): leave the node out "
        f"of the next pilot (SLURM reads SBATCH_EXCLUDE={f['host']} from trajflow's environment) "
        "and tell the site, or use --schedule dynamic, which gives a slow node's ranks fewer "
        "frames." for f in flags if f["kind"] == "host")


def too_short(plan, times):
    frames = plan.n_frames * JUDGE_S / max(times["analysis"], 1e-3)
    frames = int(round(frames, -int(math.floor(math.log10(frames))) + 1))  # 2 digits: ~120000
    tasks = f"{times['launch']:.1f} s launching tasks (process start-up, imports)"
    if times["prepare"]:
        tasks += f", {times['prepare']:.1f} s {plan.io_strategy.preparing}"
    return (f"too short to judge a strategy: the analysis itself took {times['analysis']:.2f} s "
            f"of the run's wall time, {describe_wall(times['wall'])}; of the tasks' time "
            f"{tasks}. Time a trajectory of "
            f"~{frames:,} frames or more (about {JUDGE_S:.0f} s of analysis) before choosing "
            "--io, --mode or the rank count.")


def _prepared(plan, times):
    if not times["prepare"]:
        return ""
    return (f" ({plan.io_strategy.preparing} took {times['prepare']:.1f} s, not counted in "
            "the analyze stage's "
            f"{times['analyze_stage']:.1f} s)")


def _gather_note(plan, analyze, times):
    comm = max(r["t_comm"] for r in analyze)
    if not plan.execution.collective or comm <= GATHER_SHARE * times["analyze_stage"]:
        return ""
    result = plan.result_path()
    size = os.path.getsize(result) if os.path.exists(result) else None
    said = f" The gather took {comm:.2f} s ({comm / times['analyze_stage']:.0%} of the analyze stage)"
    if size is None:
        return said + "."
    said += f" for a result of {size / 1e3:.0f} KB"
    if size >= LARGE_RESULT_B:
        return said + ": large arrays; --mode tasks hands each block over as a file instead."
    if plan.gather == "gatherv":
        return (said + ": small arrays, so its time is latency and the wait for the slowest "
                f"rank; --gather rma (one-sided puts) avoids the collective ({GUIDELINES}).")
    return said + ": small arrays, so its time is latency and the wait for the slowest rank."


def compare_strategies(runs):
    """Where runs of one input and analysis measured several strategies at one rank
    count: a line per rank count, fastest first, the split or conversion counted
    and shown apart."""
    points = {}
    for plan, records in runs:
        if not any(r["task"] == "analyze" for r in records):
            continue
        times = stage_times(records)
        label = strategy_flags(plan.io, plan.mode, plan.gather, plan.schedule)
        key = (plan.input_checksum, plan.analysis, plan.n_workers)
        points.setdefault(key, {}).setdefault(label, []).append(
            (times["analyze_stage"] + times["prepare"], times["prepare"]))
    return [comparison_line(f"{analysis} at N = {n}", by_label)
            for (_, analysis, n), by_label in sorted(points.items(), key=lambda kv: kv[0][1:])
            if len(by_label) > 1]


def comparison_line(title, by_label):
    """One line comparing strategies measured at one point, fastest first:
    `by_label`: strategy -> [(seconds with split/convert, of which split/convert)]."""
    means = sorted((sum(t for t, _ in v) / len(v), sum(p for _, p in v) / len(v), label)
                   for label, v in by_label.items())
    best = means[0][0]
    return f"{title}: " + "; ".join(
        f"{label} {t:.2f} s" + (f" (of which {p:.2f} s split/convert)" if p else "") +
        (f", {t / best:.1f}x the fastest" if t > best else " (fastest)")
        for t, p, label in means)
