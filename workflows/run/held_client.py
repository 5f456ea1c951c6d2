"""Held pilots from the client's side: start, status, stop, list, and `HeldPilot`,
which sends runs to one by name with the same submit/run API as `Pilot`.

    $ trajflow pilot start --name adk --cpus 2
    $ trajflow run PSF DCD --analysis rmsd --pilot adk        # warm: no pilot start

    >>> with trajflow.Pilot.attach("adk") as pilot:
    ...     run = pilot.run(PSF, DCD, "rmsd")

A run is planned and its folder written here, as for any pilot (bad input is
refused before the held pilot hears of it); the holder (held_holder.py) is
sent the plan's path and answers with the run's stage events and its end. A
built-in analysis from the command line (`submit_spec`) is planned by the holder
instead, which has MDAnalysis imported already: the client sends its RunSpec whole
and never imports MDAnalysis (half a second of each `trajflow run --pilot`).
"""
import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from trajflow.tasks.plan import is_finite_number, RunPlan
from trajflow.tasks.rundir import PLAN, record_handed_over, REPORT, withdraw_handover, write_text
from trajflow.workflows.errors import InputError, Interrupted, RunFailed
from trajflow.workflows.run.held_holder import HeldRequest
from trajflow.workflows.run.held_registry import (connect, held_elsewhere, held_names, HOLDER_MODULE, holder_alive,
                                                  is_refused, MAX_MESSAGE_BYTES,
                                                  plannable_there,
                                                  is_stale, LIST_HINT, LOG, Messages, pilot_folder,
                                                  read_record, remove_folder,
                                                  REQUEST, send)
from trajflow.workflows.run.pilot import Pilot, prepare_run
from trajflow.workflows.run.planning import check_outdir, default_out, fit_to_cores, resolve
from trajflow.workflows.run.progress import Progress
from trajflow.workflows.run.rundir_lock import RunLock
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.spec import on_command_line, RunSpec, split_options, takes_options

log = logging.getLogger(__name__)

DEFAULT_IDLE_MIN = 30.0
STOP_WAIT_S = 120.0  # the longest `pilot stop` waits for the holder to have ended


def _ask(name, message, timeout_s=10.0):
    """One request to the holder of `name` and its one answer; InputError where no
    pilot is held by that name (a stale folder is removed on the way)."""
    folder = pilot_folder(name)
    conn = _connect(name, folder, timeout_s)
    try:
        conn.settimeout(timeout_s)
        send(conn, message)
        return Messages(conn).receive()
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(f"the held pilot {name!r} did not answer ({exc}); "
                         f"{LIST_HINT}") from None
    finally:
        conn.close()


def _connect(name, folder, timeout_s=10.0):
    if not os.path.lexists(folder):
        raise InputError(f"no pilot named {name!r} is held: {LIST_HINT}; "
                         f"`trajflow pilot start --name {name}` holds one")
    try:
        return connect(folder, timeout_s)
    except OSError as exc:
        host = held_elsewhere(read_record(folder))
        if host:
            raise InputError(f"the held pilot {name!r} is held on {host}, not on this host "
                             f"({socket.gethostname()}), and only answers there: run the command "
                             f"on {host} (from a workstation: --remote USER@{host})") from None
        if is_refused(exc) and is_stale(folder):
            remove_folder(folder)
            raise InputError(f"the held pilot {name!r} has ended (its holder is gone; its "
                             f"folder was removed): {LIST_HINT}") from None
        raise InputError(f"the held pilot {name!r} cannot be reached ({exc}); "
                         f"{LIST_HINT}") from None


def held_status(name):
    """The held pilot's state: resource, cpus, runs running and queued, busy cores,
    walltime left, idle time."""
    return _ask(name, {"op": "status"})


def list_held():
    """The status of every held pilot; stale folders found on the way are removed."""
    found = []
    for name in held_names():
        try:
            found.append(held_status(name))
        except InputError as exc:
            record = read_record(pilot_folder(name))
            if record is not None and (held_elsewhere(record) or holder_alive(record["pid"])):
                found.append({**record, "error": str(exc)})  # starting, or busy answering
            else:
                log.info("%s", exc)
    return found


def start_held(name, pilot_spec, idle_timeout_min=DEFAULT_IDLE_MIN, progress=True):
    """Start a held pilot named `name` and wait until it is active; its status.
    InputError for bad options or a name held already; RuntimeError if its pilot
    does not start (the holder's log is quoted)."""
    if not is_finite_number(idle_timeout_min) or idle_timeout_min < 0:
        raise InputError(f"--idle-timeout {idle_timeout_min:g}: give minutes (a finite number "
                         ">= 0), 0 for none")
    checked = Pilot(progress=False, **dataclasses.asdict(pilot_spec)).spec  # cpus, resource
    if checked.path is None:
        checked = dataclasses.replace(checked, path=os.path.abspath(
            f"trajflow-pilot-{name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    folder = pilot_folder(name)
    _claim(name, folder)
    say = Progress(progress)
    holder = None
    try:
        write_text(os.path.join(folder, REQUEST),
                   json.dumps(HeldRequest(name, checked, 60.0 * idle_timeout_min).to_dict()))
        say.line(f"holding pilot {name}: {checked.cpus} cores on {checked.resource} for "
                 f"{checked.walltime} min (session in {checked.path}) ...")
        with os.fdopen(os.open(os.path.join(folder, LOG), os.O_WRONLY | os.O_APPEND
                               | os.O_CREAT | os.O_NOFOLLOW, 0o600), "ab") as out:
            holder = subprocess.Popen(
                [sys.executable, "-m", HOLDER_MODULE, folder],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True)
        status = _wait_active(name, folder, holder)
    except BaseException:
        if holder is not None:
            _end_holder(holder)
        remove_folder(folder)
        raise
    say.line(f"pilot {name} held ({status['cpus']} cores, {checked.resource}): "
             f"trajflow run ... --pilot {name}; trajflow pilot stop {name} ends it")
    say.close()
    return status


def _claim(name, folder):
    try:
        os.mkdir(folder, 0o700)
        return
    except FileExistsError:
        pass
    if not is_stale(folder):
        raise InputError(f"a pilot named {name!r} is held already: `trajflow pilot status "
                         f"{name}`; another name, or `trajflow pilot stop {name}` first")
    remove_folder(folder)
    os.mkdir(folder, 0o700)


def _wait_active(name, folder, holder):
    while True:
        record = read_record(folder)
        if record is not None and record["state"] == "active":
            return held_status(name)
        if record is not None and record["state"] == "failed":
            raise RuntimeError(f"pilot {name}: {record['error']}{_log_tail(folder)}")
        if holder.poll() is not None:
            raise RuntimeError(f"pilot {name}: its holder ended (exit code {holder.returncode}) "
                               f"before the pilot was active{_log_tail(folder)}")
        time.sleep(0.2)


def _end_holder(holder):
    """A holder whose start was cut short (Ctrl-C, a failure): SIGTERM (it cancels the
    pilot's start in order), then SIGKILL; a second Ctrl-C does not leave it running."""
    if holder.poll() is None:
        holder.send_signal(signal.SIGTERM)
        deadline = time.time() + 90
        while holder.poll() is None and time.time() < deadline:
            try:
                holder.wait(1)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                pass
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def _log_tail(folder, n=12):
    try:
        with open(os.path.join(folder, LOG), errors="replace") as fh:
            lines = fh.read().splitlines()[-n:]
    except OSError:
        return ""
    return "\n  " + "\n  ".join(lines) if lines else ""


def stop_held(name, wait_s=STOP_WAIT_S):
    """Stop the held pilot `name` (runs in flight end as interrupted and can be resumed)
    and wait until its holder has ended; its last status."""
    status = held_status(name)
    _ask(name, {"op": "stop"})
    deadline = time.time() + wait_s
    folder = pilot_folder(name)
    while holder_alive(status["pid"]) and time.time() < deadline:
        time.sleep(0.2)
    if holder_alive(status["pid"]):
        raise RuntimeError(f"the held pilot {name!r} (holder pid {status['pid']}) did not end "
                           f"within {wait_s:.0f} s; kill {status['pid']}")
    remove_folder(folder)  # gone with its holder, or left by one that was killed
    return status


class HeldRunFuture(concurrent.futures.Future):
    """A run sent to a held pilot: as RunFuture (`.result()`, `.path`)."""

    def __init__(self, plan, conn):
        super().__init__()
        self.plan = plan
        self.path = plan.workdir
        self.name = os.path.basename(plan.workdir)
        self.conn = conn
        self.report = None     # report.html, once the holder has written it
        self.report_due = None  # report.html, which the holder draws after the result
        self.messages = None   # the connection's reader, where one has begun reading it
        self.followed = None   # the thread that hears the holder on this run
        self.cancelled_there = False  # the holder cancelled it before it began
        self.ended_there = False      # the holder said how it ended

    def cancel(self):
        """Hang up: the holder cancels the run if it has not begun there. False: whether
        it had is told by .result() (Interrupted "cancelled before it began", or the run)."""
        self.hang_up()
        return False

    def hang_up(self):
        """Leave the run: cancelled by the holder if it has not begun."""
        try:
            self.conn.shutdown(2)
        except OSError:
            pass


class HeldPilot:
    """A held pilot, attached by name (`trajflow pilot start --name NAME`): the same
    submit/run API as Pilot. Leaving the `with` block waits for the runs sent;
    the pilot stays held (`trajflow pilot stop NAME` ends it). Ctrl-C cancels
    this client's runs that have not begun; a begun run goes on to its end.

    Examples
    --------
    $ trajflow pilot start --name adk --cpus 2

    >>> with trajflow.Pilot.attach("adk") as pilot:      # no pilot start: it is warm
    ...     rmsd = pilot.submit(PSF, DCD, "rmsd")
    ...     dih = pilot.submit(PSF, DCD, "dihedrals", mode="tasks")
    ...     print(rmsd.result().results.rmsd[-1], dih.result().results.features.shape)
    >>> trajflow.run(PSF, DCD, "rmsd", pilot="adk")        # the same, by name
    """

    def __init__(self, name, progress=True):
        self.name = name
        status = held_status(name)
        if status["state"] != "active":
            raise InputError(f"the held pilot {name!r} is {status['state']}: {LIST_HINT}")
        self.resource, self.cpus = status["resource"], status["cpus"]
        self.walltime = status["walltime"]
        self.session_dir = status["session_dir"]
        self._progress = Progress(progress)
        self._futures = []

    def __repr__(self):
        return f"<trajflow.HeldPilot {self.name} {self.resource} {self.cpus} cpus>"

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.abort()
        elif exc_type is not None:
            self._hang_up()
        else:
            self.close()

    @takes_options(RunSpec, skip=("topology", "trajectory", "analysis"))
    def submit(self, topology, trajectory, analysis, **options) -> HeldRunFuture:
        """Plan a run and send it to the held pilot; returns at once (as Pilot.submit)."""
        spec = RunSpec(topology=topology, trajectory=trajectory, analysis=analysis,
                       **split_options(options, RunSpec)[0])
        return self.submit_plan(resolve(spec, cores=self.cpus), spec)

    def run(self, topology, trajectory, analysis, **kwargs) -> Run:
        """Run on the held pilot and wait: the Run, or RunFailed / Interrupted."""
        return self.submit(topology, trajectory, analysis, **kwargs).result()

    def submit_plan(self, plan, spec=None, resume=False) -> HeldRunFuture:
        """Send a plan made (not yet written) to the held pilot (as Pilot.submit_plan)."""
        spec = spec or RunSpec()
        plan = fit_to_cores(plan, self.cpus)
        conn = _connect(self.name, pilot_folder(self.name))  # before anything is written
        try:
            path = prepare_run(plan, resume, self._progress.line)
            future = HeldRunFuture(plan, conn)
            if plan.lock is not None:
                plan.lock.say_taken_over(self._progress.line)
                record_handed_over(plan.workdir)  # "interrupted" until it says how it ended
            self._send(future, path, spec, resume)
        except BaseException:
            conn.close()
            if plan.lock is not None:
                withdraw_handover(plan.workdir)
                plan.lock.release()
            raise
        return future

    def submit_written(self, plan, path, spec=None, resume=False) -> HeldRunFuture:
        """A plan written already (a campaign's experiments) to the held pilot."""
        spec = spec or RunSpec()
        future = HeldRunFuture(plan, _connect(self.name, pilot_folder(self.name)))
        try:
            self._send(future, path, spec, resume)
        except BaseException:
            future.conn.close()
            raise
        return future

    def submit_spec(self, spec, asked_at=None) -> HeldRunFuture:
        """A new run of a built-in analysis, planned by the holder (InputError for bad
        input, as make_plan's, with its folder gone again); returns once it is planned.
        Its folder is locked here first, and the lock goes with the request."""
        if not can_plan_there(spec):
            raise ValueError("a held pilot plans new runs of built-in analyses only")
        asked_at = time.time() if asked_at is None else asked_at
        out = os.path.abspath(spec.out if spec.out is not None else default_out(spec.analysis))
        spec = dataclasses.replace(spec, out=out, topology=os.path.abspath(spec.topology),
                                   trajectory=[os.path.abspath(t) for t in spec.trajectory])
        lock = RunLock(check_outdir(out)).acquire()  # before anything is read or written
        conn = messages = None
        try:
            conn = _connect(self.name, pilot_folder(self.name))
            _send_with_lock(conn, {"op": "run", "spec": json.loads(spec.to_json()),
                                   "asked_at": asked_at, "command_line": on_command_line(),
                                   "retries": spec.retries,
                                   "env": {**testing_hooks(), **(spec.env or {})},
                                   "resume": False}, lock)
            messages = Messages(conn)  # the run's one reader: it buffers the lines after
            answer = messages.receive()
            if "planned" not in answer:
                raise InputError(answer.get("invalid") or f"the held pilot {self.name} refused "
                                 f"the run: {answer.get('refused', answer)}")
            if answer["planned"] != os.path.join(out, PLAN):
                raise ValueError(f"it answered with another plan, {answer['planned']!r:.200}")
            plan = RunPlan.load(answer["planned"])
        except BaseException as exc:  # refused, or broken off: no folder left for nothing
            if messages is not None:
                messages.close()
            if conn is not None:
                conn.close()
            lock.release(remove_dir=True)  # only while empty: a plan written there stays
            if isinstance(exc, (OSError, EOFError, ValueError)):  # the holder broke off
                raise InputError(f"the held pilot {self.name!r} did not plan the run ({exc}); "
                                 f"{LIST_HINT}") from None
            raise
        plan.lock = lock
        lock.say_taken_over(self._progress.line)
        future = HeldRunFuture(plan, conn)
        future.messages = messages
        self._follow_in_thread(future, spec)
        return future

    def _send(self, future, path, spec, resume):
        """The request, with the folder's lock passed along (SCM_RIGHTS): the holder keeps
        the folder locked while the run goes on there, whatever becomes of this process."""
        _send_with_lock(future.conn, {"op": "run", "plan": path, "retries": spec.retries,
                                      "env": {**testing_hooks(), **(spec.env or {})},
                                      "resume": resume}, future.plan.lock)
        self._follow_in_thread(future, spec)

    def _follow_in_thread(self, future, spec):
        self._futures.append(future)
        future.followed = threading.Thread(target=self._follow, args=(future, spec),
                                           daemon=True, name="trajflow-held-run")
        future.followed.start()

    def _follow(self, future, spec):
        """The holder's word on one run, until its end (the run's report written); then the
        folder's lock is let go (the holder has let go of its own)."""
        messages = future.messages or Messages(future.conn)
        plan, say = future.plan, spec.progress
        try:
            while True:
                message = messages.receive()
                if "event" in message and say:
                    self._progress.stage(future.name, plan, *message["event"][:3])
                elif "submitted" in message:
                    future.set_running_or_notify_cancel()
                    if say:
                        self._progress.line(f"{future.name}: sent to held pilot {self.name} "
                                            f"({plan.analysis}, {plan.io}/{plan.mode}, "
                                            f"{plan.n_blocks} blocks) -> {plan.workdir}")
                elif "refused" in message:
                    future.ended_there = future.cancelled_there = True  # it never began
                    future.set_exception(InputError(f"the held pilot {self.name} refused the "
                                                    f"run: {message['refused']}"))
                    return
                elif "done" in message:
                    self._ended(future, message["done"])
                elif "report" in message:  # written by the holder once the result was given
                    future.report = message["report"]
                    return
        except BaseException as exc:  # noqa: the future is resolved whatever happened
            if not future.done():
                run = Run(plan.workdir, trust=True)
                if run.ok:
                    future.set_result(run)
                else:
                    future.set_exception(RunFailed(
                        f"run {future.name}: the held pilot {self.name} ended before the run "
                        f"did ({type(exc).__name__}: {exc}); `trajflow run --resume "
                        f"{shlex.quote(plan.workdir)}` goes on", run=run))
        finally:
            messages.close()
            future.conn.close()
            if plan.lock is not None:
                if future.cancelled_there:  # it never began: nothing was interrupted
                    withdraw_handover(plan.workdir)
                if future.ended_there:
                    plan.lock.release()
                else:  # it goes on in the holder, which keeps the folder locked till its end
                    plan.lock.let_go()

    def _ended(self, future, ended):
        future.ended_there = True
        future.cancelled_there = bool(ended.get("cancelled"))
        if not future.cancelled_there:  # (said before the result: waiters read it then)
            future.report_due = future.plan.path(REPORT)
        run = Run(future.plan.workdir, trust=True)
        if ended.get("ok") and run.ok:
            self._progress.line(f"{future.name}: done -> {run.result_path}")
            future.set_result(run)
        elif ended.get("interrupted"):
            future.set_exception(Interrupted(str(ended.get("error"))))
        else:
            self._progress.line(f"{future.name}: FAILED")
            future.set_exception(RunFailed(str(ended.get("error") or "the run did not complete"),
                                           run=run))

    def close(self, wait=True):
        """Detach: with `wait`, once the runs sent have ended (their results in; each one's
        report.html follows, drawn by the holder: `future.followed` ends when it is
        written). The pilot stays held."""
        if wait:
            try:
                for future in list(self._futures):
                    while not future.done() and future.followed.is_alive():  # polled: a
                        future.followed.join(0.2)                            # Ctrl-C is seen
            except KeyboardInterrupt:
                self.abort()
            self._progress.close()

    def abort(self, why="interrupted"):
        """Leave every run sent: the held pilot cancels those that had not begun, and stops
        those that had (their running tasks cancelled); Interrupted is raised."""
        sent = self._hang_up()
        self._progress.close()
        said = (f"; {len(sent)} run(s) sent to the held pilot {self.name}: cancelled there, "
                "their running tasks ended (`trajflow run --resume RUNDIR` goes on; their "
                f"folders say how they ended): {', '.join(f.path for f in sent)}" if sent else "")
        raise Interrupted(f"{why}{said}")

    def _hang_up(self):
        sent = [f for f in self._futures if not f.done()]
        for future in sent:
            future.hang_up()
        return sent


def _send_with_lock(conn, message, lock):
    """One request line, with the run folder's lock descriptor where there is one."""
    line = (json.dumps(message) + "\n").encode()
    if lock is not None and lock.fd is not None:
        sent = socket.send_fds(conn, [line], [lock.fd])
        if sent < len(line):  # (an empty send to a holder that has answered and hung up
            conn.sendall(line[sent:])  # fails with EPIPE: seen, when it refused at once)
    else:
        conn.sendall(line)


def can_plan_there(spec, status=None) -> bool:
    """Whether a held pilot (of `status`, if given: one started by an older trajflow
    plans nothing) can plan `spec`: a new run of a built-in analysis whose request fits
    one message (a user's analysis is loaded and tried here, where its code is)."""
    return ((status is None or bool(status.get("plans_runs")))
            and plannable_there(spec.analysis, spec.args) and not spec.missing() and all(spec.trajectory)
            and len(spec.to_json()) < MAX_MESSAGE_BYTES // 2)


def testing_hooks():
    """What of this process's environment goes with a run to the held pilot (whose tasks
    would otherwise see its holder's): the documented testing hooks ($TRAJFLOW_TEST_*)
    and PYTHONPATH, where a `module:NAME` analysis is found."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("TRAJFLOW_TEST_") or k == "PYTHONPATH"}


@contextlib.contextmanager
def pilot_given(pilot, progress=True):
    """`pilot` as run(), resume() and Backend take it: a Pilot or HeldPilot as it is, or a
    held pilot's name, attached for the block."""
    if not isinstance(pilot, str):
        yield pilot
        return
    with HeldPilot(pilot, progress=progress) as held:
        yield held


def attach(name, progress=True) -> HeldPilot:
    """The held pilot `name` (`trajflow pilot start --name NAME`), to send runs to."""
    return HeldPilot(name, progress=progress)

