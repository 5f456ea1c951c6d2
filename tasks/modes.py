"""How a run's analyze stage executes: one object per execution mode, found by name.

A mode owns what differs between the ways a run can execute: its stages' task specs,
the parts its analyze stage leaves for reduce, what a resume still has to run, and how
many workers (ranks or tasks) share the frames. Everything else asks the plan's mode
(`RunPlan.execution`) instead of comparing mode names. Plain data in, plain data out,
so the workstation, the tasks and a folder's reader all use the same objects.

    >>> MODES["mpi"].collective, MODES["tasks"].collective
    (True, False)
"""
import dataclasses
from typing import Dict, List


@dataclasses.dataclass
class TaskSpec:
    name: str
    module: str          # e.g. trajflow.tasks.analyze
    args: List[str]
    ranks: int = 1
    mpi: bool = False

    def argv(self, python: str) -> List[str]:
        return [python, "-m", self.module] + self.args


class ExecutionMode:
    """The contract of an execution mode (see the module's docstring)."""
    name = ""
    help = ""
    collective = False  # one MPI task whose ranks share the frames and gather the result
    selectable = True   # a `--mode` choice (an MDAnalysis run() is chosen by Backend)
    publishes = False   # its analyze stage publishes the result (no reduce stage after it)
    published_by = ""   # who does, as the run's progress says it

    def workers(self, plan) -> int:
        """The analyze stage's N as scaling counts it: its MPI ranks, or its tasks."""
        return plan.n_blocks

    def ranks_per_task(self, plan) -> int:
        return 1

    def part_paths(self, plan) -> List[str]:
        """The files the analyze stage leaves for reduce, in frame order."""
        return [plan.block_part_path(b) for b in range(plan.n_blocks)]

    def cores_for(self, plan, local_cores) -> int:
        """A pilot's cores for one run when not asked: a core per worker; on a local
        resource (`local_cores` not None) at most its cores, the rest of the tasks queue."""
        n = self.workers(plan)
        return n if local_cores is None else min(n, local_cores)

    def stage_specs(self, plan, plan_args: List[str]) -> Dict[str, List[TaskSpec]]:
        """The run's stages in order, each a list of task specs."""
        split = [TaskSpec(name, "trajflow.tasks.split", plan_args + args, ranks=max(ranks, 1),
                          mpi=ranks > 0)
                 for name, args, ranks in plan.io_strategy.split_tasks(plan)]
        analyze = self.analyze_tasks(plan, plan_args)
        return {"split": split, "analyze": analyze,
                "reduce": self.reduce_tasks(plan, plan_args, analyze)}

    def reduce_tasks(self, plan, plan_args, analyze: List[TaskSpec]) -> List[TaskSpec]:
        """The reduce stage's tasks, after `analyze` (the analyze tasks that run)."""
        return [TaskSpec("reduce", "trajflow.tasks.reduce", plan_args)]

    def analyze_tasks(self, plan, plan_args) -> List[TaskSpec]:
        return [TaskSpec(f"analyze.b{b:05d}", "trajflow.tasks.analyze",
                         plan_args + ["--block", str(b)]) for b in range(plan.n_blocks)]

    def split_tasks_per_block(self, plan):
        """The split strategy's tasks (name, args, MPI ranks; 0: not MPI): one per block."""
        return [(f"split.b{b:05d}", ["--block", str(b)], 0) for b in range(plan.n_blocks)]

    def remaining_analyze(self, plan, tasks: List[TaskSpec]) -> List[TaskSpec]:
        """Of the analyze tasks, those a resumed run still needs."""
        from .parts import is_whole
        return [t for t in tasks if not is_whole(plan.block_part_path(int(t.args[-1])))]


class TasksMode(ExecutionMode):
    name = "tasks"
    help = "one single-core task per block"


class MpiMode(ExecutionMode):
    name = "mpi"
    help = "one analyze task with one rank per block"
    collective = True
    publishes = True  # its analyze task publishes result.h5 (tasks/reduce.py's publish)
    published_by = "its gather's root published result.h5"

    def workers(self, plan) -> int:
        return plan.analyze_ranks

    def ranks_per_task(self, plan) -> int:
        return plan.analyze_ranks

    def part_paths(self, plan) -> List[str]:
        return [plan.gathered_part_path()]

    def cores_for(self, plan, local_cores) -> int:
        return plan.analyze_ranks  # every rank at once, or MPI_Init waits for the others

    def analyze_tasks(self, plan, plan_args) -> List[TaskSpec]:
        return [TaskSpec("analyze", "trajflow.tasks.analyze", plan_args,
                         ranks=plan.analyze_ranks, mpi=True)]

    def reduce_tasks(self, plan, plan_args, analyze):
        """None after an analyze task: its gather's root publishes result.h5 itself (no
        reduce process, no stage hand-off); the reduce task where only that is left (a
        resumed run whose gathered part is whole)."""
        return [] if analyze else super().reduce_tasks(plan, plan_args, analyze)

    def split_tasks_per_block(self, plan):
        return [("split", ["--mpi"], plan.analyze_ranks)]  # ranks stride over the blocks

    def remaining_analyze(self, plan, tasks):
        from .parts import is_whole
        return [] if is_whole(plan.gathered_part_path()) else tasks


class BackendMode(ExecutionMode):
    """An MDAnalysis run() through trajflow.Backend: its parts are MDAnalysis' own
    computation groups (tasks/backend_part.py), pickled, then collected in order by
    the part task that finds every part written (no reduce stage after them)."""
    name = "backend"
    help = "MDAnalysis' computation groups, one task each (trajflow.Backend)"
    selectable = False
    publishes = True
    published_by = "the part task that found every part written collected them"

    def part_paths(self, plan) -> List[str]:
        from .backend_part import part_path
        return [part_path(plan, b) for b in range(plan.n_blocks)]

    module = "trajflow.tasks.backend_part"

    def stage_specs(self, plan, plan_args):
        analyze = [TaskSpec(f"analyze.b{b:05d}", self.module, plan_args + ["--part", str(b)])
                   for b in range(plan.n_blocks)]
        return {"analyze": analyze, "reduce": self.reduce_tasks(plan, plan_args, analyze)}

    def reduce_tasks(self, plan, plan_args, analyze):
        """None after part tasks (the last to end collects); the collect task alone where
        only that is left."""
        return [] if analyze else [TaskSpec("reduce", self.module, plan_args + ["--collect"])]

    def remaining_analyze(self, plan, tasks):
        return tasks  # pickled parts are not checked on a resume: computed again


MODES = {m.name: m for m in (MpiMode(), TasksMode())}  # the `--mode` choices
BACKEND = BackendMode()


def mode_named(name) -> ExecutionMode:
    """The mode a profile record's "mode" names; a record without one is an MPI rank's
    (the records before tasks mode)."""
    return MODES.get(MpiMode.name if name is None else name, MODES[TasksMode.name])


def record_mode(record: dict):
    """The mode an analyze record says it ran in; None for a record that says none (split
    and reduce tasks' records)."""
    return MODES.get(record.get("mode"))


def is_mpi_rank(record: dict) -> bool:
    """A record of one rank of a collective (MPI) analyze task."""
    mode = record_mode(record)
    return mode is not None and mode.collective


def is_block_task(record: dict) -> bool:
    """A record of one single-core analyze task of one block."""
    mode = record_mode(record)
    return mode is not None and not mode.collective
