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
    """Variables the tasks must see: one BLAS/OpenMP thread per rank (a rank is
    given one core; more threads would fight the other ranks for it), and the
    documented testing hooks, if set."""
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("TRAJFLOW_TEST_")})
    return env


def entk_name(text: str) -> str:
    """EnTK accepts only letters, digits and '.' in names."""
    return "".join(c if c.isascii() and (c.isalnum() or c == ".") else "." for c in text) or "run"


class RunPipeline:
    """One run's EnTK Pipeline, grown a stage at a time.

    Only split is there at the start; each stage's post_exec (run by EnTK on
    the client when the stage has ended) adds the next stage if every task
    ended DONE, re-runs just the failed tasks while retries remain, and
    otherwise adds nothing, so the pipeline stops there: no analyze after a
    failed split, no reduce over missing parts.
    """

    ORDER = ("split", "analyze", "reduce")

    def __init__(self, plan: RunPlan, plan_path: str, python: str, name: str, retries: int = 0):
        import radical.entk as re
        self.re = re
        self.name = name
        self.python = python
        self.retries = retries
        self.specs = stage_specs(plan, plan_path)
        self.env = task_environment()
        self.attempts = {}       # stage name -> attempts so far
        self.stopped_at = None   # the stage that failed for good, if any
        self.pipeline = re.Pipeline()
        self.pipeline.name = entk_name(name)
        self._add_stage("split", self.specs["split"])

    def _add_stage(self, stage_name, specs):
        self.attempts[stage_name] = self.attempts.get(stage_name, 0) + 1
        stage = self.re.Stage()
        stage.name = entk_name(f"{stage_name}.attempt{self.attempts[stage_name]}")
        by_task_name = {}
        for spec in specs:
            stage.add_tasks(self._task(spec))
            by_task_name[entk_name(spec.name)] = spec
        stage.post_exec = lambda: self._after(stage_name, stage, by_task_name)
        self.pipeline.add_stages(stage)

    def _task(self, spec: TaskSpec):
        task = self.re.Task()
        task.name = entk_name(spec.name)
        task.executable = self.python
        task.arguments = ["-m", spec.module] + spec.args
        task.environment = dict(self.env)
        task.cpu_reqs = {"cpu_processes": spec.ranks,
                         "cpu_process_type": "MPI" if spec.mpi else None,
                         "cpu_threads": 1, "cpu_thread_type": None}
        return task

    def _after(self, stage_name, stage, by_task_name):
        failed = [by_task_name[t.name] for t in stage.tasks if t.state != "DONE"]
        if failed and self.attempts[stage_name] <= self.retries:
            self._add_stage(stage_name, failed)
        elif failed:
            self.stopped_at = stage_name
        else:
            following = self.ORDER.index(stage_name) + 1
            if following < len(self.ORDER):
                nxt = self.ORDER[following]
                self._add_stage(nxt, self.specs[nxt])
