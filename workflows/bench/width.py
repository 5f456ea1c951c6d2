"""`trajflow bench --width`: a pilot's start-up and its tasks' launch at 1, 2 and
4 nodes of a batch cluster, and how they grow per node.

One pilot per width on a SLURM resource (by default the virtual cluster of
tests/cluster/virtual.sh), each running AdK's CA-RMSD with a rank per core
(MPI across every node of the pilot). From each run's own profile: the time
from the call to the pilot's agent (planning, sbatch, the job's start, the
agent's bootstrap: `pilot_s`), the analyze task's launch (RADICAL's placement
and launch, mpiexec's proxies started through srun on every node, the ranks'
Python start-up: `analyze_launch_s`), the split and reduce tasks' launches
(one core, on the agent's node or another), and the whole wall time. The
growth per added node is the least-squares slope over the widths; the line
at 100 nodes extrapolates it from the widest pilot (a slope below 0 is noise,
taken as flat) and names the part that would dominate there. On one machine
the nodes share its cores: the ranks' start-up then grows with their number
however the launch scales, so the launch's growth here is an upper bound.
"""
import os
import tempfile
import time

import numpy as np

from trajflow.workflows.datasets import adk_files
from trajflow.workflows.profile.advice import run_times
from trajflow.workflows.run import resources
from trajflow.workflows.run.api import run as run_api

WIDTHS = (1, 2, 4)
EXTRAPOLATE_TO = 100


def slope(xs, ys):
    """Least-squares growth of ys per unit of xs (0 with one point)."""
    return float(np.polyfit(xs, ys, 1)[0]) if len(set(xs)) > 1 else 0.0


def cores_per_node(resource):
    """The resource's cores per node; ValueError where it declares none."""
    cores = int((resources.merged_config(resource) or {}).get("cores_per_node") or 0)
    if cores < 1:
        raise ValueError(f"{resource} declares no cores_per_node: the width of a pilot cannot "
                         "be asked in nodes")
    return cores


def run_width(resource, cores, widths=WIDTHS, folder=None):
    """One pilot per width of `cores` per node; the numbers as a dict (see format_width)."""
    top, traj = adk_files()
    folder = folder or tempfile.mkdtemp(prefix="trajflow-bench-width-")
    rows = []
    for nodes in widths:
        t0 = time.time()
        run = run_api(top, traj, "rmsd", resource=resource, cpus=nodes * cores,
                      blocks=nodes * cores, walltime=15, progress=False,
                      out=os.path.join(folder, f"width-{nodes}"))
        wall = time.time() - t0
        records = run.profile.records
        times = run_times(records, run.plan)
        # None where the run has no such task (--io shared has no split stage)
        launch = {task: max((r.get("t_launch", 0.0) for r in records if r["task"] == task),
                            default=None)
                  for task in ("split", "analyze", "reduce")}
        first_task = min(r["t_start"] - r.get("t_launch", 0.0) for r in records)
        rows.append({"nodes": nodes, "cpus": nodes * cores,
                     "hosts": sorted({r["host"] for r in records if r["task"] == "analyze"}),
                     "pilot_s": first_task - run.plan.asked_at,
                     "pilot_wait_s": times["wall"]["parts"].get("pilot start"),
                     "split_launch_s": launch["split"], "analyze_launch_s": launch["analyze"],
                     "reduce_launch_s": launch["reduce"], "tasks_s": times["tasks_span"],
                     "wall_s": wall})
    xs = [r["nodes"] for r in rows]
    growth = {key: slope(xs, [r[key] for r in rows])
              for key in ("pilot_s", "analyze_launch_s", "tasks_s", "wall_s")}
    # a start-up does not shrink with width: a negative slope is noise (the first pilot
    # warms the caches), extrapolated as flat
    at_scale = {key: max(r[key] for r in rows) + max(0.0, growth[key])
                * (EXTRAPOLATE_TO - rows[-1]["nodes"])
                for key in ("pilot_s", "analyze_launch_s", "tasks_s")}
    return {"resource": resource, "cores_per_node": cores, "rows": rows,
            "growth_per_node_s": growth, f"at_{EXTRAPOLATE_TO}_nodes_s": at_scale,
            "dominant_at_scale": max(("pilot_s", "analyze_launch_s"), key=at_scale.get)}


NAMES = {"pilot_s": "the pilot's start (sbatch, the job's start, the agent's bootstrap)",
         "analyze_launch_s": "the MPI task's launch (placement, srun-started proxies on every "
                             "node, the ranks' Python start-up)"}


def _seconds(value, width):
    return f"{'-':>{width}s}" if value is None else f"{value:{width}.2f}"


def format_width(result):
    lines = [f"\nstart-up at width on {result['resource']} ({result['cores_per_node']} cores per "
             "node; one pilot per width; AdK CA-RMSD, a rank per core):",
             f"  {'nodes':>5s} {'ranks':>5s} {'pilot s':>8s} {'split launch':>12s} "
             f"{'analyze launch':>14s} {'reduce launch':>13s} {'tasks s':>8s} {'wall s':>7s}  hosts"]
    for r in result["rows"]:
        lines.append(f"  {r['nodes']:5d} {r['cpus']:5d} {r['pilot_s']:8.1f} "
                     f"{_seconds(r['split_launch_s'], 12)} {r['analyze_launch_s']:14.2f} "
                     f"{_seconds(r['reduce_launch_s'], 13)} {r['tasks_s']:8.1f} {r['wall_s']:7.1f}  "
                     f"{','.join(r['hosts'])}")
    g = result["growth_per_node_s"]
    scale = result[f"at_{EXTRAPOLATE_TO}_nodes_s"]
    lines.append(f"  per added node: pilot {g['pilot_s']:+.2f} s, analyze launch "
                 f"{g['analyze_launch_s']:+.2f} s, tasks {g['tasks_s']:+.2f} s, wall "
                 f"{g['wall_s']:+.2f} s")
    lines.append(f"  at {EXTRAPOLATE_TO} nodes (linear from the widest; no growth below 0): pilot "
                 f"~{scale['pilot_s']:.0f} s, analyze "
                 f"launch ~{scale['analyze_launch_s']:.0f} s; the larger: "
                 f"{NAMES[result['dominant_at_scale']]}")
    return lines
