"""The process that holds the pilot (the child of PilotProcess, execute.py).

It owns one RADICAL session at a time (EnTK's AppManager and its pilot),
serves the batches of runs its parent sends, side by side on one live EnTK
workflow (a batch never waits for another to end), and tells the parent
every event, every run's end and every batch's report. It stops on SIGINT (its parent's interrupt, or its
client's death seen by the heartbeat) by cancelling the pilot in order, and
never takes longer than SHUTDOWN_LIMIT_S to stop.
"""
import dataclasses
import json
import logging
import os
import shutil
import signal
import threading
import time
from resource import RUSAGE_SELF, getrusage

from trajflow.tasks import procfs
from trajflow.tasks.agent_rpc import LOSE_FIRST_SEND
from trajflow.tasks.client_guard import CLIENT_CONFIGS
from trajflow.tasks.placement import (node_cpus, pin_to, RADICAL_TIMER_SLACK_NS, set_timer_slack,
                                      split_cpus)
from trajflow.tasks.rundir import open_in_run, record_outcome
from trajflow.workflows.run import resources
from trajflow.workflows.run.batch import BATCH_JOB, lost_nodes_of_job
from trajflow.workflows.run.entk_client import (cancel_tasks, CompletionFailed, LiveWorkflow,
                                                new_appmanager, reap_local_tasks,
                                                remove_id_counters, remove_local_sandbox, run_live,
                                                shutdown, working_dir)
from trajflow.workflows.run.heartbeat import (CLOSED, DEFAULT_CLIENT_TIMEOUT_S,
                                              guard_bootstrap_command, Heartbeat, heartbeat_period,
                                              record_session)
from trajflow.workflows.run.outcomes import (collect, failed_for_good, remove_partial_files,
                                             RunReport, write_outcome)
from trajflow.workflows.run.pilot_start import StartWatch
from trajflow.tasks.stages import remaining_specs
from trajflow.workflows.run.pipeline import RunPipeline, ServedTaskCommand, TaskCommand
from trajflow.workflows.run.planning import full_disk_note
from trajflow.workflows.run.rundir_lock import close_inherited

log = logging.getLogger(__name__)


def _was_interrupted(exc):
    return isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt)


_STOPPED_BY = ["the user"]  # who asked the child to stop: the user, or its client's death
_PILOT_FAILED = [None]      # what RADICAL-Pilot said when it ended the child's main thread


def serve(conn, pilot, session_root, parent_end, client_pid, client_timeout, keep_sandbox,
          bounds, reasons):
    """The child: one RADICAL session, runs as they come until "close" (or a Ctrl-C).

    While its client (the parent) lives, it touches the session's heartbeat,
    which the pilot's guard watches (`client_timeout` s; 0: no guard); when the
    client is gone it stops as on a Ctrl-C: the pilot cancelled in order.
    `bounds`: the watchdog's (the pilot's start is watched here); `reasons`: the
    read end of the pipe where the parent says why it stops this process
    (PilotProcess.stop) before its SIGINT."""
    parent_end.close()  # else its sends would never fail once the parent is gone
    _REASONS[0] = reasons
    close_inherited()   # RUNDIR locks are the parent's (see rundir_lock)
    os.setsid()
    # Its stop is SIGINT (from the parent's interrupt, or _client_gone); a script
    # started with & or nohup gives its children SIGINT ignored, which left the
    # child deaf to both and the parent joining it forever (seen).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminated)
    kept = resources.agent_cores(pilot["resource"])
    if kept and resources.is_local(pilot["resource"]):
        # RADICAL's client and EnTK beside the agent they feed, off the ranks
        pin_to(split_cpus(kept, node_cpus())[0] or node_cpus())
    # RADICAL's client processes, and a local agent's, wake less often while idle
    set_timer_slack(RADICAL_TIMER_SLACK_NS)
    _send(conn, ("reaper", _start_group_reaper()))  # the client waits for its end too
    resources.activate_venv()
    resources.activate_configs()
    os.environ.setdefault("RADICAL_PROFILE", "TRUE")
    os.environ.setdefault("RADICAL_LOG_LVL", "WARNING")
    os.environ.setdefault("RADICAL_REPORT", "FALSE")
    session = _Session(conn, pilot, session_root, client_pid, client_timeout, keep_sandbox,
                       bounds["start"])
    runs = None
    ending = ("closed", None)
    try:
        runs = _Runs(session, conn)
        with working_dir(session_root):
            session.open()
            threading.Thread(target=runs.receive, name="trajflow-batches", daemon=True).start()
            ending = runs.serve()
    except BaseException as exc:  # noqa: the parent must hear of every ending
        failed = _PILOT_FAILED[0] or _stop_reason().get("kind") == "failed"
        ending = (("error", _interrupted_text()) if failed
                  else ("interrupted", _interrupted_text()) if _was_interrupted(exc)
                  else ("error", f"{type(exc).__name__}: {exc}"))
    finally:
        in_flight = []  # the plans of the runs not ended: their partial files go at the end
        # bounded: a failed session close (ENOSPC, seen) once left this process waiting
        # forever on RADICAL's proxy process in multiprocessing's exit hook
        watchdog = threading.Timer(SHUTDOWN_LIMIT_S, _give_up, args=(session_root, in_flight))
        watchdog.daemon = True  # never keeps the process alive; it only cuts a hang short
        watchdog.start()
        in_flight += runs.plans_in_flight() if runs is not None else []
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

    def __init__(self, conn, pilot, session_root, client_pid, client_timeout, keep_sandbox,
                 start_limit_s):
        self.conn, self.pilot, self.session_root = conn, pilot, session_root
        self.client_pid, self.client_timeout = client_pid, client_timeout
        self.keep_sandbox = keep_sandbox
        self.start_limit_s = start_limit_s
        self.local = resources.is_local(pilot["resource"])
        self.appman = self.dir = self.beat = self.configs = self.watch = None
        self.renewed = False  # a session replaced once already is not replaced again

    def open(self):
        batch = resources.pilot_batch_system(self.pilot["resource"],
                                             self.pilot.get("access_schema"))
        if batch is not None:  # before RADICAL starts the components that submit the job
            os.environ.update(batch.client_environment())
        self.appman = new_appmanager(self.pilot, autoterminate=False, base_path=self.session_root,
                                     rts_config={"sandbox_cleanup": not self.keep_sandbox
                                                 and not self.local, "db_cleanup": False})
        self.dir = os.path.join(self.session_root, self.appman.sid)
        os.makedirs(self.dir, exist_ok=True)
        self.configs = os.path.join(self.dir, CLIENT_CONFIGS)
        python = resources.task_python(self.pilot["resource"])
        guard = [guard_bootstrap_command(python, self.dir, self.client_timeout)]
        job_record = []
        if batch is not None:  # so that a pilot lost with a node is reported by its name
            _SESSION_JOB[0] = (batch, os.path.join(self.dir, BATCH_JOB))
            job_record = [resources.pre_bootstrap_entry(batch.job_record_command(
                _SESSION_JOB[0][1]))]
        resources.session_configs(self.configs, self.pilot["resource"], self.pilot["cpus"],
                                  (guard if self.client_timeout else []) + job_record
                                  + [resources.kernels_bootstrap_entry(python)]
                                  + _test_start_delay())
        self.beat = Heartbeat(self.dir, self.client_pid, _client_gone,
                              heartbeat_period(self.client_timeout or DEFAULT_CLIENT_TIMEOUT_S)
                              ).start()
        _send(self.conn, ("session", self.dir))
        self.watch = StartWatch(self.appman, self._active, self.local, self.start_limit_s,
                                on_phase=lambda step: _send(self.conn, ("phase", step))).start()
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
                with open_in_run(os.path.join(self.dir, CLOSED), "w") as fh:
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


def _start_group_reaper(poll_s=0.1):
    """Fork a small process that, when this one ends however it ends (SIGKILL
    included), ends what is left of its process group: RADICAL's client
    components (its session proxy, seen living on for good after a SIGKILL;
    a local pilot's bootstrapper and agent). It sits in a group of its own,
    holds no descriptor of ours (not the client's output either: a caller reading it to
    its end, `trajflow run | tee`, waited 2 s more for this process), and runs no Python
    cleanup."""
    group = os.getpid()
    reaper = os.fork()
    if reaper:
        return reaper
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)
        while os.getppid() == group:
            time.sleep(poll_s)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            if procfs.group_ended(group, patience_s=2.0):
                break
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
        _PILOT_FAILED[0] = pilot.uid  # said by _interrupted_text, out of this handler
    else:
        _STOPPED_BY[0] = "a SIGTERM"
    raise KeyboardInterrupt(signal.Signals(signum).name)


_SESSION_PILOT = [None]  # returns the current session's pilot (for _terminated)
_SESSION_JOB = [None]    # (batch system, the pilot job's record) of the current session


def _interrupted_text():
    said = _stop_reason().get("text")
    return (_pilot_failed_text(_PILOT_FAILED[0]) if _PILOT_FAILED[0]
            else said if said
            else f"interrupted by {_STOPPED_BY[0]}; the pilot was cancelled")


_REASONS = [None]  # the read end of the parent's pipe of stop reasons
_REASON = {}       # the last reason read: {"kind": "failed" or "stopped", "text": ...}


def _stop_reason():
    """Why the parent stopped this process, as it said in the pipe (PilotProcess.stop):
    {} for a plain Ctrl-C or a death of the client."""
    fd = _REASONS[0]
    if fd is not None:
        os.set_blocking(fd, False)
        try:
            data = os.read(fd, 1 << 16)
        except (BlockingIOError, OSError):
            data = b""
        for line in data.decode(errors="replace").splitlines():
            try:
                _REASON.update(json.loads(line))
            except ValueError:
                pass
    return _REASON


def _pilot_failed_text(uid):
    """Why the pilot `uid` failed: a node of its batch job lost (asked of the batch
    system, so not inside a signal handler), or what RADICAL-Pilot's FAILED can mean.
    Asked of the batch system once per pilot and process (a cache that a forked child
    inherited from its parent once said another pilot's reason: keyed by pid too)."""
    key = (os.getpid(), uid, _SESSION_JOB[0])
    if key not in _FAILED_TEXTS:
        _FAILED_TEXTS[key] = _said_pilot_failed(uid)
    return _FAILED_TEXTS[key]


_FAILED_TEXTS = {}


def _said_pilot_failed(uid):
    lost = lost_nodes_text()
    if lost:
        return (f"the pilot {uid} failed: {lost}, and the batch system ended the job with it "
                "(`trajflow run --resume RUNDIR` with this run's --resource finishes it on a "
                "new pilot; on fewer nodes, give --cpus for what is left)")
    return (f"the pilot {uid} failed (RADICAL-Pilot: its job ended before the runs did: the "
            "walltime ran out, or the job was killed or could not start; the batch system's "
            "and RADICAL's logs are in the session folder)")


def lost_nodes_text():
    """'node X of its batch job J was lost', where this session's pilot job lost nodes."""
    return lost_nodes_of_job(*_SESSION_JOB[0]) if _SESSION_JOB[0] else ""


# A task whose MPI peer's node died exits (mpiexec's 255, or a signal) a few seconds
# before the batch system declares the node down (SlurmdTimeout, 10 s on the virtual
# cluster; seen: the outcome could not name the node). So long is waited for the
# batch system's word on such a failure, never on a task's own error (exit 1).
LOST_NODE_WAIT_S = 20
_LAUNCHER_EXITS = (255, 137, -9)  # mpiexec's own, or killed (SIGTERM is a stop: not waited)


def _lost_nodes_after(outcomes, wait_until):
    """lost_nodes_text() for a run that did not complete; waited for a little where a
    task failed for good as a peer's lost node ends it (see LOST_NODE_WAIT_S), once
    per batch: `wait_until` holds the batch's deadline once one run has waited."""
    lost = lost_nodes_text()
    if lost or not _SESSION_JOB[0] or not any(
            o.exit_code in _LAUNCHER_EXITS for o in failed_for_good(outcomes)):
        return lost
    if not wait_until:
        wait_until.append(time.time() + LOST_NODE_WAIT_S)
    while not lost and time.time() < wait_until[0]:
        time.sleep(2)
        lost = lost_nodes_text()
    return lost


def _test_start_delay():
    """Testing hooks: $TRAJFLOW_TEST_PILOT_START_DELAY_S (the first pilot of a child
    only) delays the pilot's bootstrap, as a start that hangs would;
    $TRAJFLOW_TEST_LOSE_FIRST_RPC=1 reaches the agent (tasks/agent_rpc.py)."""
    delay = os.environ.pop("TRAJFLOW_TEST_PILOT_START_DELAY_S", None)
    hooks = [f"sleep {float(delay):g}"] if delay else []
    if os.environ.get(LOSE_FIRST_SEND) == "1":
        hooks.append(f"export {LOSE_FIRST_SEND}=1")
    return [resources.pre_bootstrap_entry(hook) for hook in hooks]


_SEND_LOCK = threading.Lock()  # the child's threads share one pipe to the parent


def _send(conn, message):
    with _SEND_LOCK:
        conn.send(message)


def _empty_pipeline():
    """A held pilot's warm-up: one `/bin/true`, so that the pilot is active and its
    agent has launched a task before the first run comes."""
    import radical.entk as re
    task = re.Task()
    task.name = "warmup"
    task.executable = "/bin/true"
    task.cpu_reqs = {"cpu_processes": 1, "cpu_process_type": None, "cpu_threads": 1,
                     "cpu_thread_type": None}
    stage = re.Stage()
    stage.name = "warmup"
    stage.add_tasks(task)
    pipeline = re.Pipeline()
    pipeline.name = "warmup"
    pipeline.add_stages(stage)
    return pipeline


@dataclasses.dataclass
class _Batch:
    """Runs the parent sent together: its report goes once all of them have ended
    (a `close_after` batch's once the pilot is cancelled)."""
    id: int = 0
    requests: list = dataclasses.field(default_factory=list)
    one_at_a_time: bool = False   # each run's pipeline joins when the one before has ended
    close_after: bool = False     # the last batch: the pilot ends with it
    warmup: bool = False          # the held pilot's warm-up, an empty task
    t0: float = dataclasses.field(default_factory=time.time)
    waiting: list = dataclasses.field(default_factory=list)  # requests not started yet
    pipelines: dict = dataclasses.field(default_factory=dict)  # run name -> RunPipeline
    outcomes: list = dataclasses.field(default_factory=list)
    errors: dict = dataclasses.field(default_factory=dict)
    ended: set = dataclasses.field(default_factory=set)
    wait_until: list = dataclasses.field(default_factory=list)  # one wait for lost nodes

    @property
    def done(self):
        return len(self.ended) == len(self.requests) and not self.warmup


class _Runs:
    """The parent's runs on the session's pilot, on one live EnTK workflow.

    A batch's pipelines join the workflow the moment it arrives, beside the
    pipelines already running (a run never waits for another batch to end);
    each run is collected, its outcome written and the parent told, as its
    pipeline completes. The main thread runs EnTK (`serve`); the batches come
    on the receiver thread (`receive`). A pilot whose start hung is replaced
    once, with a new session, and the runs not ended start again on it."""

    def __init__(self, session, conn):
        self.session, self.conn = session, conn
        self.lock = threading.RLock()
        self.workflow = LiveWorkflow()
        self.batches = []      # not yet reported
        self.by_pipeline = {}  # EnTK pipeline uid -> (batch, request or None: a warm-up)
        self.lost = None       # why the pilot is gone, once EnTK gave up
        self.failed = None     # what ended the receiver thread, if something did
        self.cancels = {}      # run name -> why, of a cancel that came before its run
        self.closing = threading.Event()
        resource = session.pilot["resource"]
        python = resources.task_python(resource)
        self.command = (ServedTaskCommand if resources.agent_serves_tasks(resource)
                        else TaskCommand)(python)
        self.agent_env = resources.agent_environment(session.pilot["resource"])

    # --- the receiver thread -------------------------------------------------
    def receive(self):
        """The parent's messages: batches join the workflow; "close" (or the parent's
        end) closes it, and EnTK's run() then ends with the runs in it. A failure here
        (a full disk writing an outcome) ends the session with it, as a failure of the
        main thread's would: nothing would read the parent's messages any more."""
        try:
            while True:
                try:
                    kind, batch = self.conn.recv()
                except (EOFError, OSError):
                    kind, batch = "close", None
                if kind == "close":
                    self._close()
                    return
                if kind == "cancel":
                    self.cancel(*batch)
                    continue
                self.add(_Batch(warmup=True) if kind == "warmup" else _Batch(**batch))
        except BaseException as exc:  # noqa: the main thread raises it (serve)
            log.error("the runs' messages: %s: %s", type(exc).__name__, exc)
            with self.lock:  # (the workflow of now: _renew replaces it)
                self.failed = exc
                self.workflow.fail(exc)
            self.closing.set()

    def add(self, batch):
        with self.lock:
            self.batches.append(batch)
            if self.lost and not batch.warmup:  # EnTK gave up on the pilot: nothing runs
                self._fail_unfinished(self.lost, not_run=True, batches=[batch])
            elif batch.warmup:
                self._start_warmup(batch)
            else:
                for r in batch.requests:  # a later --resume finds this pilot here, should
                    record_session(r.plan.workdir, self.session.dir)  # its client die
                started = batch.requests[:1] if batch.one_at_a_time else batch.requests
                batch.waiting = list(batch.requests[len(started):])
                for r in started:
                    self._start(batch, r)
            if batch.close_after:
                self._close()

    def cancel(self, name, why):
        """Stop the run `name` (its client left): its tasks running now are cancelled,
        no stage follows; it ends as failed with `why`, resumable. A run not started
        yet (one at a time) ends at once."""
        with self.lock:
            for batch in list(self.batches):
                r = next((r for r in batch.requests if r.name == name), None)
                if r is None or name in batch.ended:
                    continue
                if r in batch.waiting:
                    batch.waiting.remove(r)
                    self._finish(batch, r, f"cancelled before it began: {why}")
                    self._report_if_done(batch)
                elif name in batch.pipelines:
                    uids = batch.pipelines[name].cancel(why)
                    if uids:
                        cancel_tasks(uids)
                log.info("%s: cancelled (%s)", name, why)
                return
            self.cancels[name] = why  # its batch is on its way (sent after the cancel)

    def _start_warmup(self, batch):
        pipeline = _empty_pipeline()
        self.by_pipeline[pipeline.uid] = (batch, None)
        self.workflow.add(pipeline)

    def _start(self, batch, r):
        if self.lost:
            batch.waiting.append(r)
            return
        if r.name in self.cancels:
            self._finish(batch, r, f"cancelled before it began: {self.cancels.pop(r.name)}")
            self._report_if_done(batch)
            return
        run = RunPipeline(r.plan, r.plan_path, self.command, r.name, r.retries,
                          remaining_specs(r.plan, r.plan_path) if r.resume else None,
                          {**self.agent_env, **(r.env or {})}, on_event=self._event(r.name))
        batch.pipelines[r.name] = run
        self.by_pipeline[run.pipeline.uid] = (batch, r)
        self.workflow.add(run.pipeline)

    def _event(self, run_name):  # called from EnTK's thread, which runs the stages' post_exec
        return lambda stage, kind, text: _send(self.conn, ("event", (run_name, stage, kind,
                                                                     text)))

    def _close(self):
        self.closing.set()
        self.workflow.close()

    # --- the main thread -----------------------------------------------------
    def serve(self):
        """Run EnTK until the workflow is closed and has ended; the ending to send."""
        while True:
            try:
                run_live(self.session.appman, self.workflow, self._completed)
                break
            except CompletionFailed as exc:  # trajflow's own collection (a full disk)
                raise exc.__cause__
            except Exception as exc:
                if _was_interrupted(exc):
                    self._record_interrupted()
                    raise
                hung = self.session.watch.hung
                if hung and not self.session.renewed:
                    _send(self.conn, ("event", ("pilot", None, "restarted",
                                                f"{hung}; starting another")))
                    self._renew()
                    continue
                self.lost = hung or f"EnTK failed: {type(exc).__name__}: {exc}"
                self._fail_unfinished(self.lost)
                break
        if self.lost and any(b.warmup for b in self.batches):
            raise RuntimeError(self.lost)  # the held pilot never came up
        while self.lost and not self.closing.wait(0.5):
            pass  # batches still coming are failed as they come, until "close"
        if self.failed is not None:
            raise self.failed
        return self._final_report()

    def _renew(self):
        """A new session, and the runs not ended start again on it (nothing of
        them had run on a pilot whose start hung)."""
        with self.lock:
            self.session.renew()
            self.workflow = LiveWorkflow()
            if self.closing.is_set():
                self.workflow.close()
            self.by_pipeline.clear()
            for batch in self.batches:
                if batch.warmup:
                    self._start_warmup(batch)
                    continue
                for r in batch.requests:
                    record_session(r.plan.workdir, self.session.dir)
                    old = batch.pipelines.get(r.name)
                    if old is None or r.name in batch.ended:
                        continue
                    if old.cancelled:  # nothing of it ran on the pilot that hung
                        self._finish(batch, r, f"cancelled before it began: {old.cancelled}")
                    else:
                        self._start(batch, r)
                self._report_if_done(batch)

    def _completed(self, pipeline):
        """EnTK's pipeline has completed (in EnTK's run(), this thread)."""
        with self.lock:
            batch, r = self.by_pipeline.pop(pipeline.uid)
        if r is None:
            with self.lock:
                self.batches.remove(batch)
            _send(self.conn, ("warm", None))
            return
        self._finish(batch, r)
        with self.lock:
            if batch.waiting and not self.lost:
                self._start(batch, batch.waiting.pop(0))
        self._report_if_done(batch)

    def _finish(self, batch, r, error=None):
        """One run has ended: its files collected, its outcome written, the parent told."""
        disk = full_disk_note(r.plan)  # before the partial files give space back
        remove_partial_files(r.plan)    # first: a full disk fails what follows
        run = batch.pipelines.get(r.name)
        done = collect(r.name, r.plan, run) if run is not None else []
        batch.outcomes += done
        if not error and run is not None and run.cancelled and run.stopped_at:
            error = f"cancelled: {run.cancelled}"  # (not where it ended whole meanwhile)
        if error:
            batch.errors[r.name] = error
        node = ("" if os.path.exists(r.plan.result_path())
                else _lost_nodes_after(done, batch.wait_until))
        write_outcome(r.plan, done, run.stopped_at if run else None, error,
                      "; ".join(filter(None, [disk, node])))
        with self.lock:  # said before its batch's report can be (_report_if_done)
            _send(self.conn, ("ended", (r.name, done)))
            batch.ended.add(r.name)

    def _fail_unfinished(self, why, not_run=False, batches=None):
        """EnTK gave up (and took the pilot): every run not ended (of `batches`, default
        all) ends with `why`."""
        with self.lock:
            for batch in [b for b in (batches or self.batches) if not b.warmup]:
                for r in batch.requests:
                    if r.name not in batch.ended:
                        started = r.name in batch.pipelines and not not_run
                        self._finish(batch, r, why if started else f"not run: {why}")
                batch.waiting.clear()
                self._report_if_done(batch)

    def _report_if_done(self, batch):
        if not batch.done or batch.close_after:  # the last batch's report goes at the end
            return
        with self.lock:
            if batch not in self.batches:
                return
            self.batches.remove(batch)
        _send(self.conn, ("report", (batch.id, self._report(batch))))

    def _report(self, batch):
        results = {}
        for r in batch.requests:
            path = r.plan.result_path()
            results[r.name] = path if os.path.exists(path) and r.name not in batch.errors \
                else None
        stopped = {name: run.stopped_at for name, run in batch.pipelines.items()}
        peak = getrusage(RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
        return RunReport(batch.outcomes, results, self.session.dir, time.time() - batch.t0,
                         stopped, peak, batch.errors)

    def _final_report(self):
        """("report", (id, report)) of a `close_after` batch, sent once the pilot is
        cancelled; else ("closed", None)."""
        with self.lock:
            last = [b for b in self.batches if b.close_after and b.done]
        return ("report", (last[0].id, self._report(last[0]))) if last else ("closed", None)

    def _record_interrupted(self):
        """Interrupted: the runs that had not ended say so on disk."""
        with self.lock:
            batches = [b for b in self.batches if not b.warmup]
        for batch in batches:
            for r in batch.requests:
                if r.name in batch.ended:
                    continue
                if os.path.exists(r.plan.result_path()):  # published before the interrupt
                    record_outcome(r.plan.workdir, "done", note=f"{_interrupted_text()} after "
                                   "the result was complete")
                else:
                    record_outcome(r.plan.workdir, "failed", _interrupted_text())

    def plans_in_flight(self):
        with self.lock:
            return [r.plan for b in self.batches if not b.warmup for r in b.requests
                    if r.name not in b.ended]
