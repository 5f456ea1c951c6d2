"""The stages of a run as task specs, in plain data: which task program runs with how
many ranks (the workstation builds its EnTK pipeline from them, the tests run them
under mpiexec, and a folder's reader says from them what a resume runs again)."""
import dataclasses
from typing import Dict, List

from .parts import is_whole
from .plan import encode_path_arg, RunPlan


@dataclasses.dataclass
class TaskSpec:
    name: str
    module: str          # e.g. trajflow.tasks.analyze
    args: List[str]
    ranks: int = 1
    mpi: bool = False

    def argv(self, python: str) -> List[str]:
        return [python, "-m", self.module] + self.args


def stage_specs(plan: RunPlan, plan_path: str) -> Dict[str, List[TaskSpec]]:
    """The three stages of a run as task specs, in order."""
    p = ["--plan", encode_path_arg(plan_path)]
    n = plan.n_blocks
    if plan.backend:  # an MDAnalysis run(): its computation groups, then collected in order
        module = "trajflow.tasks.backend_part"
        return {"analyze": [TaskSpec(f"analyze.b{b:05d}", module, p + ["--part", str(b)])
                            for b in range(n)],
                "reduce": [TaskSpec("reduce", module, p + ["--collect"])]}
    split = [TaskSpec(name, "trajflow.tasks.split", p + args, ranks=max(ranks, 1), mpi=ranks > 0)
             for name, args, ranks in plan.io_strategy.split_tasks(plan)]
    if plan.mode == "mpi":
        analyze = [TaskSpec("analyze", "trajflow.tasks.analyze", p, ranks=plan.analyze_ranks,
                            mpi=True)]
    else:
        analyze = [TaskSpec(f"analyze.b{b:05d}", "trajflow.tasks.analyze", p + ["--block", str(b)])
                   for b in range(n)]
    reduce = [TaskSpec("reduce", "trajflow.tasks.reduce", p)]
    return {"split": split, "analyze": analyze, "reduce": reduce}


def remaining_specs(plan: RunPlan, plan_path: str) -> Dict[str, List[TaskSpec]]:
    """The task specs of an interrupted run that still have work to do: split
    tasks whose output is missing, analyze tasks whose part is missing or damaged, and
    reduce (always: it checks and publishes)."""
    specs = stage_specs(plan, plan_path)
    if "split" in specs:
        wanted = {name for name, _, _ in plan.io_strategy.remaining_split_tasks(
            plan, plan.io_strategy.split_tasks(plan))}
        specs["split"] = [s for s in specs["split"] if s.name in wanted]
    if plan.mode == "tasks":  # a missing or damaged part is analysed again
        specs["analyze"] = [s for s in specs["analyze"]
                            if not is_whole(plan.part_path(f"block_{int(s.args[-1]):05d}"))]
    elif is_whole(plan.part_path("mpi")):
        specs["analyze"] = []
    return specs
