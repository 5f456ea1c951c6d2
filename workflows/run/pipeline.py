"""The EnTK pipeline of one run: split -> analyze -> reduce (an MPI analyze task's
gather root reduces itself, and a Backend run's last part task collects: no reduce
stage follows them unless their analyze stage ended whole without the result).

`stage_specs` (tasks/stages.py) says, in plain data, which task programs run
with how many ranks; RunPipeline turns that into EnTK objects. Tests run the
very same specs under mpiexec without EnTK, so what is tested is what the
pilot runs.
"""
import os
import shutil
from typing import Dict

from trajflow.tasks.cpu_neighbours import CLIENT_PID
from trajflow.tasks.exit_codes import NOT_RETRIED
from trajflow.tasks.launch_env import MPI_INIT_FIRST
from trajflow.tasks.plan import RunPlan
from trajflow.tasks.rundir import CLAIMS
from trajflow.tasks.stages import publish_specs, stage_specs, TaskSpec
from trajflow.tasks.task_server import MODULE as TASK_SERVER_MODULE, SERVED
from trajflow.workflows.run.outcomes import exit_code_of


def task_environment() -> Dict[str, str]:
    """Variables the tasks must see: one BLAS/OpenMP thread per rank (a rank is
    given one core; more threads would fight the other ranks for it), and the
    documented testing hooks and TRAJFLOW_MPI_INIT_FIRST (tasks/analyze.py), if set;
    this process' pid (it runs EnTK: its CPU is RADICAL's, tasks/cpu_neighbours.py)."""
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           CLIENT_PID: str(os.getpid())}  # RADICAL's client, as the ranks name who ran
    env.update({k: v for k, v in os.environ.items()
                if k.startswith("TRAJFLOW_TEST_") or k == MPI_INIT_FIRST})
    return env


def entk_name(text: str) -> str:
    """EnTK accepts only letters, digits and '.' in names."""
    return "".join(c if c.isascii() and (c.isalnum() or c == ".") else "." for c in text) or "run"


class TaskCommand:
    """How the pilot starts a task program: a new Python of its own."""

    def __init__(self, python: str):
        self.python = python

    def arguments(self, spec: TaskSpec):
        return ["-m", spec.module] + spec.args


class ServedTaskCommand(TaskCommand):
    """Task programs, single-core and MPI ranks, through the task server beside the
    pilot's agent (tasks/task_server.py: a fork of a Python that has their libraries
    imported; the task is its own Python where no server serves it)."""

    def arguments(self, spec: TaskSpec):
        if spec.module not in SERVED:
            return super().arguments(spec)
        return ["-m", TASK_SERVER_MODULE, "run", spec.module] + spec.args


class RunPipeline:
    """One run's EnTK Pipeline, grown a stage at a time.

    Only its first stage with work is there at the start (split; analyze for --io
    shared, which has no split stage); each stage's post_exec (run by EnTK on
    the client when the stage has ended) adds the next stage if every task
    ended DONE, re-runs just the failed tasks while retries remain, and
    otherwise adds nothing, so the pipeline stops there: no analyze after a
    failed split, no reduce over missing parts.
    """

    ORDER = ("split", "analyze", "reduce")

    def __init__(self, plan: RunPlan, plan_path: str, command, name: str, retries: int = 0,
                 specs=None, env=None, on_event=None):
        """`command`: how tasks start (a TaskCommand, or the Python to run them with);
        `specs`: the stages' task specs (default: all of them; a resumed run
        passes only what is missing); `env`: extra variables for its tasks;
        `on_event(stage, kind, text)`: told when a stage is handed to EnTK
        (kind "submitted") and when it ends ("done" or "failed")."""
        self.on_event = on_event or (lambda stage, kind, text: None)
        self.plan = plan
        import radical.entk as re
        self.re = re
        self.name = name
        self.command = command if isinstance(command, TaskCommand) else TaskCommand(command)
        self.retries = retries
        self.plan_path = plan_path
        self.specs = specs if specs is not None else stage_specs(plan, plan_path)
        self.env = {**task_environment(), **(env or {})}
        self.attempts = {}       # stage name -> attempts so far
        self.stopped_at = None   # the stage that failed for good, if any
        self.cancelled = None    # why the run was cancelled (cancel), if it was
        self.pipeline = re.Pipeline()
        self.pipeline.name = entk_name(name)
        self._add_next(None)

    def cancel(self, why):
        """Stop the run where it is (no stage after this one, no retry); the uids of the
        current stage's tasks that have not ended, for RADICAL-Pilot to cancel."""
        self.cancelled = why
        stage = self.pipeline.stages[-1]
        return [task.uid for task in stage.tasks
                if task.state not in ("DONE", "FAILED", "CANCELED")]

    def _next_stage(self, after):
        """The first stage after `after` (None: the first) that has work to do, or None."""
        following = 0 if after is None else self.ORDER.index(after) + 1
        return next((name for name in self.ORDER[following:] if self.specs.get(name)), None)

    def _add_next(self, after):
        """Add the first stage after `after` that has work to do."""
        stage_name = self._next_stage(after)
        if stage_name is not None:
            self._add_stage(stage_name, self.specs[stage_name])

    def _add_stage(self, stage_name, specs):
        self.attempts[stage_name] = self.attempts.get(stage_name, 0) + 1
        if stage_name == "analyze":  # no analyze task runs now: a new attempt claims anew
            shutil.rmtree(self.plan.path(CLAIMS), ignore_errors=True)
        stage = self.re.Stage()
        stage.name = entk_name(f"{stage_name}.attempt{self.attempts[stage_name]}")
        by_task_name = {entk_name(spec.name): spec for spec in specs}
        # all at once: EnTK checks the whole stage on every add, so adding
        # 1,000 tasks one by one took 1.5 s and 5,000 over four minutes
        stage.add_tasks([self._task(spec) for spec in specs])
        stage.post_exec = lambda: self._after(stage_name, stage, by_task_name)
        self.pipeline.add_stages(stage)
        attempt = self.attempts[stage_name]
        self.on_event(stage_name, "submitted", f"{stage_name} submitted: {len(specs)} task(s)"
                      + (f", attempt {attempt}" if attempt > 1 else "")
                      + (f", {specs[0].ranks} MPI ranks" if specs[0].mpi else ""))

    def _task(self, spec: TaskSpec):
        task = self.re.Task()
        task.name = entk_name(spec.name)
        task.executable = self.command.python
        task.arguments = self.command.arguments(spec)
        task.environment = dict(self.env)
        task.cpu_reqs = {"cpu_processes": spec.ranks,
                         "cpu_process_type": "MPI" if spec.mpi else None,
                         "cpu_threads": 1, "cpu_thread_type": None}
        return task

    def _after(self, stage_name, stage, by_task_name):
        """Retry what a retry may cure; a task whose analysis code raised is not
        (exit_codes.NOT_RETRIED: it would raise again), and stops the run at once."""
        failed = [t for t in stage.tasks if t.state != "DONE"]
        if self.cancelled and (failed or self._next_stage(stage_name)):  # (a last stage that
            # ended whole has published the result: the run is complete, cancelled too late)
            self.on_event(stage_name, "failed", f"{stage_name}: cancelled ({self.cancelled}); "
                          "the run stops here")
            self.stopped_at = stage_name
            return
        incurable = [t for t in failed if exit_code_of(t) in NOT_RETRIED]
        again = bool(failed) and not incurable and self.attempts[stage_name] <= self.retries
        if incurable:
            self.on_event(stage_name, "failed",
                          f"{stage_name}: {len(failed)} of {len(stage.tasks)} task(s) failed; "
                          "the analysis' own code raised (not retried: it would raise again); "
                          "the run stops here")
        elif failed:
            self.on_event(stage_name, "failed",
                          f"{stage_name}: {len(failed)} of {len(stage.tasks)} task(s) failed; "
                          + ("running them again" if again else "the run stops here"))
        else:
            self.on_event(stage_name, "done", f"{stage_name} done" + (
                f" (and reduce: {self.plan.execution.published_by})"
                if self._published_in(stage_name) else ""))
        if again:
            self._add_stage(stage_name, [by_task_name[t.name] for t in failed])
        elif failed:
            self.stopped_at = stage_name
        elif self._left_unpublished(stage_name) and not self.cancelled:
            # its tasks ended whole and none published (a Backend part that saw another's
            # part late: a file server's cached lookup): the reduce task publishes
            self._add_stage("reduce", publish_specs(self.plan, self.plan_path))
        else:
            self._add_next(stage_name)

    def _published_in(self, stage_name):
        """Whether this stage's tasks have published the run's result (MPI's gather root,
        Backend's last part)."""
        return (stage_name == "analyze" and self.plan.execution.publishes
                and os.path.isfile(self.plan.result_path()))

    def _left_unpublished(self, stage_name):
        return (stage_name == "analyze" and self.plan.execution.publishes
                and not self._published_in(stage_name))
