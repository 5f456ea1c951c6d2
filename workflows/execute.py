"""Run pipelines on a pilot with EnTK, and tell the truth about how they ended.

EnTK reports a pipeline DONE and returns normally even when a task FAILED, so
every task's final state is checked here; a failure is reported with the
task, its exit code, where its sandbox is and the tail of its stderr.
"""
import dataclasses
import glob
import json
import os
import multiprocessing
import shutil
import signal
import sys
import re as regex
import time
from resource import RUSAGE_SELF, getrusage
from typing import List

from . import resources
from .entk_client import new_appmanager, reap_local_tasks, shutdown, working_dir
from .pipeline import RunPipeline, remaining_specs


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


def failed_for_good(outcomes):
    """Tasks whose last attempt did not end DONE."""
    last = {}
    for o in outcomes:
        last[(o.pipeline, o.stage, o.name)] = o
    return [o for o in last.values() if o.state != "DONE"]


@dataclasses.dataclass
class RunReport:
    outcomes: List[TaskOutcome]
    results: dict            # run name -> result path or None
    session_dir: str
    wall_s: float

    stopped: dict = dataclasses.field(default_factory=dict)  # run name -> stage it stopped at
    client_peak_rss_mib: float = 0.0  # of the process that held the EnTK/RADICAL session
    errors: dict = dataclasses.field(default_factory=dict)   # run name -> why it did not run

    @property
    def failed(self):
        return failed_for_good(self.outcomes)

    @property
    def retried(self):
        failed = self.failed
        return [o for o in self.outcomes if o.state != "DONE" and o not in failed]

    @property
    def ok(self):
        return not self.failed and not any(self.stopped.values()) and not self.errors \
            and all(self.results.values())


def _stderr_tail(sandbox, n=15, patience_s=3.0):
    """The last lines of a task's stderr in its sandbox. The FAILED state can
    reach the client a moment before the file system shows the task's last
    writes, so an empty or missing file is looked at again for a few seconds."""
    if not sandbox or not os.path.isdir(sandbox):
        return ""
    deadline = time.time() + patience_s
    while True:
        errs = sorted(glob.glob(os.path.join(sandbox, "*.err")))
        text = ""
        if errs:
            with open(errs[0], errors="replace") as fh:
                text = "".join(fh.readlines()[-n:]).rstrip()
        if text or time.time() > deadline:
            return text
        time.sleep(0.2)


def _exit_code(task):
    m = regex.search(r"exit code:?\s*(-?\d+)", str(task.exception_detail or ""))
    return int(m.group(1)) if m else None


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


class Interrupted(Exception):
    """The user stopped the run (Ctrl-C); the pilot was cancelled."""


OUTCOME_FILE = "outcome.json"


def run_plans(runs, resource, walltime, cpus, queue=None, project=None, session_root=None,
              retries=1, resume=False, envs=None, one_at_a_time=False, on_run_ended=None):
    """Run [(name, plan, plan_path)] as pipelines on one pilot; return a RunReport.

    A failed task is run again up to `retries` times before its run fails.
    `resume`: run only what the runs are missing. `envs`: run name -> extra
    task environment (the testing hooks of one run only). `one_at_a_time`:
    the runs go through the pilot one after another (EnTK's AppManager.run()
    once per run, the pilot kept between them), so that no run's timings are
    disturbed by another's; otherwise all run side by side. Each run's RUNDIR
    gets an outcome.json as soon as it has ended, and `on_run_ended(name)` is
    then called here, while the pilot is still being shut down (the CLI writes
    the run's report meanwhile).

    EnTK and RADICAL-Pilot run in a child process in a session of its own. A
    Ctrl-C in the terminal reaches the whole foreground process group: had
    RADICAL's client components been in it, they would die at once, the
    pilot's cancel command would never be sent, and the agent and its tasks
    would run on until the walltime. Here only this process gets the signal;
    it asks the child to stop, which cancels the pilot in order.
    """
    kwargs = dict(runs=runs, pilot=resources.resource_description(resource, walltime, cpus,
                                                                    queue, project),
                  session_root=session_root, retries=retries, resume=resume, envs=envs or {},
                  one_at_a_time=one_at_a_time)
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_run_in_own_session, name="trajflow-workflow",
                        args=(sender, kwargs))
    child.start()
    sender.close()
    try:
        kind = "ended"
        while kind == "ended":
            while not receiver.poll(0.5):
                if not child.is_alive():
                    raise RuntimeError(f"the workflow process ended unexpectedly (exit code "
                                       f"{child.exitcode}); see the EnTK session folder")
            kind, payload = receiver.recv()
            if kind == "ended" and on_run_ended is not None:
                try:
                    on_run_ended(payload)
                except Exception as exc:  # the pilot is still being shut down: never leave it
                    print(f"trajflow: after run {payload}: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
    except KeyboardInterrupt:
        print("trajflow: interrupted; cancelling the pilot (Ctrl-C again to give up waiting)",
              file=sys.stderr, flush=True)
        os.kill(child.pid, signal.SIGINT)
        child.join()
        raise Interrupted("interrupted by the user; the pilot was cancelled")
    child.join()
    if kind == "interrupted":
        raise Interrupted(payload)
    if kind == "error":
        raise RuntimeError(payload)
    return payload


def _was_interrupted(exc):
    return isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt)


def _run_in_own_session(sender, kwargs):
    os.setsid()
    try:
        sender.send(("ok", _run_here(**kwargs, notify=lambda name: sender.send(("ended", name)))))
    except BaseException as exc:  # noqa: the parent must hear of every ending
        sender.send(("interrupted", "interrupted by the user; the pilot was cancelled")
                    if _was_interrupted(exc) else ("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def _run_here(runs, pilot, session_root, retries, resume, envs, one_at_a_time, notify):
    """run_plans' work, in the process that owns the RADICAL session."""
    t0 = time.time()
    session_root = os.path.abspath(session_root or runs[0][1].workdir)
    resources.activate_venv()
    resources.activate_configs()
    os.environ.setdefault("RADICAL_PROFILE", "TRUE")
    os.environ.setdefault("RADICAL_LOG_LVL", "WARNING")
    os.environ.setdefault("RADICAL_REPORT", "FALSE")
    python = resources.task_python(pilot["resource"])
    pipelines = {name: RunPipeline(plan, path, python, name, retries,
                                   remaining_specs(plan, path) if resume else None, envs.get(name))
                 for name, plan, path in runs}
    batches = [[run] for run in runs] if one_at_a_time else [list(runs)]
    outcomes, errors = [], {}
    with working_dir(session_root):
        appman = new_appmanager(pilot, autoterminate=False, base_path=session_root)
        try:
            for batch in batches:
                if errors:  # EnTK gave up on an earlier batch and took the pilot with it
                    errors.update({name: f"not run: {next(iter(errors.values()))}"
                                   for name, _, _ in batch})
                    continue
                appman.workflow = set(pipelines[name].pipeline for name, _, _ in batch)
                try:
                    appman.run()
                except Exception as exc:
                    if _was_interrupted(exc):
                        raise
                    errors.update({name: f"EnTK failed: {type(exc).__name__}: {exc}"
                                   for name, _, _ in batch})
                for name, plan, _ in batch:
                    done = _collect(name, plan, pipelines[name])
                    outcomes += done
                    _write_outcome(plan, done, pipelines[name].stopped_at, errors.get(name))
                    notify(name)
        finally:
            local = resources.is_local(pilot["resource"])
            shutdown(appman, local)
            if local:
                reap_local_tasks(appman.sid)
        session_dir = os.path.join(session_root, appman.sid)
    results = {}
    for name, plan, _ in runs:
        path = plan.result_path()
        results[name] = path if os.path.exists(path) and name not in errors else None
    stopped = {name: run.stopped_at for name, run in pipelines.items()}
    peak = getrusage(RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    return RunReport(outcomes, results, session_dir, time.time() - t0, stopped, peak, errors)


def _collect(name, plan, run):
    """The final state of every task of one run; their RADICAL files kept in RUNDIR/radical/."""
    outcomes = []
    for stage in run.pipeline.stages:
        stage_name, _, attempt = stage.name.partition(".attempt")
        for task in stage.tasks:
            outcomes.append(TaskOutcome(
                pipeline=name, stage=stage_name, attempt=int(attempt or 1),
                name=task.name, state=task.state,
                exit_code=_exit_code(task), sandbox=task.path or "",
                stderr_tail="" if task.state == "DONE" else _stderr_tail(task.path)))
    for o in outcomes:
        keep_task_files(o, plan.path("radical"))
    return outcomes


def _write_outcome(plan, outcomes, stopped_at, error):
    """RUNDIR/outcome.json: how the run ended, written the moment it has ended."""
    failed = failed_for_good(outcomes)
    complete = os.path.exists(plan.result_path()) and not failed and not stopped_at and not error
    record_outcome(plan, "done" if complete else "failed", error, stopped_at,
                   [o.describe() for o in failed])


def record_outcome(plan, status, error=None, stopped_at=None, failed_tasks=()):
    """Write RUNDIR/outcome.json atomically: status "done" or "failed", and why."""
    record = {"run": os.path.basename(plan.workdir), "status": status, "ended": time.time(),
              "stopped_at": stopped_at, "error": error, "failed_tasks": list(failed_tasks)}
    tmp = plan.path(OUTCOME_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=1)
    os.replace(tmp, plan.path(OUTCOME_FILE))


def read_outcome(rundir):
    """The outcome.json of a run, or None while it has not ended."""
    try:
        with open(os.path.join(rundir, OUTCOME_FILE), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
