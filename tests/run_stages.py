"""Run a plan's stage specs directly (subprocess / mpiexec), without EnTK.

The same TaskSpecs the EnTK pipeline is built from, so what these tests run
is what the pilot runs. Used by the tests only; the product runs via EnTK.
"""
import os
import subprocess
import sys

from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment
from plans import make_plan
from trajflow.workflows.run.planning import write_plan

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")


def _argv(spec):
    argv = spec.argv(sys.executable)
    return [MPIEXEC, "-n", str(spec.ranks)] + argv if spec.mpi else argv


def _env(env):
    return {**os.environ, **task_environment(), **(env or {})}


def run_spec(spec, env=None, timeout=300):
    return subprocess.run(_argv(spec), env=_env(env), capture_output=True, text=True,
                          timeout=timeout)


def run_side_by_side(specs, env=None, timeout=300):
    """Start the specs at once, as the pilot runs a stage; raise with stderr if any fails."""
    procs = [subprocess.Popen(_argv(spec), env=_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for spec in specs]
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    for spec, proc, (out, err) in zip(specs, procs, outputs):
        if proc.returncode != 0:  # mpiexec says which rank died, and how, on stdout
            raise RuntimeError(f"{spec.name} exited {proc.returncode}:\n"
                               f"{out[-1500:]}\n{err[-3000:]}")


def run_stages(plan, plan_path, env=None, timeout=300, side_by_side=False):
    """Run split, analyze and reduce in order; raise with stderr if any task fails.
    `side_by_side`: a stage's tasks at once, as the pilot runs them (quicker;
    tests that judge timings keep them one at a time)."""
    for stage, specs in stage_specs(plan, plan_path).items():
        batches = [specs] if side_by_side else [[spec] for spec in specs]
        for batch in batches:
            try:
                run_side_by_side(batch, env, timeout)
            except RuntimeError as exc:
                raise RuntimeError(f"{stage}/{exc}") from None
    return plan.result_path()


def plan_and_run(tmp_path, top, trajs, analysis, env=None, side_by_side=False, **kw):
    plan = make_plan(top, trajs, analysis, str(tmp_path), **kw)
    try:
        return run_stages(plan, write_plan(plan), env, side_by_side=side_by_side), plan
    finally:
        plan.lock.release()  # the run has ended, as the Pilot would release it

