"""Run a plan's stage specs directly (subprocess / mpiexec), without EnTK.

The same TaskSpecs the EnTK pipeline is built from, so what these tests run
is what the pilot runs. Used by the tests only; the product runs via EnTK.
"""
import os
import subprocess
import sys

from trajflow.workflows.pipeline import stage_specs, task_environment
from trajflow.workflows.planning import make_plan, write_plan

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def run_spec(spec, env=None, timeout=300):
    argv = spec.argv(sys.executable)
    if spec.mpi:
        argv = [MPIEXEC, "-n", str(spec.ranks)] + argv
    return subprocess.run(argv, env={**os.environ, **task_environment(), **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)


def run_stages(plan, plan_path, env=None):
    """Run split, analyze and reduce in order; raise with stderr if any task fails."""
    for stage, specs in stage_specs(plan, plan_path).items():
        for spec in specs:
            proc = run_spec(spec, env)
            if proc.returncode != 0:
                raise RuntimeError(f"{stage}/{spec.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return plan.result_path()


def plan_and_run(tmp_path, top, trajs, analysis, env=None, **kw):
    plan = make_plan(top, trajs, analysis, str(tmp_path), **kw)
    return run_stages(plan, write_plan(plan), env), plan
