"""Runs on a pilot: the parent's side of the process that holds it.

PilotProcess forks the process holding EnTK's AppManager and the pilot
(session.py) into a session of its own and hands it batches of runs, which
run side by side as they come;
`run_plans` is the one-call form campaigns and benchmarks use. How each task
ended is told by outcomes.py.
"""
import dataclasses
import glob
import json
import logging
import multiprocessing
import os
import signal
import threading
import time

from trajflow.tasks import procfs
from trajflow.tasks.client_guard import ENDED, FIRING
from trajflow.tasks.rundir import OUTCOME, outcome_said, record_outcome
from trajflow.workflows.errors import Interrupted
from trajflow.workflows.run import resources, signals
from trajflow.workflows.run.entk_client import reap_local_tasks
from trajflow.workflows.run.heartbeat import cancel_orphans, DEFAULT_CLIENT_TIMEOUT_S
from trajflow.workflows.run.outcomes import remove_partial_files
from trajflow.workflows.run.session import serve, SHUTDOWN_LIMIT_S
from trajflow.workflows.run.watchdog import bounds, Watchdog

log = logging.getLogger(__name__)

WATCH_EVERY_S = 0.5  # the watchdog is asked this often while the child says nothing


def run_plans(runs, pilot, session_root=None, retries=1, resume=False, envs=None,
              one_at_a_time=False, on_run_ended=None, on_event=None):
    """Run [(name, plan, plan_path)] as pipelines on one pilot of `pilot` (a PilotSpec
    with its cpus: its description, client guard and limits); return a RunReport.

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
    """
    t0 = time.time()
    if resume:  # a pilot of these runs whose client died must not run beside this one
        for _name, plan, _path in runs:
            cancel_orphans(plan.workdir, log.warning)
            remove_partial_files(plan)
    requests = [RunRequest(name, plan, path, retries, resume, (envs or {}).get(name))
                for name, plan, path in runs]
    process = PilotProcess(pilot.description(), session_root or runs[0][1].workdir,
                           on_event=on_event, client_timeout=pilot.client_timeout,
                           limits=pilot.limits)
    with process:
        report = process.run_batch(requests, one_at_a_time, close_after=True,
                                   on_run_ended=lambda name, _outcomes: on_run_ended
                                   and on_run_ended(name))
    report.wall_s = time.time() - t0  # the pilot's shutdown included
    return report


def tell_run_ended(on_run_ended, name, outcomes):
    """on_run_ended(name, outcomes), whose failure is logged, never raised: the pilot
    still runs other runs, and must never be left behind."""
    try:
        on_run_ended(name, outcomes)
    except Exception as exc:  # noqa: see above
        log.error("after run %s: %s: %s", name, type(exc).__name__, exc)


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
    While it waits for the child, a Watchdog (watchdog.py) bounds every phase
    (`limits`, 'NAME=S,...'): a phase past its bound stops the child, and the
    runs fail with what was waited for.

        with PilotProcess(desc, "/scratch/runs") as pilot:
            first = pilot.run_batch([RunRequest("rmsd", plan, path)])
            second = pilot.run_batch([RunRequest("dih", plan2, path2)])
    """

    def __init__(self, pilot, session_root, on_event=None,
                 client_timeout=DEFAULT_CLIENT_TIMEOUT_S, keep_sandbox=False, limits=""):
        self.pilot = pilot                  # the RADICAL-Pilot description
        self.session_root = os.path.abspath(session_root)
        self.client_timeout = client_timeout  # s; 0: the pilot may outlive this process
        self.keep_sandbox = keep_sandbox
        self.bounds = bounds(limits)
        self.on_event = on_event or (lambda run, stage, kind, text: None)
        self.session_dir = None
        self.watchdog = None
        self._child = self._conn = self._reasons = None
        # the reasons pipe is written and closed from more than one thread (an interrupt in
        # the main thread, the watchdog's or the dispatcher's failure): closed twice, the
        # second close hit a closed fd (EBADF seen in CI) or, reused, someone else's
        self._reasons_lock = threading.Lock()
        self._plans = {}  # run name -> plan, of the runs sent and not ended
        self._failure = None  # (kind, text) of the stop asked of the child, if one was
        self._batch_t0 = time.time()  # since when the runs in flight have been sent
        self._batches = 0     # batches sent
        self._checked_at = 0.0  # when the watchdog was last asked (_receive)
        self._reaper = None   # the pid of the child's reaper process (session.py)
        self._send_lock = threading.Lock()

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
        reasons, self._reasons = os.pipe()
        self._child = ctx.Process(target=serve, name="trajflow-pilot",
                                  args=(child_end, self.pilot, self.session_root, self._conn,
                                        os.getpid(), self.client_timeout, self.keep_sandbox,
                                        self.bounds, reasons))
        self._child.start()
        child_end.close()
        os.close(reasons)
        self.watchdog = Watchdog(self.bounds, self.session_root, self._child.pid)

    @property
    def alive(self):
        return self._child is not None and self._child.is_alive()

    def warm_up(self):
        """Request the pilot now and wait until it is active and has run one empty task
        (a held pilot's start); its phases watched as a batch's are."""
        self._conn.send(("warmup", None))
        self._batch_t0 = time.time()
        self.watchdog.pilot_event("batch")
        try:
            while self._receive()[0] != "warm":
                pass
        except KeyboardInterrupt:
            self.interrupt()

    def send_batch(self, requests, one_at_a_time=False, close_after=False):
        """Hand runs to the child: they start at once, beside the runs already there
        (`one_at_a_time`: each when the one before it has ended). `close_after`: the
        last batch; the pilot is cancelled once every run sent has ended. The batch's
        id, which its report (next_message) carries."""
        self._batches += 1
        if not self._plans:  # what the runs in flight record from now on is theirs
            self._batch_t0 = time.time()
        with self._send_lock:  # (a cancel comes from another thread)
            self._conn.send(("batch", dict(id=self._batches, requests=requests,
                                           one_at_a_time=one_at_a_time,
                                           close_after=close_after)))
        self._plans.update({r.name: r.plan for r in requests})
        self.watchdog.pilot_event("batch")
        if one_at_a_time:
            self.watchdog.one_at_a_time([r.name for r in requests])
        return self._batches

    def cancel_run(self, name, why):
        """Stop the run `name` on the pilot (its client left): its running tasks are
        cancelled, and it ends, failed with `why` and resumable, as any run does (an
        "ended" message). The other runs go on."""
        with self._send_lock:
            self._conn.send(("cancel", (name, why)))

    def next_message(self, timeout=None):
        """The child's next word of a run, or None after `timeout` s without one:
        ("ended", (run name, outcomes)) as each run ends, ("report", (batch id,
        RunReport)) as each batch has. Its failures are raised (see _receive)."""
        message = self._receive(timeout)
        if message is not None and message[0] == "ended":
            self._plans.pop(message[1][0], None)
            self.watchdog.run_ended(message[1][0])
        return message

    def run_batch(self, requests, one_at_a_time=False, close_after=False, on_run_ended=None):
        """Run the requests side by side (or `one_at_a_time`) and wait; a RunReport.

        `on_run_ended(name, outcomes)` as each run ends. `close_after`: the
        pilot is shut down as soon as the batch has ended, overlapping the
        callbacks still running here.
        """
        batch = self.send_batch(requests, one_at_a_time, close_after)
        try:
            while True:
                kind, payload = self.next_message()
                if kind == "ended" and on_run_ended is not None:
                    tell_run_ended(on_run_ended, *payload)
                elif kind == "report" and payload[0] == batch:
                    if close_after:
                        self._join()
                    return payload[1]
        except KeyboardInterrupt:
            self.interrupt()

    def _receive(self, timeout=None):
        """The child's next message (None after `timeout` s without one); events go to
        on_event; its failures raised here. While none comes, the watchdog is asked
        whether a phase is past its bound."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                while not self._conn.poll(0.5 if deadline is None
                                          else max(0.0, min(0.5, deadline - time.monotonic()))):
                    if not self._child.is_alive():
                        raise EOFError
                    if time.monotonic() - self._checked_at >= WATCH_EVERY_S:
                        self._checked_at = time.monotonic()
                        failure = self.watchdog.check()
                        if failure and not self._conn.poll(0):  # what came first is heard first
                            self.stop(failure)
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                kind, payload = self._conn.recv()
            except EOFError:  # the child is gone without a word
                self._join()
                code = self._child.exitcode
                how = (f"killed by signal {-code}" if code is not None and code < 0
                       else f"exit code {code}")
                guard = _guard_ended(self.session_dir)
                raise RuntimeError(f"the process holding the pilot ended unexpectedly ({how})"
                                   + (f"; the pilot's guard had ended the pilot: {guard}"
                                      if guard else "")
                                   + f"; see the RADICAL session folder {self.session_dir or ''}"
                                   + _session_log_tail(self.session_dir))
            if kind == "event":
                self._watch(*payload)
                self.on_event(*payload)
            elif kind == "phase":
                self.watchdog.pilot_event(payload)
            elif kind == "session":
                self.session_dir = payload
            elif kind == "reaper":
                self._reaper = payload
            elif kind == "interrupted":
                self._join()
                raise Interrupted(payload)
            elif kind == "error":
                self._join()
                raise RuntimeError(payload)
            else:
                return kind, payload

    def _watch(self, run, stage, kind, text):
        if run == "pilot":
            self.watchdog.pilot_event(kind)
        else:
            self.watchdog.run_event(run, self._plans.get(run), stage, kind)

    def interrupt(self, why="interrupted"):
        """Cancel the pilot now (its running tasks end), and raise Interrupted, saying
        which signal stopped the run and who sent it, where that is known (or `why`, an
        exception in the caller's `with` block)."""
        said = signals.describe_stop() if why == "interrupted" else why
        text = f"{said}; the pilot was cancelled"
        if self.alive:
            log.warning("%s; cancelling the pilot (Ctrl-C again to give up waiting)", why)
            self._tell_child("stopped", text)
            self._join()
        raise Interrupted(text)

    def stop(self, failure):
        """A phase is past its bound: say so, stop the child (the pilot cancelled in
        order, its runs' outcomes recorded as failed with `failure`) and raise
        RuntimeError(failure); the runs can be resumed."""
        log.error("%s; cancelling the pilot", failure)
        self._tell_child("failed", failure)
        self._join()
        raise RuntimeError(failure)

    def _tell_child(self, kind, text):
        """The reason first (the child reads it when its SIGINT arrives), then SIGINT."""
        with self._reasons_lock:
            try:
                if self._reasons is None:
                    raise OSError("the pipe is closed")
                os.set_blocking(self._reasons, False)  # never wait on a child that reads nothing
                os.write(self._reasons,
                         (json.dumps({"kind": kind, "text": text}) + "\n").encode())
            except OSError:
                pass
        self._failure = (kind, text)
        try:
            os.kill(self._child.pid, signal.SIGINT)
        except ProcessLookupError:
            pass  # it ended meanwhile: _join finds out

    def close(self):
        """Cancel the pilot (after the batches sent have ended) and end the child."""
        if self.alive:
            try:
                with self._send_lock:
                    self._conn.send(("close", None))
                while self._receive()[0] != "closed":
                    pass
            except (BrokenPipeError, EOFError):
                pass
            self._join()

    def _join(self, grace_s=30.0):
        """Wait for the child (its shutdown is bounded: SHUTDOWN_LIMIT_S), then end
        whatever of its process group is left (RADICAL's client components):
        the group is the child's own session, never this process's. A child that
        does not end in time (stopped by SIGSTOP, hung below Python) is killed,
        and what it would have done at its end is done here."""
        deadline = time.time() + SHUTDOWN_LIMIT_S + grace_s
        while self._child.is_alive() and time.time() < deadline:
            # polled: join(timeout) waits on a pipe the child can close before it ends
            # (seen: join returned after 14 s of a child that was still stopping)
            self._child.join(0.5)
            time.sleep(0.1)
        if self._child.is_alive():
            self._kill_child()
        with self._reasons_lock:
            if self._reasons is not None:
                os.close(self._reasons)
                self._reasons = None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._child.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            if procfs.group_ended(self._child.pid, patience_s=1.0):
                break
        if self._reaper is not None:  # it ends once it has seen the child's end (~0.1 s)
            procfs.group_ended(self._reaper, patience_s=5.0)

    def _kill_child(self):
        """The child did not end when asked: kill its group (RADICAL's client with it),
        end a local pilot's tasks (stopped ones too), and record the runs it had as
        failed, their partial files removed."""
        why = (self._failure[1] if self._failure else "stopped")
        plans, self._plans = dict(self._plans), {}  # once, should two threads get here
        log.error("the process holding the pilot (pid %d) did not stop within %.0f s "
                  "(stopped or hung); it is killed", self._child.pid, SHUTDOWN_LIMIT_S)
        try:
            os.killpg(self._child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._child.join(10)
        if self.session_dir and resources.is_local(self.pilot["resource"]):
            reap_local_tasks(os.path.basename(self.session_dir))
        for plan in plans.values():
            remove_partial_files(plan)
            outcome = plan.path(OUTCOME)
            if os.path.exists(plan.result_path()) or (
                    outcome_said(plan.workdir) and os.path.getmtime(outcome) >= self._batch_t0):
                continue  # it ended, and said so, before the child was killed
            try:
                record_outcome(plan.workdir, "failed", f"{why}; the process holding the pilot "
                               "did not stop and was killed")
            except OSError as exc:  # a full disk: the failure is raised all the same
                log.error("%s: outcome.json not written: %s", plan.workdir, exc)


def _guard_ended(session_dir):
    """Why the pilot's guard ended (or is ending) the pilot, from its records, or "" if it
    did not: a client stopped longer than --client-timeout (a suspended laptop) is one."""
    for name in (ENDED, FIRING):
        try:
            with open(os.path.join(session_dir or "", name), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        return record.get("reason", "") if record.get("fired", True) else ""
    return ""


def _session_log_tail(session_dir, n=10):
    """The last lines of the session's most recently written log, for a report."""
    logs = glob.glob(os.path.join(session_dir or "", "*.log"))
    if not logs:
        return ""
    latest = max(logs, key=os.path.getmtime)
    with open(latest, errors="replace") as fh:
        tail = fh.read().splitlines()[-n:]
    return f"\nlast lines of {latest}:\n  " + "\n  ".join(tail)
