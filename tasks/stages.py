"""The stages of a run as task specs, in plain data: which task program runs with how
many ranks (the workstation builds its EnTK pipeline from them, the tests run them
under mpiexec, and a folder's reader says from them what a resume runs again)."""
from typing import Dict, List

from .modes import TaskSpec  # noqa: F401 (the stages' task specs are the modes')
from .plan import encode_path_arg, RunPlan


def _plan_args(plan_path):
    return ["--plan", encode_path_arg(plan_path)]


def stage_specs(plan: RunPlan, plan_path: str) -> Dict[str, List[TaskSpec]]:
    """The three stages of a run as task specs, in order (a stage without tasks: none,
    e.g. reduce after an MPI analyze, which publishes the result itself)."""
    return plan.execution.stage_specs(plan, _plan_args(plan_path))


def publish_specs(plan: RunPlan, plan_path: str) -> List[TaskSpec]:
    """The task that publishes the result where an analyze stage that should have (an
    MPI root's, a Backend part's) ended whole without it: the reduce (collect) task."""
    return plan.execution.reduce_tasks(plan, _plan_args(plan_path), [])


def remaining_specs(plan: RunPlan, plan_path: str) -> Dict[str, List[TaskSpec]]:
    """The task specs of an interrupted run that still have work to do: split
    tasks whose output is missing, analyze tasks whose part is missing or damaged, and
    reduce (always: it checks and publishes; in the analyze task where that publishes)."""
    specs = stage_specs(plan, plan_path)
    if "split" in specs:
        wanted = {name for name, _, _ in plan.io_strategy.remaining_split_tasks(
            plan, plan.io_strategy.split_tasks(plan))}
        specs["split"] = [s for s in specs["split"] if s.name in wanted]
    specs["analyze"] = plan.execution.remaining_analyze(plan, specs["analyze"])
    specs["reduce"] = plan.execution.reduce_tasks(plan, _plan_args(plan_path), specs["analyze"])
    return specs
