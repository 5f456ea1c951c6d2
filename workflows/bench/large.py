"""`trajflow bench --scale large`: XTC, DCD and H5MD at gigabyte scale, side by side.

MDAnalysisTests' solvated AdK (GRO/XTC: 47,681 atoms, protein first, 10 frames,
triclinic box) repeated until the XTC holds `gb` GB, written once into the cache
as XTC, DCD and H5MD with the same frames (the DCD and H5MD are ~3.5x the XTC).
Per format, CA RMSD: trajflow's analyze stage under plain mpiexec with 1 and 2
ranks (the slowest rank's t_total, best of `launches`) against MDAnalysis'
`RMSD.run()` serial and `run(backend="multiprocessing", n_workers=2)`, one
after another in this process; every result is checked against MDAnalysis'
before a number is reported. Then the XTC 2-rank analyze stage inside a kept
local pilot against the same stage under plain mpiexec.
"""
import math
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np

from trajflow.workflows.bench.measure import (analyze_records, mpiexec_stage_s,
                                              slowest_analyze_rank_s)
from trajflow.workflows.datasets import cache_dir, mdanalysis_data, solvated_concatenated
from trajflow.workflows.errors import InputError
from trajflow.workflows.run.execute import run_plans
from trajflow.tasks.placement import node_cpus, split_cpus
from trajflow.workflows.run.resources import agent_cores
from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment
from trajflow.workflows.run.planning import plan_from_options, write_plan
from trajflow.workflows.run.spec import PilotSpec
from trajflow.tasks.results import open_result

FORMATS = ("xtc", "dcd", "h5md")
FRAMES_PER_COPY = 10  # the solvated AdK XTC of MDAnalysisTests


def large_copies(gb):
    """How many copies of the 10-frame solvated XTC make an XTC of `gb` GB."""
    [xtc] = mdanalysis_data("XTC")
    return max(1, math.ceil(gb * 1e9 / os.path.getsize(xtc)))


def disk_needed(copies):
    """Bytes the three files take: the XTC as its source compresses, DCD and H5MD 12 bytes an atom."""
    [xtc] = mdanalysis_data("XTC")
    frames = copies * FRAMES_PER_COPY
    return {"xtc": copies * os.path.getsize(xtc), "dcd": frames * (47681 * 12 + 80),
            "h5md": frames * (47681 * 12 + 64)}


def build_large(gb, say=print):
    """The three files in the cache (built where missing): {"top", fmt: path, "build_s"}."""
    copies = large_copies(gb)
    need = disk_needed(copies)
    missing = {f: n for f, n in need.items()
               if not os.path.exists(os.path.join(cache_dir(), f"solvated_x{copies}.{f}"))}
    free = shutil.disk_usage(cache_dir()).free
    if sum(missing.values()) > 0.95 * free:
        raise InputError(f"the large benchmark needs {sum(missing.values()) / 1e9:.1f} GB more in "
                         f"{cache_dir()} and {free / 1e9:.1f} GB are free: free some space, point "
                         "TRAJFLOW_CACHE at a larger disk, or lower --large-gb")
    if missing:
        say(f"building the large case once: solvated AdK x{copies} = {copies * FRAMES_PER_COPY} "
            f"frames as {', '.join(missing)} ({sum(missing.values()) / 1e9:.1f} GB in {cache_dir()})")
    t0 = time.time()
    out = {}
    for fmt in FORMATS:
        out["top"], out[fmt] = solvated_concatenated(copies, fmt.upper())
    import MDAnalysis as mda
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mda.Universe(out["top"], out["xtc"])  # MDAnalysis' offsets, which our XTC reader reuses
    out["build_s"] = time.time() - t0
    out["copies"] = copies
    out["bytes"] = {f: os.path.getsize(out[f]) for f in FORMATS}
    if missing:
        say(f"  built in {out['build_s']:.0f} s")
    else:
        out["build_s"] = None  # built by an earlier run
    return out


def our_plan(files, fmt, n, workdir, select=None, start=None, stop=None, name=None):
    """An N-rank rmsd plan over the format's file (of CA, or `select`; frames [start,
    stop)) in workdir/`name`: io shared (our XTC and DCD readers), or io h5md reading the
    prepared H5MD as its copy (no conversion)."""
    traj = files["xtc"] if fmt == "h5md" else files[fmt]
    extra = {"select": select} if select else {}
    plan = plan_from_options(files["top"], [traj], "rmsd",
                             out=os.path.join(workdir, name or f"{fmt}_{n}"),
                             io="h5md" if fmt == "h5md" else "shared", mode="mpi", blocks=n,
                             cpus=n, start=start, stop=stop, **extra)
    if fmt == "h5md":
        plan.shared_h5md = files["h5md"]
    path = write_plan(plan)
    plan.lock.release()
    return plan, path


def our_result(plan, path):
    """The rmsd the last launch published (an MPI analyze's root publishes result.h5;
    a plan whose mode leaves that to a reduce task runs it here)."""
    for spec in stage_specs(plan, path)["reduce"]:
        subprocess.run(spec.argv(sys.executable), check=True,
                       env={**os.environ, **task_environment()})
    return open_result(plan.workdir)["rmsd"]


def check_equal(ours, theirs, what):
    if ours.shape != theirs.shape or not np.allclose(ours, theirs, atol=1e-4, rtol=0):
        raise RuntimeError(f"{what}: trajflow's RMSD differs from MDAnalysis' (max "
                           f"{np.max(np.abs(ours - theirs)) if ours.shape == theirs.shape else ours.shape} Å); "
                           "no numbers are reported for a wrong answer")


def pilot_vs_mpiexec(files, workdir, launches):
    """The XTC analyze stage with 2 ranks, the slowest rank's t_total, median of `launches`:
    inside one kept local pilot (the runs one after another) and under plain mpiexec;
    and what every other process on this machine (RADICAL's agent and client, EnTK,
    this one) used of the CPUs while the ranks ran, in cores."""
    plan, path = our_plan(files, "xtc", 2, os.path.join(workdir, "mpiexec"))
    mpiexec_s = float(np.median(mpiexec_stage_s(plan, path, launches)))
    runs = [(f"r{k}",) + our_plan(files, "xtc", 2, os.path.join(workdir, f"pilot{k}"))
            for k in range(launches)]
    with CpuSampler() as cpu:
        report = run_plans(runs, PilotSpec(walltime=30, cpus=2), one_at_a_time=True,
                           session_root=os.path.join(workdir, "pilot"))
    if not report.ok:
        raise RuntimeError("the pilot runs of the large benchmark failed: "
                           + "; ".join(o.describe() for o in report.failed))
    others = [cpu.cores_besides(*analyze_window(p), "trajflow.tasks.analyze") for _, p, _ in runs]
    pilot_s = float(np.median([slowest_analyze_rank_s(p) for _, p, _ in runs]))
    return {"pilot_s": pilot_s, "mpiexec_s": mpiexec_s, "ratio": pilot_s / mpiexec_s,
            "other_processes_cores": float(np.median(others)), "launches": launches,
            "placed": placed_pilot_vs_mpiexec(files, workdir, launches)}


PLACED_RESOURCE = "local.localhost_agent_core"


def placed_pilot_vs_mpiexec(files, workdir, launches):
    """The same stage, whole frames (every atom decoded: the rank always busy), with
    RADICAL's processes kept on the CPUs the resource keeps for the agent and the ranks
    on the others, against plain mpiexec pinned to those others, at equal rank count;
    medians of `launches`. This process (the run's watchdog) goes to the agent's CPUs
    too while the pilot runs."""
    agent, others = split_cpus(agent_cores(PLACED_RESOURCE), node_cpus())
    kept = set(agent)
    n = len(others) if kept else 0
    if n == 0:
        return None  # one CPU: nothing to place the ranks on
    plan, path = our_plan(files, "xtc", n, os.path.join(workdir, "placed_mpiexec"), select="all")
    mpiexec_s = float(np.median(mpiexec_stage_s(plan, path, launches, cpus=others)))
    runs = [(f"p{k}",) + our_plan(files, "xtc", n, os.path.join(workdir, f"placed{k}"),
                                  select="all") for k in range(launches)]
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, kept)
    try:
        with CpuSampler() as cpu:
            report = run_plans(runs, PilotSpec(PLACED_RESOURCE, walltime=30, cpus=n),
                               one_at_a_time=True, session_root=os.path.join(workdir, "placed_pilot"))
    finally:
        os.sched_setaffinity(0, before)
    if not report.ok:
        raise RuntimeError("the placed pilot runs of the large benchmark failed: "
                           + "; ".join(o.describe() for o in report.failed))
    records = [r for _, p, _ in runs for r in analyze_records(p)]
    if any(set(r["cpus"]) & kept for r in records):
        raise RuntimeError(f"a rank ran on the agent's CPUs {sorted(kept)}: "
                           f"{[r['cpus'] for r in records]}")
    pilot_s = float(np.median([slowest_analyze_rank_s(p) for _, p, _ in runs]))
    return {"ranks": n, "agent_cpus": sorted(kept), "rank_cpus": others,
            "pilot_s": pilot_s, "mpiexec_s": mpiexec_s, "ratio": pilot_s / mpiexec_s,
            "rank_cpu_wait_s": float(np.median([r["t_cpu_wait"] or 0.0 for r in records])),
            "other_processes_cores": float(np.median(
                [cpu.cores_besides(*analyze_window(p), "trajflow.tasks.analyze")
                 for _, p, _ in runs]))}


def analyze_window(plan):
    """[first analyze rank's start, last one's stop] of a run, from its profile records."""
    records = analyze_records(plan)
    return min(r["t_start"] for r in records), max(r["t_stop"] for r in records)


class CpuSampler:
    """Every process' CPU seconds on this machine, read from /proc every `every` s in a
    thread: what the processes around the ranks took while they ran."""

    def __init__(self, every=0.2):
        import threading
        self.every, self.samples = every, []  # (time, {pid: (cpu s, cmdline)})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            now, snap = time.time(), {}
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:  # gone meanwhile
                    continue
                snap[pid] = ((int(fields[11]) + int(fields[12])) / tick, cmd)
            self.samples.append((now, snap))
            self._stop.wait(self.every)

    def cores_besides(self, t0, t1, exclude):
        """CPU used in [t0, t1] by the processes whose command line lacks `exclude`, in cores."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        (a_t, a), (b_t, b) = inside[0], inside[-1]
        used = sum(cpu - a.get(pid, (0.0, ""))[0] for pid, (cpu, cmd) in b.items()
                   if exclude not in cmd)
        return used / (b_t - a_t)


def run_large(gb=2.0, launches=3, with_entk=True, workdir=None, say=print, ranks=None,
              ceiling=False, cases=None):
    """The scaling rows (scaling.py) of every format at `ranks` (default 1, 2 and this
    machine's cores), and the XTC stage in a kept pilot against plain mpiexec."""
    import tempfile
    from trajflow.workflows.bench import scaling
    files = build_large(gb, say)
    out = {"large": {"copies": files["copies"], "build_s": files["build_s"],
                     "bytes": files["bytes"]}}
    out.update(scaling.run_scaling(files, ranks or scaling.default_ranks(), launches,
                                   cases or tuple(scaling.CASES), ceiling=ceiling,
                                   workdir=workdir, say=say))
    if with_entk:
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            say("  the XTC analyze stage in a kept local pilot and under mpiexec ...")
            out["pilot_vs_mpiexec"] = pilot_vs_mpiexec(files, tmp, launches)
    return out


def format_large(result):
    from trajflow.workflows.bench import scaling
    lg = result["large"]
    built = ("built by an earlier run" if lg["build_s"] is None
             else f"built now in {lg['build_s']:.0f} s")
    lines = [f"\nlarge: solvated AdK x{lg['copies']} = {lg['copies'] * FRAMES_PER_COPY} frames of "
             f"47,681 atoms, RMSD ({built}; XTC {lg['bytes']['xtc'] / 1e9:.2f} GB, DCD "
             f"{lg['bytes']['dcd'] / 1e9:.2f} GB, H5MD {lg['bytes']['h5md'] / 1e9:.2f} GB)"]
    lines += scaling.format_scaling(result)
    rows = result["scaling"]
    x, d = rows.get("xtc_ca", {}), rows.get("dcd_ca", {})
    if 1 in x and 2 in x and x[1]["mda_us"] and x[2]["mda_us"]:
        lines.append(f"  XTC: MDA serial / ours 1 rank {x[1]['mda_us'] / x[1]['ours_us']:.1f} "
                     f"(target >= 5); MDA 2 workers / ours 2 ranks "
                     f"{x[2]['mda_us'] / x[2]['ours_us']:.1f} (target >= 3)")
    if 1 in d and 2 in d:
        lines.append(f"  DCD E(2) {d[1]['ours_us'] / (2 * d[2]['ours_us']):.2f} (target >= 0.9)")
    if "pilot_vs_mpiexec" in result:
        p = result["pilot_vs_mpiexec"]
        lines.append(f"  the XTC analyze stage, 2 ranks (medians of {p['launches']}): in a kept "
                     f"local pilot {p['pilot_s']:.2f} s, under plain mpiexec {p['mpiexec_s']:.2f} s: "
                     f"{p['ratio']:.2f}x (target <= 1.05); meanwhile every other process "
                     f"(RADICAL's agent and client, EnTK) used {p['other_processes_cores']:.2f} "
                     f"of this machine's {os.cpu_count()} cores")
        q = p["placed"] or {}
        lines.append("  placed: not measured (this machine has no CPU besides the agent's)"
                     if not q else f"  placed ({PLACED_RESOURCE}: RADICAL on CPUs {q['agent_cpus']}, "
                     f"{q['ranks']} rank(s) on {q['rank_cpus']}, whole frames): in the pilot "
                     f"{q['pilot_s']:.2f} s, under mpiexec on the same CPUs {q['mpiexec_s']:.2f} s: "
                     f"{q['ratio']:.2f}x (target <= 1.05); the ranks waited {q['rank_cpu_wait_s']:.2f} s "
                     f"for a CPU; the other processes used {q['other_processes_cores']:.2f} cores")
    return lines
