"""How every task of a run ended, told truthfully, and the run's outcome.json.

EnTK reports a pipeline DONE and returns normally even when a task FAILED, so
every task's final state is checked here; a failure is reported with the
task, its exit code, where its sandbox is and the tail of its stderr. Each
task's RADICAL profile, stdout and stderr are kept in RUNDIR/radical/.
"""
import dataclasses
import glob
import json
import logging
import os
import re
import shutil
import time
from typing import List

from trajflow.tasks.rundir import (CLAIMS, FOLDERS, KEPT_TASK_FILES, OUTCOME, PILOT_EVENTS,
                                   PILOT_PROFILES, record_outcome, release_room, replaced_whole,
                                   SCHEDULER_PROFILES, SCHEDULING, write_text)

log = logging.getLogger(__name__)


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
    kept: str = ""    # where RUNDIR keeps its profile, stdout and stderr (the sandbox goes)

    def describe(self) -> str:
        lines = [f"task {self.pipeline}/{self.stage}/{self.name} (attempt {self.attempt}) "
                 f"ended {self.state}"
                 + (f" with exit code {self.exit_code}" if self.exit_code is not None else "")]
        if self.kept or self.sandbox:
            lines.append(f"  files: {self.kept}" if self.kept else f"  sandbox: {self.sandbox}")
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


def exit_code_of(task):
    """A RADICAL task's exit code (from its exception detail), or None."""
    m = re.search(r"exit code:?\s*(-?\d+)", str(task.exception_detail or ""))
    return int(m.group(1)) if m else None


def keep_task_files(outcome, dest_root):
    """Copy a task's RADICAL profile, stdout and stderr from the pilot sandbox
    into RUNDIR/radical/, so that RUNDIR alone is enough to inspect the run."""
    if not outcome.sandbox or not os.path.isdir(outcome.sandbox):
        return
    dest = os.path.join(dest_root, f"{outcome.stage}.{outcome.name}.attempt{outcome.attempt}")
    try:
        os.makedirs(dest, exist_ok=True)
        if os.path.islink(dest) or os.path.islink(dest_root):  # never written through
            raise OSError(f"{dest} is a symbolic link")
        for path in glob.glob(os.path.join(outcome.sandbox, "*")):
            if path.endswith((".prof", ".out", ".err")) and os.path.isfile(path):
                with replaced_whole(os.path.join(dest, os.path.basename(path))) as tmp:
                    shutil.copy2(path, tmp)
        write_text(os.path.join(dest, OUTCOME), json.dumps(dataclasses.asdict(outcome), indent=1))
        outcome.kept = dest
    except OSError as exc:  # a full disk: the run's own outcome still has to be written
        log.warning("could not keep the files of task %s: %s", outcome.name, exc)


def remove_partial_files(plan):
    """Remove what killed tasks left half-written (see RunPlan.partial_files); only
    once no task of the run can be running."""
    for path in plan.partial_files():
        try:
            os.remove(path)
        except OSError:
            pass


def forget_analyze_attempt(plan):
    """Before an MPI run's analyze task runs again: its earlier ranks' progress counts
    and records go (run again on fewer ranks, the ranks past the new last one would
    count frames twice and leave records of an attempt that made no result)."""
    if not plan.execution.collective or os.path.exists(plan.gathered_part_path()):
        return
    for path in glob.glob(plan.path("progress", "analyze.*")) + glob.glob(
            plan.path("profile", "analyze.*")):
        try:
            os.remove(path)
        except OSError:
            pass


def collect(name, plan, run):
    """The final state of every task of one run; their RADICAL files kept in RUNDIR/radical/."""
    outcomes = []
    for stage in run.pipeline.stages:
        stage_name, _, attempt = stage.name.partition(".attempt")
        for task in stage.tasks:
            outcomes.append(TaskOutcome(
                pipeline=name, stage=stage_name, attempt=int(attempt or 1),
                name=task.name, state=task.state,
                exit_code=exit_code_of(task), sandbox=task.path or "",
                stderr_tail="" if task.state == "DONE" else _stderr_tail(task.path)))
    for o in outcomes:
        keep_task_files(o, plan.path(KEPT_TASK_FILES))
    keep_pilot_events(outcomes, plan.path(KEPT_TASK_FILES))
    return outcomes


def keep_pilot_events(outcomes, dest_root):
    """Each kept task's lines of the agent scheduler's profile (when it came to the
    scheduler, when it got its cores) and the pilot's own lines (its start), so that
    the run's wall time can be told apart from RUNDIR alone (see wall_time.py)."""
    kept = [o for o in outcomes if o.kept and o.sandbox and os.path.isdir(o.sandbox)]
    if not kept:
        return
    pilot_sandbox = os.path.dirname(os.path.normpath(kept[0].sandbox))
    by_task = {os.path.basename(os.path.normpath(o.sandbox)): o.kept for o in kept}
    lines = {uid: [] for uid in by_task}
    for prof in sorted(glob.glob(os.path.join(pilot_sandbox, SCHEDULER_PROFILES))):
        for line in _lines(prof):
            uid = _uid(line)
            if uid in lines:
                lines[uid].append(line)
    pilot_lines = [line for name in PILOT_PROFILES
                   for line in _lines(os.path.join(pilot_sandbox, name))
                   if _uid(line).startswith("pilot.")]
    try:
        for uid, found in lines.items():
            if found:
                write_text(os.path.join(by_task[uid], SCHEDULING), "".join(found))
        if pilot_lines:
            write_text(os.path.join(dest_root, PILOT_EVENTS), "".join(pilot_lines))
    except OSError as exc:  # a full disk: the run's own outcome still has to be written
        log.warning("could not keep the pilot's scheduling events: %s", exc)


def _lines(prof):
    """The lines of one of RADICAL's profiles, read as they come (a held pilot's grow
    with its age); none where it cannot be read."""
    try:
        with open(prof, encoding="utf-8", errors="replace") as fh:
            yield from fh
    except OSError:
        return


def _uid(line):
    parts = line.split(",", 5)
    return parts[4] if len(parts) > 4 else ""


def write_outcome(plan, outcomes, stopped_at, error, note=""):
    """RUNDIR/outcome.json: how the run ended, written the moment it has ended; `note`
    (a full disk, a lost node) joins the error of a run that did not complete."""
    failed = failed_for_good(outcomes)
    complete = os.path.exists(plan.result_path()) and not failed and not stopped_at and not error
    retried = [o for o in outcomes if o.state != "DONE" and o not in failed]
    if not complete:
        error = "; ".join(filter(None, [error, note])) or None
    record_outcome(plan.workdir, "done" if complete else "failed", error, stopped_at,
                   [o.describe() for o in failed], [o.describe() for o in retried])
    if complete:
        tidy(plan)


def tidy(plan):
    """A complete run keeps what tells its story (result, plan, profiles, the tasks'
    files): its progress counts go, then the working folders left empty."""
    for path in glob.glob(plan.path("progress", "*")):
        try:
            os.remove(path)
        except OSError:
            pass
    shutil.rmtree(plan.path(CLAIMS), ignore_errors=True)  # the profile keeps who ran what
    release_room(plan.workdir)  # also where the result was whole before any outcome said so
    for folder in ("progress",) + FOLDERS:
        try:
            os.rmdir(plan.path(folder))  # only when empty: split/ may hold segments kept
        except OSError:
            pass
