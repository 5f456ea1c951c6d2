"""`trajflow bench --scale large --ranks N ... [--ceiling]` and `--setup-growth`: how the
analyze stage scales against the machine's own ceiling, and how a rank's set-up grows.

Per case (XTC CA, XTC all atoms, DCD CA, H5MD CA RMSD over the large solvated AdK,
large.py) and rank count N, side by side in one run:
  ours     the N-rank analyze stage under plain `mpiexec -n N` (its slowest rank's
           t_total, main() to its record: set-up included);
  ceiling  the same frames cut N ways and run as N independent one-rank stages started
           at once (no MPI between them): what this machine gives N processes doing
           this work (memory bandwidth, clocks, the page cache shared), the slowest one;
  mda      MDAnalysis' RMSD.run() serial (N = 1) or backend="multiprocessing" with N
           workers, in a Python of its own.
Medians of `launches`; every result is checked against MDAnalysis' serial answer first.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from trajflow.workflows.bench.large import FRAMES_PER_COPY, check_equal, our_plan, our_result
from trajflow.workflows.bench.measure import (analyze_records, mda_timed_script, run_isolated,
                                              slowest_analyze_rank_s)
from trajflow.workflows.datasets import solvated_concatenated
from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment
from trajflow.workflows.run.planning import plan_from_options, write_plan


class Case:
    """One row group of the scaling table: a format's file and the atoms the RMSD fits."""

    def __init__(self, name, fmt, select, most_frames=None):
        self.name, self.fmt, self.select, self.most_frames = name, fmt, select, most_frames

    def file(self, files):
        return files[self.fmt]

    def frames(self, files):
        n = files["copies"] * FRAMES_PER_COPY
        return min(n, self.most_frames) if self.most_frames else n


# all atoms decode and fit 47,681 atoms a frame: 3,000 frames are plenty at every N
CASES = {c.name: c for c in (Case("xtc_ca", "xtc", "name CA"),
                             Case("xtc_all", "xtc", "all", most_frames=3000),
                             Case("dcd_ca", "dcd", "name CA"),
                             Case("h5md_ca", "h5md", "name CA"))}
TARGET_CEILING_RATIO = 1.10  # ours / ceiling at every N the machine has cores for
TARGET_UNACCOUNTED = 0.02    # t_overhead / t_total of every rank
SETUP_RANKS = (1, 2, 4, 8, 16, 32, 64)


def kernels_as_a_pilot_has_them():
    """Build the kernels ahead of time, as a pilot's bootstrapper does before any task:
    without it every rank imports numba and loads its JIT cache (0.7 s a rank on a
    16-core node, measured), which no run in a pilot pays."""
    from trajflow.tasks.kernels import build_ahead_of_time
    build_ahead_of_time()


def default_ranks(cores=None):
    """1, 2 and the machine's cores."""
    cores = cores or len(os.sched_getaffinity(0))
    return sorted({1, 2, cores})


def mpiexec():
    return os.path.join(os.path.dirname(sys.executable), "mpiexec")


def stage_plan(files, case, n, work, name, start=None, stop=None):
    """The case's N-rank plan over frames [start, stop) (default: all the case's)."""
    return our_plan(files, case.fmt, n, work, select=case.select, start=start,
                    stop=case.frames(files) if stop is None else stop, name=name)


def launch(plan, path, n):
    spec = stage_specs(plan, path)["analyze"][0]
    return subprocess.Popen([mpiexec(), "-n", str(n)] + spec.argv(sys.executable),
                            env={**os.environ, **task_environment()},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(procs, timeout):
    """Wait for every launched stage; a failure or a hang is an error, said whole."""
    deadline = time.time() + timeout
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            errors.append(f"still running after {timeout:.0f} s; killed")
            continue
        if proc.returncode:
            errors.append(f"exit {proc.returncode}: {err[-600:]}")
    if errors:
        raise RuntimeError("a benchmark stage failed: " + "; ".join(errors))


def unaccounted(records):
    """The largest share of a rank's time no phase names."""
    return max(r["t_overhead"] / r["t_total"] for r in records if r["t_total"] > 0)


def ours_row(files, case, n, work, launches, timeout):
    """(median slowest-rank seconds, unaccounted share, whether the ranks claimed before
    MPI_Init, plan, path) of the N-rank stage."""
    plan, path = stage_plan(files, case, n, work, f"{case.name}_{n}")
    seconds, shares, early = [], [], []
    for _ in range(launches):
        finish([launch(plan, path, n)], timeout)
        records = analyze_records(plan)
        seconds.append(slowest_analyze_rank_s(plan))
        shares.append(unaccounted(records))
        early.append(all(r.get("mpi_init_after_chunks") for r in records))
    return statistics.median(seconds), max(shares), all(early), plan, path


def ceiling_row(files, case, n, work, launches, timeout):
    """Median over launches of the slowest of N independent one-rank stages, each over
    its Nth of the frames, started at once."""
    total = case.frames(files)
    edges = np.linspace(0, total, n + 1).round().astype(int)
    plans = [stage_plan(files, case, 1, work, f"{case.name}_{n}_ceiling{i}", int(a), int(b))
             for i, (a, b) in enumerate(zip(edges, edges[1:]))]
    seconds = []
    for _ in range(launches):
        finish([launch(plan, path, 1) for plan, path in plans], timeout)
        seconds.append(max(slowest_analyze_rank_s(plan) for plan, _ in plans))
    return statistics.median(seconds)


MDA_RMSD_ANY = mda_timed_script("from MDAnalysis.analysis import rms",
                                "rms.RMSD(u, select=run_kw.pop('select'))", "rmsd")


def mda_row(files, case, n, work, timeout):
    """(seconds, rmsd) of MDAnalysis' RMSD of the case, serial at N = 1, else N workers."""
    out = os.path.join(work, f"mda_{case.name}_{n}.npy")
    run_kw = json.dumps({"select": case.select, "stop": case.frames(files)})
    seconds = run_isolated(MDA_RMSD_ANY, files["top"], case.file(files), str(n), out, run_kw,
                           timeout=timeout)
    return seconds, np.load(out)


def run_scaling(files, ranks, launches, cases=tuple(CASES), ceiling=True, with_mda=True,
                timeout=900, workdir=None, say=print):
    """{"frames": {case: n}, "scaling": {case: {N: {"ours_us", "ceiling_us", "mda_us",
    "unaccounted_fraction"}}}} over the large files (large.build_large); every N-rank
    result equal to MDAnalysis' serial one."""
    kernels_as_a_pilot_has_them()
    out = {"frames": {}, "scaling": {}, "ranks": list(ranks), "launches": launches,
           "cores": len(os.sched_getaffinity(0))}
    with tempfile.TemporaryDirectory(dir=workdir) as work:
        for name in cases:
            case = CASES[name]
            frames = case.frames(files)
            out["frames"][name] = frames
            us = lambda s: s / frames * 1e6  # noqa: E731
            serial_s, serial = mda_row(files, case, 1, work, timeout)
            rows = out["scaling"][name] = {}
            for n in ranks:
                say(f"  {name}: {n} rank(s) ...")
                ours_s, share, early, plan, path = ours_row(files, case, n, work, launches,
                                                            timeout)
                check_equal(our_result(plan, path), serial, f"{name}, {n} ranks")
                row = {"ours_us": us(ours_s), "unaccounted_fraction": share,
                       "claims_before_mpi_init": early, "ceiling_us": None, "mda_us": None}
                if ceiling:
                    row["ceiling_us"] = us(ceiling_row(files, case, n, work, launches, timeout))
                if with_mda:
                    mda_s = serial_s
                    if n > 1:
                        mda_s, theirs = mda_row(files, case, n, work, timeout)
                        check_equal(theirs, serial, f"{name}, MDAnalysis' {n} workers")
                    row["mda_us"] = us(mda_s)
                rows[n] = row
    return out


def format_scaling(result):
    lines = [f"\nscaling on this machine ({result['cores']} cores; us per frame, medians of "
             f"{result['launches']}; ours: the N-rank stage's slowest rank, set-up included; "
             "ceiling: N independent one-rank stages at once; S and E against ours at the fewest "
             "ranks measured)",
             f"  {'case':8s} {'N':>3s} {'ours':>9s} {'ceiling':>9s} {'MDA':>9s} {'S(N)':>6s} "
             f"{'E(N)':>5s} {'ours/ceil':>9s} {'unaccounted':>11s}"]
    worst = []
    for name, rows in result["scaling"].items():
        base = rows[min(rows)]["ours_us"]
        for n, r in sorted(rows.items()):
            ratio = r["ours_us"] / r["ceiling_us"] if r["ceiling_us"] else None
            if ratio is not None and n <= result["cores"]:
                worst.append((ratio, name, n))
            speedup = base / r["ours_us"]
            cell = lambda v: f"{v:9.1f}" if v is not None else f"{'-':>9s}"  # noqa: E731
            lines.append(f"  {name:8s} {n:3d} {cell(r['ours_us'])} {cell(r['ceiling_us'])} "
                         f"{cell(r['mda_us'])} {speedup:6.2f} {speedup / n:5.2f} "
                         f"{'-' if ratio is None else f'{ratio:.2f}':>9s} "
                         f"{r['unaccounted_fraction']:10.1%}")
    if worst:
        ratio, name, n = max(worst)
        lines.append(f"  worst ours/ceiling {ratio:.2f} ({name}, N = {n}; target <= "
                     f"{TARGET_CEILING_RATIO}); most unaccounted "
                     f"{max(r['unaccounted_fraction'] for rows in result['scaling'].values() for r in rows.values()):.1%} "
                     f"(target < {TARGET_UNACCOUNTED:.0%})")
    return lines


def setup_end(record):
    """When a rank's set-up ended: its last `setup` interval's end."""
    return max(b for name, _, b in record["intervals"] if name == "setup")


def run_setup_growth(ranks=SETUP_RANKS, launches=3, timeout=600, workdir=None, say=print):
    """How an analyze rank's set-up grows with N: an N-rank CA RMSD stage over a small DCD
    (4 frames a rank: the work is nothing beside the set-up), medians of `launches`:
      setup_growth  the slowest rank's set-up and finalize (main() to its first chunk,
                    and after its last collective), seconds;
      after_arrival from the last rank's main() to the last rank's end of set-up: what
                    the set-up costs once all ranks are there (MPI_Init's exchange,
                    communicators, the counter's window), apart from the launcher's skew;
      arrival_skew  the first rank's main() to the last one's: the launcher's, and the
                    interpreters' start-up competing for the cores;
      setup_cpu     the median rank's CPU seconds up to the end of its set-up (its
                    interpreter's start-up too): the set-up's own work, without waiting;
      setup_parts   the median rank's parts (tasks/timing.py).
    Ranks beyond the cores are oversubscribed: that shows how a cost grows, not its size."""
    kernels_as_a_pilot_has_them()
    # the solvated AdK (what a machine with only its files has too), 4 frames a rank
    top, traj = solvated_concatenated(max(1, -(-max(ranks) * 4 // FRAMES_PER_COPY)), "DCD")
    keys = ("setup_growth", "after_arrival", "arrival_skew", "setup_cpu")
    out = {k: {} for k in keys + ("setup_parts",)}
    with tempfile.TemporaryDirectory(dir=workdir) as work:
        for n in ranks:
            say(f"  set-up with {n} rank(s) ...")
            plan = plan_from_options(top, [traj], "rmsd", out=os.path.join(work, f"setup_{n}"),
                                     io="shared", mode="mpi", blocks=n, cpus=n)
            path = write_plan(plan)
            plan.lock.release()
            seen = {k: [] for k in keys}
            medians = []
            for _ in range(launches):
                finish([launch(plan, path, n)], timeout)
                records = analyze_records(plan)
                starts = [r["t_start"] for r in records]
                seen["setup_growth"].append(max(r["t_setup"] + r["t_finalize"] for r in records))
                seen["after_arrival"].append(max(map(setup_end, records)) - max(starts))
                seen["arrival_skew"].append(max(starts) - min(starts))
                seen["setup_cpu"].append(statistics.median(r["setup_cpu_s"] for r in records))
                medians.append({part: statistics.median(r["setup_parts"][part] for r in records)
                                for part in records[0]["setup_parts"]})
            for k in keys:
                out[k][n] = statistics.median(seen[k])
            out["setup_parts"][n] = {part: statistics.median(m[part] for m in medians)
                                     for part in medians[0]}
    return {**out, "cores": len(os.sched_getaffinity(0)), "launches": launches}


def format_setup_growth(result):
    growth, parts = result["setup_growth"], result["setup_parts"]
    first = min(growth)
    names = list(parts[first])
    lines = [f"\nset-up and finalize of an analyze rank ({result['cores']} cores; beyond them "
             f"oversubscribed; medians of {result['launches']}), seconds: the slowest rank's; "
             "after the last rank's arrival; the ranks' arrival skew; the median rank's CPU "
             "to the end of its set-up, and its parts",
             f"  {'N':>4s} {'slowest':>8s} {'x N=1':>6s} {'after':>8s} {'skew':>8s} {'cpu':>6s} "
             f"{'log2 N':>6s} " + " ".join(f"{p:>9s}" for p in names)]
    for n in sorted(growth):
        lines.append(f"  {n:4d} {growth[n]:8.3f} {growth[n] / growth[first]:6.2f} "
                     f"{result['after_arrival'][n]:8.3f} {result['arrival_skew'][n]:8.3f} "
                     f"{result['setup_cpu'][n]:6.3f} "
                     f"{np.log2(n):6.1f} " + " ".join(f"{parts[n][p]:9.4f}" for p in names))
    return lines
