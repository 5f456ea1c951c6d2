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
import multiprocessing
import shutil
import signal
import sys
import threading
import re as regex
import time
from resource import RUSAGE_SELF, getrusage
from typing import List

from . import resources
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


@contextlib.contextmanager
def _working_dir(path):
    """chdir, and $PWD with it: RADICAL-Pilot puts its client session under
    ${RADICAL_PILOT_BASE:$PWD}, and os.chdir() alone left every run's RP
    session folder in the user's working directory (seen)."""
    old, old_pwd = os.getcwd(), os.environ.get("PWD")
    os.makedirs(path, exist_ok=True)
    os.chdir(path)
    os.environ["PWD"] = os.path.abspath(path)
    try:
        yield
    finally:
        os.chdir(old)
        if old_pwd is None:
            os.environ.pop("PWD", None)
        else:
            os.environ["PWD"] = old_pwd


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


def shutdown(appman, local=False):
    """Stop EnTK and the pilot, the two slow parts side by side.

    EnTK's terminate() first stops its threads (see pace_entk) and only then
    cancels the pilot (RP waits up to 20 s for the agent). Cancelling the
    pilot in a thread meanwhile overlaps the two (4.7 s less, measured when
    the task manager still slept 10 s). On a local resource EnTK is also kept
    from downloading the pilot's profiles, which are on this disk already.
    """
    rmgr = getattr(appman, "_rmgr", None)  # EnTK keeps its resource manager private
    pilot, pmgr = getattr(rmgr, "pilot", None), getattr(rmgr, "pmgr", None)
    cancel = None
    if pilot is not None and pmgr is not None:
        cancel = threading.Thread(target=pmgr.cancel_pilots, args=(pilot.uid,),
                                  kwargs={"_timeout": 20}, daemon=True)
        cancel.start()
    if local and "RADICAL_PROFILE" in os.environ:
        # EnTK downloads the pilot's profiles at close when this is set; on a
        # local resource they are on this disk already (the agent sandbox), and
        # the copy cost seconds of every run's teardown. The agent was started
        # with it, so the profiles are still written.
        del os.environ["RADICAL_PROFILE"]
    appman.terminate()
    if cancel is not None:
        cancel.join(30)


def pace_entk(appman, poll_s=0.05):
    """Make EnTK's client threads wait instead of spinning, and hear terminate() sooner.

    Seen here (py-spy on the process holding EnTK, a task sleeping): the
    process used a whole core all run long, which on a 2-core workstation is
    one core taken from the tasks. Three loops of EnTK 1.103 are paced, each
    at the one call it makes per turn:
    - WFprocessor's enqueue thread calls `_create_workload()` back to back:
      after a turn with nothing to submit it now pauses `poll_s`;
    - AppManager's `_run_workflow` loop polls the pipelines with no pause: its
      per-turn `get_resource_allocation_state()` now pauses `poll_s` first;
    - the task manager's submit thread waits on its queue with get(timeout=10)
      and terminate() joins it, so every teardown waited up to 10 s: its
      module's queue now waits at most 0.5 s per get (an empty get is already
      "look again" there).
    New stages and ended pipelines are seen within `poll_s`. Each patch is
    skipped, harmlessly, if EnTK's code is not what it expects.
    """
    import queue as std_queue
    import types
    from radical.entk.appman import wfprocessor
    from radical.entk.execman.rp import task_manager

    create = wfprocessor.WFprocessor._create_workload
    if not getattr(create, "_trajflow_paced", False):
        def paced_create(self):
            workload, stages = create(self)
            if not workload:
                time.sleep(poll_s)
            return workload, stages
        paced_create._trajflow_paced = True
        wfprocessor.WFprocessor._create_workload = paced_create

    rmgr = getattr(appman, "_rmgr", None)
    get_state = getattr(rmgr, "get_resource_allocation_state", None)
    if get_state is not None and not getattr(get_state, "_trajflow_paced", False):
        def paced_state():
            time.sleep(poll_s)
            return get_state()
        paced_state._trajflow_paced = True
        rmgr.get_resource_allocation_state = paced_state

    if getattr(task_manager, "queue", None) is std_queue:
        class _PromptQueue(std_queue.Queue):
            def get(self, block=True, timeout=None):
                if block and timeout is not None and timeout > 0.5:
                    timeout = 0.5
                return super().get(block, timeout)
        task_manager.queue = types.SimpleNamespace(Queue=_PromptQueue, Empty=std_queue.Empty)


def reap_local_tasks(sid, grace_s=5.0):
    """End task processes a cancelled local pilot left behind.

    RADICAL-Pilot starts every task in a session of its own (its launch.sh)
    and, when the pilot is cancelled mid-run, does not end them: on a cluster
    the batch system does, on a workstation they would run on. They are found
    by their sandbox path (under this session's id) in /proc and ended by
    process group id: SIGTERM, then SIGKILL after `grace_s`.
    """
    marker = f"/{sid}/".encode()
    groups = set()
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as fh:
                text = fh.read()
            if marker in text and b"launch.sh" in text:
                groups.add(os.getpgid(int(cmdline.split("/")[2])))
        except (OSError, ProcessLookupError):
            continue
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = set()
        for pgid in groups:
            try:
                os.killpg(pgid, sig)
                alive.add(pgid)
            except ProcessLookupError:
                pass
        groups = alive
        if not groups:
            return
        time.sleep(grace_s if sig == signal.SIGTERM else 0)


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
              retries=1, resume=False, envs=None, one_at_a_time=False):
    """Run [(name, plan, plan_path)] as pipelines on one pilot; return a RunReport.

    A failed task is run again up to `retries` times before its run fails.
    `resume`: run only what the runs are missing. `envs`: run name -> extra
    task environment (the testing hooks of one run only). `one_at_a_time`:
    the runs go through the pilot one after another (EnTK's AppManager.run()
    once per run, the pilot kept between them), so that no run's timings are
    disturbed by another's; otherwise all run side by side. Each run's RUNDIR
    gets an outcome.json as soon as it has ended.

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
        while not receiver.poll(0.5):
            if not child.is_alive():
                raise RuntimeError(f"the workflow process ended unexpectedly "
                                   f"(exit code {child.exitcode}); see the EnTK session folder")
        kind, payload = receiver.recv()
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
        sender.send(("ok", _run_here(**kwargs)))
    except BaseException as exc:  # noqa: the parent must hear of every ending
        sender.send(("interrupted", "interrupted by the user; the pilot was cancelled")
                    if _was_interrupted(exc) else ("error", f"{type(exc).__name__}: {exc}"))
    finally:
        sender.close()


def _run_here(runs, pilot, session_root, retries, resume, envs, one_at_a_time):
    """run_plans' work, in the process that owns the RADICAL session."""
    import radical.entk as re
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
    with _working_dir(session_root):
        appman = re.AppManager(autoterminate=False, base_path=session_root)
        appman.resource_desc = pilot
        pace_entk(appman)
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
