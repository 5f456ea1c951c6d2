"""The EnTK pipeline of one run: split -> analyze -> reduce.

`stage_specs` says, in plain data, which task programs run with how many
ranks; `build_pipeline` turns that into EnTK objects. Tests run the very same
specs under mpiexec without EnTK, so what is tested is what the pilot runs.
"""
import dataclasses
import os
from typing import Dict, List

from trajflow.tasks.plan import RunPlan, encode_path_arg


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
    if plan.io == "split" and plan.mode == "mpi":
        split = [TaskSpec("split", "trajflow.tasks.split", p + ["--mpi"], ranks=n, mpi=True)]
    elif plan.io == "split":
        split = [TaskSpec(f"split.b{b:05d}", "trajflow.tasks.split", p + ["--block", str(b)])
                 for b in range(n)]
    else:
        split = [TaskSpec(f"split.{plan.io}", "trajflow.tasks.split", p)]
    if plan.mode == "mpi":
        analyze = [TaskSpec("analyze", "trajflow.tasks.analyze", p, ranks=n, mpi=True)]
    else:
        analyze = [TaskSpec(f"analyze.b{b:05d}", "trajflow.tasks.analyze", p + ["--block", str(b)])
                   for b in range(n)]
    reduce = [TaskSpec("reduce", "trajflow.tasks.reduce", p)]
    return {"split": split, "analyze": analyze, "reduce": reduce}


def task_environment() -> Dict[str, str]:
    """Variables the tasks must see: the documented testing hooks, if set."""
    return {k: v for k, v in os.environ.items() if k.startswith("TRAJFLOW_TEST_")}


def entk_name(text: str) -> str:
    """EnTK accepts only letters, digits and '.' in names."""
    return "".join(c if c.isascii() and (c.isalnum() or c == ".") else "." for c in text) or "run"


def build_pipeline(plan: RunPlan, plan_path: str, python: str, name: str):
    """One EnTK Pipeline for one run."""
    import radical.entk as re
    pipeline = re.Pipeline()
    pipeline.name = entk_name(name)
    env = task_environment()
    for stage_name, specs in stage_specs(plan, plan_path).items():
        stage = re.Stage()
        stage.name = stage_name
        for spec in specs:
            task = re.Task()
            task.name = entk_name(spec.name)
            task.executable = python
            task.arguments = ["-m", spec.module] + spec.args
            task.environment = dict(env)
            task.cpu_reqs = {"cpu_processes": spec.ranks,
                             "cpu_process_type": "MPI" if spec.mpi else None,
                             "cpu_threads": 1, "cpu_thread_type": None}
            # a failed task fails its pipeline: reduce never runs on partial parts
            task.error_is_fatal = True
            stage.add_tasks(task)
        pipeline.add_stages(stage)
    return pipeline
