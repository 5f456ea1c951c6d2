"""Run pipelines on a pilot with EnTK, and tell the truth about how they ended.

EnTK reports a pipeline DONE and returns normally even when a task FAILED, so
every task's final state is checked here; a failure is reported with the
task, its exit code, where its sandbox is and the tail of its stderr.
"""
import dataclasses
import glob
import json
import logging
import os
import multiprocessing
import shutil
import signal
import re as regex
import threading
import time
from resource import RUSAGE_SELF, getrusage
from typing import List

from trajflow.tasks.rundir import KEPT_TASK_FILES, OUTCOME
from trajflow.tasks.client_guard import CLIENT_CONFIGS
from trajflow.tasks.rundir import read_outcome, record_outcome  # noqa: F401  (their home)

from trajflow.workflows.run import resources
from trajflow.workflows.run.entk_client import (new_appmanager, reap_local_tasks, remove_id_counters,
                          remove_local_sandbox, shutdown, working_dir)
from trajflow.workflows.errors import Interrupted
from trajflow.workflows.run.heartbeat import (CLOSED, DEFAULT_CLIENT_TIMEOUT_S, Heartbeat, cancel_orphans,
                        guard_bootstrap_command, heartbeat_period, record_session)
from trajflow.workflows.run.pilot_start import StartWatch
from trajflow.workflows.run.pipeline import RunPipeline, remaining_specs
from trajflow.workflows.run.planning import full_disk_note
from trajflow.workflows.run.rundir_lock import close_inherited

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


def _exit_code(task):
    m = regex.search(r"exit code:?\s*(-?\d+)", str(task.exception_detail or ""))
    return int(m.group(1)) if m else None


def keep_task_files(outcome, dest_root):
    """Copy a task's RADICAL profile, stdout and stderr from the pilot sandbox
    into RUNDIR/radical/, so that RUNDIR alone is enough to inspect the run."""
    if not outcome.sandbox or not os.path.isdir(outcome.sandbox):
        return
    dest = os.path.join(dest_root, f"{outcome.stage}.{outcome.name}.attempt{outcome.attempt}")
    try:
        os.makedirs(dest, exist_ok=True)
        for path in glob.glob(os.path.join(outcome.sandbox, "*")):
            if path.endswith((".prof", ".out", ".err")) and os.path.isfile(path):
                shutil.copy2(path, dest)
        with open(os.path.join(dest, OUTCOME), "w", encoding="utf-8") as fh:
            json.dump(dataclasses.asdict(outcome), fh, indent=1)
        outcome.kept = dest
    except OSError as exc:  # a full disk: the run's own outcome still has to be written
        log.warning("could not keep the files of task %s: %s", outcome.name, exc)


def run_plans(runs, resource, walltime, cpus, queue=None, project=None, session_root=None,
              retries=1, resume=False, envs=None, one_at_a_time=False, on_run_ended=None,
              on_event=None, client_timeout=DEFAULT_CLIENT_TIMEOUT_S):
    """Run [(name, plan, plan_path)] as pipelines on one pilot; return a RunReport.

    A failed task is run again up to `retries` times before its run fails.
    `resume`: run only what the runs are missing. `envs`: run name -> extra
    task environment (the testing hooks of one run only). `one_at_a_time`:
    the runs go through the pilot one after another (EnTK's AppManager.run()
    once per run, the pilot kept between them), so that no run's timings are
    disturbed by another's; otherwise all run side by side. Each run's RUNDIR
    gets an outcome.json as soon as it has ended, and `on_run_ended(name)` is
    then called here, while the pilot is already being shut down (the CLI
    writes the run's report meanwhile). `on_event(run, stage, kind, text)`:
    the pilot's activation and each stage's start and end as they happen.
    `client_timeout`: see PilotProcess.
    """
    t0 = time.time()
    if resume:  # a pilot of these runs whose client died must not run beside this one
        for _name, plan, _path in runs:
            cancel_orphans(plan.workdir, log.warning)
            remove_partial_files(plan)
    desc = resources.resource_description(resource, walltime, cpus, queue, project)
    requests = [RunRequest(name, plan, path, retries, resume, (envs or {}).get(name))
                for name, plan, path in runs]
    process = PilotProcess(desc, session_root or runs[0][1].workdir, on_event=on_event,
                           client_timeout=client_timeout)
    with process:
        report = process.run_batch(requests, one_at_a_time, close_after=True,
                                   on_run_ended=lambda name, _outcomes: on_run_ended
                                   and on_run_ended(name))
    report.wall_s = time.time() - t0  # the pilot's shutdown included
    return report


@dataclasses.dataclass
class RunRequest:
    """One run for the pilot: its plan, and how to run it."""
    name: str
    plan: object             # RunPlan
    plan_path: str
    retries: int = 1
    resume: bool = False     # run only what an interrupted run is missing
    env: dict = None         # extra task environment (testing hooks)
    progress: bool = True    # say its stages and its end


class PilotProcess:
    """One EnTK AppManager (one RADICAL session, one pilot) in a child process,
    serving batches of runs until it is closed.

    EnTK and RADICAL-Pilot run in a child process in a session of its own. A
    Ctrl-C in the terminal reaches the whole foreground process group: had
    RADICAL's client components been in it, they would die at once, the
    pilot's cancel command would never be sent, and the agent and its tasks
    would run on until the walltime. Here only this process gets the signal;
    `interrupt()` asks the child to stop, which cancels the pilot in order.
    The pilot is requested with the first batch and kept until `close()`.

        with PilotProcess(desc, "/scratch/runs") as pilot:
            first = pilot.run_batch([RunRequest("rmsd", plan, path)])
            second = pilot.run_batch([RunRequest("dih", plan2, path2)])
    """

    def __init__(self, pilot, session_root, on_event=None,
                 client_timeout=DEFAULT_CLIENT_TIMEOUT_S, keep_sandbox=False):
        self.pilot = pilot                  # the RADICAL-Pilot description
        self.session_root = os.path.abspath(session_root)
        self.client_timeout = client_timeout  # s; 0: the pilot may outlive this process
        self.keep_sandbox = keep_sandbox
        self.on_event = on_event or (lambda run, stage, kind, text: None)
        self.session_dir = None
        self._child = self._conn = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.interrupt()
        else:
            self.close()

    def start(self):
        ctx = multiprocessing.get_context("fork")
        self._conn, child_end = ctx.Pipe()
        self._child = ctx.Process(target=_serve, name="trajflow-pilot",
                                  args=(child_end, self.pilot, self.session_root, self._conn,
                                        os.getpid(), self.client_timeout, self.keep_sandbox))
        self._child.start()
        child_end.close()

    @property
    def alive(self):
        return self._child is not None and self._child.is_alive()

    def run_batch(self, requests, one_at_a_time=False, close_after=False, on_run_ended=None):
        """Run the requests side by side (or `one_at_a_time`); a RunReport.

        `on_run_ended(name, outcomes)` as each run ends. `close_after`: the
        pilot is shut down as soon as the batch has ended, overlapping the
        callbacks still running here.
        """
        self._conn.send(("batch", dict(requests=requests, one_at_a_time=one_at_a_time,
                                       close_after=close_after)))
        try:
            while True:
                kind, payload = self._receive()
                if kind == "ended" and on_run_ended is not None:
                    try:
                        on_run_ended(*payload)
                    except Exception as exc:  # the pilot still runs: never leave it
                        log.error("after run %s: %s: %s", payload[0], type(exc).__name__, exc)
                elif kind == "report":
                    if close_after:
                        self._join()
                    return payload
        except KeyboardInterrupt:
            self.interrupt()

    def _receive(self):
        """The child's next message; events go to on_event; its failures raised here."""
        while True:
            try:
                while not self._conn.poll(0.5):
                    if not self._child.is_alive():
                        raise EOFError
                kind, payload = self._conn.recv()
            except EOFError:  # the child is gone without a word
                self._join()
                code = self._child.exitcode
                how = (f"killed by signal {-code}" if code is not None and code < 0
                       else f"exit code {code}")
                raise RuntimeError(f"the process holding the pilot ended unexpectedly ({how}); "
                                   f"see the RADICAL session folder {self.session_dir or ''}"
                                   + _session_log_tail(self.session_dir))
            if kind == "event":
                self.on_event(*payload)
            elif kind == "session":
                self.session_dir = payload
            elif kind == "interrupted":
                self._join()
                raise Interrupted(payload)
            elif kind == "error":
                self._join()
                raise RuntimeError(payload)
            else:
                return kind, payload

    def interrupt(self, why="interrupted"):
        """Cancel the pilot now (its running tasks end), and raise Interrupted."""
        if self.alive:
            log.warning("%s; cancelling the pilot (Ctrl-C again to give up waiting)", why)
            os.kill(self._child.pid, signal.SIGINT)
            self._join()
        raise Interrupted("interrupted by the user; the pilot was cancelled")

    def close(self):
        """Cancel the pilot (after the batches sent have ended) and end the child."""
        if self.alive:
            try:
                self._conn.send(("close", None))
                while self._receive()[0] != "closed":
                    pass
            except (BrokenPipeError, EOFError):
                pass
            self._join()

    def _join(self):
        """Wait for the child (its shutdown is bounded: SHUTDOWN_LIMIT_S), then end
        whatever of its process group is left (RADICAL's client components):
        the group is the child's own session, never this process's."""
        self._child.join()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._child.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(1.0)


def _was_interrupted(exc):
    return isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt)


_STOPPED_BY = ["the user"]  # who asked the child to stop: the user, or its client's death
_PILOT_FAILED = [None]      # what RADICAL-Pilot said when it ended the child's main thread


def _serve(conn, pilot, session_root, parent_end, client_pid, client_timeout, keep_sandbox):
    """The child: one RADICAL session, batches of runs until "close" (or a Ctrl-C).

    While its client (the parent) lives, it touches the session's heartbeat,
    which the pilot's guard watches (`client_timeout` s; 0: no guard); when the
    client is gone it stops as on a Ctrl-C: the pilot cancelled in order."""
    parent_end.close()  # else its sends would never fail once the parent is gone
    close_inherited()   # RUNDIR locks are the parent's (see rundir_lock)
    os.setsid()
    # Its stop is SIGINT (from the parent's interrupt, or _client_gone); a script
    # started with & or nohup gives its children SIGINT ignored, which left the
    # child deaf to both and the parent joining it forever (seen).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    _start_group_reaper()
    resources.activate_venv()
    resources.activate_configs()
    os.environ.setdefault("RADICAL_PROFILE", "TRUE")
    os.environ.setdefault("RADICAL_LOG_LVL", "WARNING")
    os.environ.setdefault("RADICAL_REPORT", "FALSE")
    session = _Session(conn, pilot, session_root, client_pid, client_timeout, keep_sandbox)
    ending = ("closed", None)
    in_flight = []  # the plans of the batch being run: their partial files go at the end
    try:
        with working_dir(session_root):
            session.open()
            lost = None  # why the pilot is gone, once EnTK gave up
            while True:
                kind, batch = conn.recv()
                if kind == "close":
                    break
                in_flight[:] = [r.plan for r in batch["requests"]]
                report, lost = _run_batch(session, lost, conn, **batch)
                in_flight.clear()
                if batch["close_after"]:  # the report goes once the pilot is cancelled
                    ending = ("report", report)
                    break
                _send(conn, ("report", report))
    except BaseException as exc:  # noqa: the parent must hear of every ending
        ending = (("error", _interrupted_text()) if _PILOT_FAILED[0]
                  else ("interrupted", _interrupted_text()) if _was_interrupted(exc)
                  else ("error", f"{type(exc).__name__}: {exc}"))
    finally:
        # bounded: a failed session close (ENOSPC, seen) once left this process waiting
        # forever on RADICAL's proxy process in multiprocessing's exit hook
        watchdog = threading.Timer(SHUTDOWN_LIMIT_S, _give_up, args=(session_root, in_flight))
        watchdog.daemon = True  # never keeps the process alive; it only cuts a hang short
        watchdog.start()
        session.close(ending[0])  # the pilot cancelled before the parent hears the end
        for plan in in_flight:      # no task of theirs runs any more
            remove_partial_files(plan)
        try:
            _send(conn, ending)
            if ending[0] != "closed":
                _send(conn, ("closed", None))
        except (BrokenPipeError, OSError):
            pass
        conn.close()


class _Session:
    """The child's RADICAL session: its AppManager (and pilot), its folder, the
    heartbeat the pilot's guard watches, the watch on the pilot's start.
    `renew()` replaces it by a new one (a pilot whose start hung)."""

    def __init__(self, conn, pilot, session_root, client_pid, client_timeout, keep_sandbox):
        self.conn, self.pilot, self.session_root = conn, pilot, session_root
        self.client_pid, self.client_timeout = client_pid, client_timeout
        self.keep_sandbox = keep_sandbox
        self.local = resources.is_local(pilot["resource"])
        self.appman = self.dir = self.beat = self.configs = self.watch = None
        self.renewed = False  # a session replaced once already is not replaced again

    def open(self):
        self.appman = new_appmanager(self.pilot, autoterminate=False, base_path=self.session_root,
                                     rts_config={"sandbox_cleanup": not self.keep_sandbox
                                                 and not self.local, "db_cleanup": False})
        self.dir = os.path.join(self.session_root, self.appman.sid)
        os.makedirs(self.dir, exist_ok=True)
        self.configs = os.path.join(self.dir, CLIENT_CONFIGS)
        python = resources.task_python(self.pilot["resource"])
        guard = [guard_bootstrap_command(python, self.dir, self.client_timeout)]
        resources.session_configs(self.configs, self.pilot["resource"], self.pilot["cpus"],
                                  (guard if self.client_timeout else [])
                                  + [resources.kernels_bootstrap_entry(python)]
                                  + _test_start_delay())
        self.beat = Heartbeat(self.dir, self.client_pid, _client_gone,
                              heartbeat_period(self.client_timeout or DEFAULT_CLIENT_TIMEOUT_S)
                              ).start()
        _send(self.conn, ("session", self.dir))
        self.watch = StartWatch(self.appman, self._active, self.local).start()
        _SESSION_PILOT[0] = self.watch.pilot

    def _active(self, uid):  # EnTK tells nobody: between the request and this, the
        # time is the batch queue's and the agent's start
        _send(self.conn, ("event", ("pilot", None, "active", f"active ({uid})")))

    def close(self, how):
        """Cancel the pilot; on this machine end its leftover tasks and remove its
        sandbox (each run's folder holds its tasks' files by then; on a cluster
        RADICAL-Pilot cleans up, asked through EnTK's rts_config)."""
        if self.appman is None:
            return
        hung = self.watch is not None and self.watch.hung
        try:
            shutdown(self.appman, self.local)
        finally:
            remove_id_counters(self.appman.sid)
            if self.local:
                reap_local_tasks(self.appman.sid)
                if not self.keep_sandbox:
                    remove_local_sandbox(self.appman, self.dir,
                                         keep_logs=bool(_PILOT_FAILED[0] or hung))
            self.appman = None
        if self.beat is not None:
            self.beat.stop()
            try:
                with open(os.path.join(self.dir, CLOSED), "w") as fh:
                    fh.write(f"the client cancelled its pilot ({how})\n")
            except OSError:  # a full disk: the guard then ends the pilot by the heartbeat
                pass
        if self.configs is not None:
            shutil.rmtree(self.configs, ignore_errors=True)
        self.beat = self.configs = self.watch = None

    def renew(self):
        """A new session and pilot for the same batch; the old one's folder says why."""
        self.close("its start hung")
        self.renewed = True
        self.open()


SHUTDOWN_LIMIT_S = 60.0  # the longest the child may take to stop, once it is asked to


def _give_up(where, plans):
    log.error("the process holding the pilot did not stop within %.0f s; it ends now (RADICAL "
              "session under %s)", SHUTDOWN_LIMIT_S, where)
    for plan in plans:
        remove_partial_files(plan)
    os._exit(70)


def _session_log_tail(session_dir, n=10):
    """The last lines of the session's most recently written log, for a report."""
    logs = glob.glob(os.path.join(session_dir or "", "*.log"))
    if not logs:
        return ""
    latest = max(logs, key=os.path.getmtime)
    with open(latest, errors="replace") as fh:
        tail = fh.read().splitlines()[-n:]
    return f"\nlast lines of {latest}:\n  " + "\n  ".join(tail)


def _start_group_reaper(poll_s=1.0):
    """Fork a small process that, when this one ends however it ends (SIGKILL
    included), ends what is left of its process group: RADICAL's client
    components (its session proxy, seen living on for good after a SIGKILL;
    a local pilot's bootstrapper and agent). It sits in a group of its own,
    holds no descriptor of ours, and runs no Python cleanup."""
    group = os.getpid()
    if os.fork():
        return
    try:
        os.setpgid(0, 0)
        os.closerange(3, 65536)
        while os.getppid() == group:
            time.sleep(poll_s)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            time.sleep(2.0)
    finally:
        os._exit(0)


def _client_gone():
    """The heartbeat found the client gone: stop as a Ctrl-C would (in the main thread)."""
    _STOPPED_BY[0] = "the end of the trajflow process that started it"
    os.kill(os.getpid(), signal.SIGINT)


def _terminated(signum, frame):
    """SIGTERM in the child: RADICAL-Pilot's own way to stop the main thread when
    its pilot FAILED (ru.cancel_main_thread; a batch job ended by its time limit,
    seen), which was reported as "interrupted by the user"; or a kill."""
    pilot = _SESSION_PILOT[0]() if _SESSION_PILOT[0] else None
    if getattr(pilot, "state", None) == "FAILED":
        _PILOT_FAILED[0] = (f"the pilot {pilot.uid} failed (RADICAL-Pilot: its job ended before "
                            "the runs did: the walltime ran out, or the job was killed or "
                            "could not start; the batch system's and RADICAL's logs are in "
                            "the session folder)")
    else:
        _STOPPED_BY[0] = "a SIGTERM"
    raise KeyboardInterrupt(signal.Signals(signum).name)


_SESSION_PILOT = [None]  # returns the current session's pilot (for _terminated)


def _interrupted_text():
    return _PILOT_FAILED[0] or f"interrupted by {_STOPPED_BY[0]}; the pilot was cancelled"


def _test_start_delay():
    """Testing hook: $TRAJFLOW_TEST_PILOT_START_DELAY_S (the first pilot of a child
    only) delays the pilot's bootstrap, as a start that hangs would."""
    delay = os.environ.pop("TRAJFLOW_TEST_PILOT_START_DELAY_S", None)
    return [resources.pre_bootstrap_entry(f"sleep {float(delay):g}")] if delay else []


_SEND_LOCK = threading.Lock()  # the child's threads share one pipe to the parent


def _send(conn, message):
    with _SEND_LOCK:
        conn.send(message)


def _run_batch(session, lost, conn, requests, one_at_a_time, close_after):
    """Run one batch on the session's AppManager: (RunReport, why the pilot is gone
    or None). A pilot whose start hung (see pilot_start) is replaced once, by a
    new session: nothing of the batch had run on it."""
    t0 = time.time()
    python = resources.task_python(session.pilot["resource"])

    def event(run_name):  # called from EnTK's thread, which runs the stages' post_exec
        return lambda stage, kind, text: _send(conn, ("event", (run_name, stage, kind, text)))

    def pipeline(r):
        return RunPipeline(r.plan, r.plan_path, python, r.name, r.retries,
                           remaining_specs(r.plan, r.plan_path) if r.resume else None,
                           r.env, on_event=event(r.name))
    pipelines = {r.name: pipeline(r) for r in requests}
    batches = [[r] for r in requests] if one_at_a_time else [list(requests)]
    for r in requests:  # a later --resume finds this pilot here, should its client die
        record_session(r.plan.workdir, session.dir)
    outcomes, errors, ended = [], {}, set()
    try:
        for batch in batches:
            if lost:  # EnTK gave up on an earlier batch and took the pilot with it
                errors.update({r.name: f"not run: {lost}" for r in batch})
                continue
            while True:
                session.appman.workflow = set(pipelines[r.name].pipeline for r in batch)
                try:
                    session.appman.run()
                except Exception as exc:
                    if _was_interrupted(exc):
                        raise
                    hung = session.watch.hung
                    if hung and not session.renewed:
                        _send(conn, ("event", ("pilot", None, "restarted",
                                               f"{hung}; starting another")))
                        session.renew()
                        pipelines.update({r.name: pipeline(r) for r in requests
                                          if r.name not in ended})
                        for r in requests:
                            record_session(r.plan.workdir, session.dir)
                        continue
                    lost = hung or f"EnTK failed: {type(exc).__name__}: {exc}"
                    errors.update({r.name: lost for r in batch})
                break
            for r in batch:
                disk = full_disk_note(r.plan)  # before the partial files give space back
                remove_partial_files(r.plan)    # first: a full disk fails what follows
                done = _collect(r.name, r.plan, pipelines[r.name])
                outcomes += done
                _write_outcome(r.plan, done, pipelines[r.name].stopped_at, errors.get(r.name),
                               disk)
                ended.add(r.name)
                _send(conn, ("ended", (r.name, done)))
    except BaseException as exc:
        if _was_interrupted(exc):  # the runs that had not ended say so on disk
            for r in requests:
                if r.name in ended:
                    continue
                if os.path.exists(r.plan.result_path()):  # published before the interrupt came
                    record_outcome(r.plan.workdir, "done", note=f"{_interrupted_text()} after the "
                                   "result was complete")
                else:
                    record_outcome(r.plan.workdir, "failed", _interrupted_text())
        raise
    results = {}
    for r in requests:
        path = r.plan.result_path()
        results[r.name] = path if os.path.exists(path) and r.name not in errors else None
    stopped = {name: run.stopped_at for name, run in pipelines.items()}
    peak = getrusage(RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    return RunReport(outcomes, results, session.dir, time.time() - t0, stopped, peak, errors), lost


def remove_partial_files(plan):
    """Remove what killed tasks left half-written (see RunPlan.partial_files); only
    once no task of the run can be running."""
    for path in plan.partial_files():
        try:
            os.remove(path)
        except OSError:
            pass


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
        keep_task_files(o, plan.path(KEPT_TASK_FILES))
    return outcomes


def _write_outcome(plan, outcomes, stopped_at, error, disk_note=""):
    """RUNDIR/outcome.json: how the run ended, written the moment it has ended."""
    failed = failed_for_good(outcomes)
    complete = os.path.exists(plan.result_path()) and not failed and not stopped_at and not error
    retried = [o for o in outcomes if o.state != "DONE" and o not in failed]
    if not complete:
        error = "; ".join(filter(None, [error, disk_note])) or None
    record_outcome(plan.workdir, "done" if complete else "failed", error, stopped_at,
                   [o.describe() for o in failed], [o.describe() for o in retried])
