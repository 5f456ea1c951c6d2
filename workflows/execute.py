"""Run pipelines on a pilot with EnTK, and tell the truth about how they ended.

EnTK reports a pipeline DONE and returns normally even when a task FAILED, so
every task's final state is checked here; a failure is reported with the
task, its exit code, where its sandbox is and the tail of its stderr.
"""
import contextlib
import dataclasses
import glob
import json
import os
import shutil
import threading
import re as regex
import time
from typing import List

from trajflow.tasks.plan import RunPlan
from . import resources
from .pipeline import RunPipeline


@dataclasses.dataclass
class TaskOutcome:
    pipeline: str
    stage: str        # split, analyze or reduce
    attempt: int
    name: str
    state: str
    exit_code: object
    sandbox: str
    stderr_tail: str

    def describe(self) -> str:
        lines = [f"task {self.pipeline}/{self.stage}/{self.name} (attempt {self.attempt}) "
                 f"ended {self.state}"
                 + (f" with exit code {self.exit_code}" if self.exit_code is not None else "")]
        if self.sandbox:
            lines.append(f"  sandbox: {self.sandbox}")
        if self.stderr_tail:
            lines.append("  stderr (last lines):")
            lines += ["    " + l for l in self.stderr_tail.splitlines()]
        return "\n".join(lines)


@dataclasses.dataclass
class RunReport:
    outcomes: List[TaskOutcome]
    results: dict            # run name -> result path or None
    session_dir: str
    wall_s: float

    stopped: dict = dataclasses.field(default_factory=dict)  # run name -> stage it stopped at

    @property
    def failed(self):
        """Tasks whose last attempt did not end DONE."""
        last = {}
        for o in self.outcomes:
            last[(o.pipeline, o.stage, o.name)] = o
        return [o for o in last.values() if o.state != "DONE"]

    @property
    def retried(self):
        return [o for o in self.outcomes if o.state != "DONE" and o not in self.failed]

    @property
    def ok(self):
        return not self.failed and not any(self.stopped.values()) and all(self.results.values())


@contextlib.contextmanager
def _working_dir(path):
    old = os.getcwd()
    os.makedirs(path, exist_ok=True)
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _stderr_tail(sandbox, n=15):
    if not sandbox or not os.path.isdir(sandbox):
        return ""
    errs = sorted(glob.glob(os.path.join(sandbox, "*.err")))
    if not errs:
        return ""
    with open(errs[0], errors="replace") as fh:
        return "".join(fh.readlines()[-n:]).rstrip()


def _exit_code(task):
    m = regex.search(r"exit code:?\s*(-?\d+)", str(task.exception_detail or ""))
    return int(m.group(1)) if m else None


def shutdown(appman):
    """Stop EnTK and the pilot, the two slow parts side by side.

    EnTK's terminate() first joins its task-manager thread, which wakes from
    its queue only every 10 s, and only then cancels the pilot (RP waits up to
    20 s for the agent). Cancelling the pilot in a thread while terminate()
    waits on that join overlaps the two: about 9 s less per run, measured.
    """
    rmgr = getattr(appman, "_rmgr", None)  # EnTK keeps its resource manager private
    pilot, pmgr = getattr(rmgr, "pilot", None), getattr(rmgr, "pmgr", None)
    cancel = None
    if pilot is not None and pmgr is not None:
        cancel = threading.Thread(target=pmgr.cancel_pilots, args=(pilot.uid,),
                                  kwargs={"_timeout": 20}, daemon=True)
        cancel.start()
    appman.terminate()
    if cancel is not None:
        cancel.join(30)


def keep_task_files(outcome, dest_root):
    """Copy a task's RADICAL profile, stdout and stderr from the pilot sandbox
    into RUNDIR/radical/, so that RUNDIR alone is enough to inspect the run."""
    if not outcome.sandbox or not os.path.isdir(outcome.sandbox):
        return
    dest = os.path.join(dest_root, f"{outcome.stage}.{outcome.name}.attempt{outcome.attempt}")
    os.makedirs(dest, exist_ok=True)
    for path in glob.glob(os.path.join(outcome.sandbox, "*")):
        if path.endswith((".prof", ".out", ".err")) and os.path.isfile(path):
            shutil.copy2(path, dest)
    with open(os.path.join(dest, "outcome.json"), "w", encoding="utf-8") as fh:
        json.dump(dataclasses.asdict(outcome), fh, indent=1)


def run_plans(runs, resource, walltime, cpus, queue=None, project=None, session_root=None,
              retries=1):
    """Run [(name, plan, plan_path)] as pipelines on one pilot; return a RunReport.

    A failed task is run again up to `retries` times before its run fails.
    """
    import radical.entk as re
    t0 = time.time()
    session_root = os.path.abspath(session_root or runs[0][1].workdir)
    resources.activate_venv()
    resources.activate_configs()
    os.environ.setdefault("RADICAL_PROFILE", "TRUE")
    os.environ.setdefault("RADICAL_LOG_LVL", "WARNING")
    os.environ.setdefault("RADICAL_REPORT", "FALSE")
    python = resources.task_python(resource)
    pipelines = {name: RunPipeline(plan, path, python, name, retries) for name, plan, path in runs}
    with _working_dir(session_root):
        appman = re.AppManager(autoterminate=False, base_path=session_root)
        appman.resource_desc = resources.resource_description(resource, walltime, cpus, queue, project)
        appman.workflow = set(p.pipeline for p in pipelines.values())
        try:
            appman.run()
        finally:
            shutdown(appman)
        session_dir = os.path.join(session_root, appman.sid)
    outcomes = []
    for name, run in pipelines.items():
        for stage in run.pipeline.stages:
            stage_name, _, attempt = stage.name.partition(".attempt")
            for task in stage.tasks:
                outcomes.append(TaskOutcome(
                    pipeline=name, stage=stage_name, attempt=int(attempt or 1),
                    name=task.name, state=task.state,
                    exit_code=_exit_code(task), sandbox=task.path or "",
                    stderr_tail="" if task.state == "DONE" else _stderr_tail(task.path)))
    plans = {name: plan for name, plan, _ in runs}
    for o in outcomes:
        keep_task_files(o, plans[o.pipeline].path("radical"))
    results = {}
    for name, plan, _ in runs:
        path = plan.result_path()
        results[name] = path if os.path.exists(path) else None
    stopped = {name: run.stopped_at for name, run in pipelines.items()}
    return RunReport(outcomes, results, session_dir, time.time() - t0, stopped)
