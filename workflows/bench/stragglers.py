"""`trajflow bench --stragglers`: static blocks against the dynamic schedule, with and
without a rank (or task) slowed by a cgroup CPU quota, side by side in one run.

MPI mode, 2 ranks under plain mpiexec, on AdK concatenated K times as XTC, CA
RMSD and backbone dihedrals: a clean pair of launches (static, dynamic) and a
pair with rank 1 limited to SLOW_FRACTION of a core. Each launch's frames loop
(from the first chunk's start to the last chunk's end over the ranks) is set
against the balanced optimum W / sum of the ranks' measured speeds (frames per
second of their chunks), the gather and the part's writing left out: they do
not depend on the schedule. Tasks mode, 8 blocks on a 2-core local pilot: the
analyze stage's makespan clean, and with the last block's task slowed, static
against dynamic (claims and backup copies).
"""
import os
import statistics
import subprocess
import sys

from trajflow.workflows.bench.cpu_quota import CpuQuota
from trajflow.workflows.bench.measure import analyze_records
from trajflow.workflows.datasets import adk_concatenated
from trajflow.workflows.profile.schedule_effects import mpi_effect
from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment
from trajflow.workflows.run.planning import plan_from_options, write_plan
from trajflow.workflows.run.spec import PilotSpec

SLOW_FRACTION = 0.25   # the slowed rank's or task's share of one core
SLOW_RANK = 1          # rank 0 gathers by default: the one a dynamic schedule may spare
TASK_BLOCKS = 8


def _mpi_launch(top, xtc, analysis, schedule, slow, workdir):
    """One launch of the analyze stage under mpiexec -n 2; its numbers."""
    plan = plan_from_options(top, [xtc], analysis, 2, out=workdir, mode="mpi", blocks=2,
                             schedule=schedule)
    plan_path = write_plan(plan)
    plan.lock.release()
    env = {**os.environ, **task_environment()}
    quota = CpuQuota(SLOW_FRACTION) if slow else None
    try:
        if quota:
            env["TRAJFLOW_TEST_SLOW"] = f"{SLOW_RANK}:{quota.path}"
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        spec = stage_specs(plan, plan_path)["analyze"][0]
        subprocess.run([mpiexec, "-n", "2"] + spec.argv(sys.executable), check=True, env=env,
                       capture_output=True, timeout=1800)
    finally:
        if quota:
            quota.close()
    records = analyze_records(plan)
    effect = mpi_effect(records)
    if effect is None:
        raise RuntimeError(f"{workdir}: the ranks' records hold no frames' speeds")
    return {"stage_s": max(r["t_stop"] for r in records) - min(r["t_start"] for r in records),
            # first chunk's start to last chunk's end (a static rank's one chunk: its block)
            "loop_s": effect["loop_s"], "balanced_s": effect["balanced_s"],
            "frames": [r["frames"] for r in records],
            "speeds": [round(r["frames"] / max(1e-9, r["t_io"] + r["t_compute"]))
                       for r in records]}


def bench_mpi(top, xtc, analysis, workdir, launches):
    """Clean and slowed, static and dynamic, launches alternating (a drifting machine
    disturbs both alike); medians."""
    runs = {}
    for i in range(launches):
        for slow in (False, True):
            for schedule in ("static", "dynamic"):
                key = ("slow" if slow else "clean", schedule)
                out = os.path.join(workdir, f"{analysis}-{key[0]}-{schedule}-{i}")
                runs.setdefault(key, []).append(_mpi_launch(top, xtc, analysis, schedule, slow, out))

    def median(key, field):
        return statistics.median(r[field] for r in runs[key])
    return {
        "clean_dynamic_over_static": median(("clean", "dynamic"), "stage_s")
        / median(("clean", "static"), "stage_s"),
        "slow_static_over_balanced": statistics.median(
            r["loop_s"] / r["balanced_s"] for r in runs[("slow", "static")]),
        "slow_dynamic_over_balanced": statistics.median(
            r["loop_s"] / r["balanced_s"] for r in runs[("slow", "dynamic")]),
        "runs": {f"{a}_{b}": v for (a, b), v in runs.items()},
    }


def bench_tasks(top, xtc, workdir, slow_block=TASK_BLOCKS - 1):
    """8 blocks on a 2-core local pilot, one run after another on it: clean (dynamic),
    the last block's task slowed with static blocks, and with the dynamic schedule."""
    from trajflow.workflows.run.execute import run_plans
    cases = {"clean": ("dynamic", False), "slow_static": ("static", True),
             "slow_dynamic": ("dynamic", True)}
    quota = CpuQuota(SLOW_FRACTION)
    runs, envs = [], {}
    try:
        for name, (schedule, slow) in cases.items():
            plan = plan_from_options(top, [xtc], "rmsd", 2, out=os.path.join(workdir, name),
                                     mode="tasks", blocks=TASK_BLOCKS, schedule=schedule)
            runs.append((name, plan, write_plan(plan)))
            if slow:
                envs[name] = {"TRAJFLOW_TEST_SLOW": f"{slow_block}:{quota.path}"}
        report = run_plans(runs, PilotSpec(walltime=20, cpus=2), envs=envs, one_at_a_time=True,
                           session_root=workdir)
    finally:
        for _, plan, _ in runs:
            plan.lock.release()
        quota.close()
    if not report.ok:
        raise RuntimeError("the tasks-mode straggler runs failed")
    spans = {}
    for name, plan, _ in runs:
        records = analyze_records(plan)
        spans[name] = max(r["t_stop"] for r in records) - min(r["t_start"] for r in records)
    return {"tasks_backup_over_clean": spans["slow_dynamic"] / spans["clean"],
            "tasks_static_over_clean": spans["slow_static"] / spans["clean"],
            "makespans_s": spans}


def run_stragglers(copies=200, launches=3, with_tasks=True, workdir=None):
    """Every case above (a CPU quota must be possible here: cpu_quota.unavailable())."""
    import tempfile
    top, xtc = adk_concatenated(copies, "XTC")
    out = {"copies": copies, "launches": launches, "slow_fraction": SLOW_FRACTION,
           "by_analysis": {}}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for analysis in ("rmsd", "dihedrals"):
            out["by_analysis"][analysis] = bench_mpi(top, xtc, analysis, tmp, launches)
        if with_tasks:
            out.update(bench_tasks(top, xtc, tmp))
    for key in ("clean_dynamic_over_static", "slow_static_over_balanced",
                "slow_dynamic_over_balanced"):  # the worse of the two analyses
        out[key] = max(v[key] for v in out["by_analysis"].values())
    return out


def format_stragglers(result):
    lines = [f"\nstragglers: AdK x{result['copies']} XTC, 2 ranks, one at "
             f"{result['slow_fraction']:.0%} of a core (cgroup CPU quota); medians of "
             f"{result['launches']} launches"]
    for analysis, r in result["by_analysis"].items():
        lines.append(f"  {analysis:10s} clean dynamic / static stage {r['clean_dynamic_over_static']:.3f} "
                     f"(target <= 1.03); slowed: static / balanced {r['slow_static_over_balanced']:.2f} "
                     f"(~2.5 expected), dynamic / balanced {r['slow_dynamic_over_balanced']:.3f} "
                     "(target <= 1.15)")
    if "tasks_backup_over_clean" in result:
        m = result["makespans_s"]
        lines.append(f"  tasks mode, {TASK_BLOCKS} blocks on 2 cores, the last block's task slowed: "
                     f"makespan clean {m['clean']:.2f} s, static {m['slow_static']:.2f} s "
                     f"({result['tasks_static_over_clean']:.2f}x), dynamic with backups "
                     f"{m['slow_dynamic']:.2f} s ({result['tasks_backup_over_clean']:.2f}x; "
                     "target <= 1.2)")
    return lines
