"""The process that holds a named pilot (`trajflow pilot start`), and serves its runs.

It is started detached (a session of its own, its output in the pilot's
holder.log), holds one `Pilot` (pilot.py), and answers on its Unix socket
(held_registry.py): "status", "stop", and "run" (a plan its client wrote, or a
built-in analysis' RunSpec that it plans itself, into a folder whose lock the client
holds). Each run's stage events go back on the run's
connection as they happen, then how it ended. A client that hangs up before
its run began (Ctrl-C) has its run cancelled.

It ends at `trajflow pilot stop`, at SIGTERM or SIGHUP, when its pilot ends
(the walltime, a lost job), or after its idle time; then its runs still in
flight end as interrupted (resumable), its pilot is cancelled, and its folder
is removed. If it is killed, the pilot's guard ends the pilot (its client is
gone) and the next `trajflow pilot` command finds the folder stale.

    python -m trajflow.workflows.run.held_holder FOLDER
"""
import concurrent.futures
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time

from trajflow.tasks.plan import is_finite_number, PlanError, RunPlan
from trajflow.tasks.rundir import read_record as read_plain, record_handed_over, withdraw_handover
from trajflow.workflows.errors import InputError, Interrupted, RunFailed
from trajflow.workflows.run.held_registry import (check_private, listen, MAX_MESSAGE_BYTES,
                                                  Messages, plannable_there, read_record,
                                                  remove_folder, REQUEST,
                                                  send, write_record)
from trajflow.workflows.run.pilot import Pilot
from trajflow.workflows.run.report_drawer import ReportDrawer
from trajflow.workflows.run.rundir_lock import remove_handed_lock
from trajflow.workflows.run.planning import resolve, write_plan
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.spec import command_line, PilotSpec, RunSpec

log = logging.getLogger(__name__)

POLL_S = 0.5
# a run reaches a held pilot planned and written (no submit of a script's is being planned
# here), and joins the runs on it as it comes (entk_client.LiveWorkflow): each is handed
# over at once (a 0.05 s wait to join runs sent together into one batch was measured in
# every run's latency)
HELD_COALESCE_S = 0.0
CLIENTS_JOIN_S = 10.0  # at the end, the longest each client's thread is waited for
# the longest a run's report is waited for from the drawer (nice +10: a pilot's long run on
# every core slows it) before the holder draws it itself; the folder is locked meanwhile
REPORT_WAIT_S = 300.0


@dataclasses.dataclass
class HeldRequest:
    """What `trajflow pilot start` asks its holder for (start.json)."""
    name: str
    pilot: PilotSpec
    idle_timeout_s: float

    def to_dict(self):
        return {"name": self.name, "pilot": dataclasses.asdict(self.pilot),
                "idle_timeout_s": self.idle_timeout_s}

    @classmethod
    def from_dict(cls, record):
        if not isinstance(record, dict) or not isinstance(record.get("pilot"), dict) \
                or not isinstance(record.get("name"), str) \
                or not isinstance(record.get("idle_timeout_s"), (int, float)):
            raise InputError("not a held pilot's start request")
        return cls(record["name"], PilotSpec(**record["pilot"]), float(record["idle_timeout_s"]))


class Holder:
    """One held pilot and the connections of its clients."""

    def __init__(self, folder, request: HeldRequest):
        self.folder = folder
        self.request = request
        self.pilot = Pilot(progress=True, reports=False, **dataclasses.asdict(request.pilot))
        self.pilot.coalesce_s = HELD_COALESCE_S
        self.started = time.time()
        self.last_busy = time.time()
        self.stopping = threading.Event()
        self.why = None
        self.state = "starting"
        self.error = None
        self.clients = []  # the threads serving clients
        self.drawer = None  # its runs' reports' ReportDrawer, once the pilot is active

    # --- lifetime --------------------------------------------------------------
    def serve(self):
        """Hold the pilot until asked to stop; the exit code."""
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._signalled)
        server = listen(self.folder)
        # a forked child (the process holding the pilot, RADICAL's) must not keep the
        # socket listening: once this process is gone, a client would wait on it for ever
        os.register_at_fork(after_in_child=server.close)
        self._record()
        threading.Thread(target=self._accept, args=(server,), daemon=True,
                         name="trajflow-held-accept").start()
        try:
            self.pilot.start()
        except (Exception, Interrupted, KeyboardInterrupt) as exc:
            self.state, self.error = "failed", f"the pilot did not start: {exc}"
            log.error("%s", self.error)
            self._record()
            server.close()
            return 1
        # its walltime and idle time count from now, not from its request (a batch queue's
        # wait can be hours)
        self.started = self.last_busy = time.time()
        # before it is said active (its runs' reports); from this thread, which lives as
        # long as the holder (the drawer's death signal follows the thread that started it)
        self.drawer = _start_drawer(self.folder)
        self.state = "active"
        self._record()
        log.info("held pilot %s active: %s cores on %s", self.request.name, self.pilot.cpus,
                 self.pilot.resource)
        # the runs it plans need MDAnalysis: imported now, once (not before the pilot's
        # process is forked: a fork amid an import leaves the child that module's lock)
        try:
            importlib.import_module("MDAnalysis")
        except Exception as exc:  # noqa: planning will say it; the pilot must still end
            log.error("MDAnalysis could not be imported: %s: %s", type(exc).__name__, exc)
        self._watch()
        self.state = "stopping"
        self._record()
        log.info("held pilot %s stops: %s", self.request.name, self.why)
        self._end_pilot()
        server.close()
        for thread in list(self.clients):  # each client hears how its run ended
            thread.join(CLIENTS_JOIN_S)
        if self.drawer is not None:  # after the clients: it draws their last reports
            self.drawer.close()
        remove_folder(self.folder)
        return 0

    def _signalled(self, signum, _frame):
        """SIGTERM or SIGHUP: while the pilot starts, stop that start at once (the
        pilot cancelled in order); once active, stop as `pilot stop` does."""
        why = f"the holder got {signal.Signals(signum).name}"
        if self.state == "starting":
            self.why = why
            raise KeyboardInterrupt(why)
        self.stop(why)

    def _watch(self):
        """Until a stop: end when the pilot has ended, or has been idle too long."""
        idle_s = self.request.idle_timeout_s
        while not self.stopping.wait(POLL_S):
            if not self.pilot.alive:
                self.why = "its pilot ended (its walltime, or its job was lost)"
                return
            load = self.pilot.load
            if load["running"] or load["queued"]:
                self.last_busy = time.time()
            elif idle_s and time.time() - self.last_busy > idle_s:
                self.why = f"idle for {idle_s / 60:g} min"
                return

    def _end_pilot(self):
        load = self.pilot.load
        try:
            if load["running"] or load["queued"]:
                self.pilot.abort(f"the held pilot {self.request.name} stopped ({self.why})")
            else:
                self.pilot.close()
        except Interrupted:
            pass
        except Exception as exc:  # noqa: the folder must go all the same
            log.error("the pilot's end: %s: %s", type(exc).__name__, exc)

    def stop(self, why):
        if not self.stopping.is_set():
            self.why = why
            self.stopping.set()

    def status(self):
        walltime_left = self.started + 60 * self.pilot.walltime - time.time()
        load = self.pilot.load
        return {"name": self.request.name, "state": self.state, "pid": os.getpid(),
                "resource": self.pilot.resource, "cpus": self.pilot.cpus,
                "walltime": self.pilot.walltime, "walltime_left_s": round(walltime_left, 1),
                "idle_s": 0.0 if load["running"] or load["queued"]
                else round(time.time() - self.last_busy, 1),
                "idle_timeout_s": self.request.idle_timeout_s,
                "session_dir": self.pilot.session_dir, "error": self.error,
                "plans_runs": True,  # a built-in analysis' RunSpec is planned here
                **load}

    def _record(self):
        write_record(self.folder, {
            "name": self.request.name, "pid": os.getpid(), "state": self.state,
            "started": self.started, "resource": self.pilot.resource, "cpus": self.pilot.cpus,
            "walltime": self.pilot.walltime, "idle_timeout": self.request.idle_timeout_s,
            "session_dir": self.pilot.session_dir, "error": self.error,
            "host": socket.gethostname()})

    # --- clients ---------------------------------------------------------------
    def _accept(self, server):
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the end
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True,
                             name="trajflow-held-client").start()

    def _client(self, conn):
        self.clients.append(threading.current_thread())
        lock_fd = messages = None
        try:
            message, lock_fd = receive_first(conn)
            messages = Messages(conn)
            op = message.get("op")
            if op == "status":
                send(conn, self.status())
            elif op == "stop":
                self.stop("stopped by `trajflow pilot stop`")
                send(conn, {"stopping": True})
            elif op == "run":
                ended_in = self._run(Connection(conn), messages, message)
                if ended_in is not None and lock_fd is not None:  # its client may be gone
                    remove_handed_lock(ended_in, lock_fd)
            else:
                send(conn, {"refused": f"unknown request {op!r}"})
        except (EOFError, OSError, ValueError) as exc:
            log.debug("a client's connection: %s", exc)
        finally:
            if lock_fd is not None:  # the run's folder is free once its run has ended here
                os.close(lock_fd)
            if messages is not None:
                messages.close()  # (the socket closes with its last file)
            conn.close()

    def _run(self, conn, messages, message):
        """A client's run: checked (planned here, for a RunSpec), handed to the pilot, its
        events and its end sent back; its folder once it has ended there (else None)."""
        run = plan = None
        try:
            run = _run_message(message)
            self._check_open()  # before a folder is written for a run it cannot take
            if run["spec"] is not None:
                plan, run["plan"] = self._plan(run, conn)
                if plan is None:
                    return
            else:
                plan = RunPlan.load(run["plan"])
            spec = RunSpec(retries=run["retries"], env=run["env"])
            future = self.pilot.submit_written(
                plan, run["plan"], spec, resume=run["resume"],
                on_event=lambda _run, stage, kind, text: conn.say({"event": [stage, kind, text]}))
        except (InputError, PlanError, OSError, ValueError, TypeError, RuntimeError) as exc:
            conn.say({"refused": str(exc)})  # RuntimeError: the pilot is closing or lost
            if run is not None and run["spec"] is not None and plan is not None:
                withdraw_handover(plan.workdir)  # planned here, never begun
            return
        self.last_busy = time.time()
        threading.Thread(target=_cancel_on_hangup, args=(messages, future, self.pilot),
                         daemon=True,
                         name="trajflow-held-hangup").start()
        conn.say({"submitted": future.request.name})
        try:
            future.result()
            ended = {"ok": True}
        except RunFailed as exc:
            ended = {"ok": False, "error": str(exc)}
        except Interrupted as exc:
            ended = {"ok": False, "interrupted": True, "error": str(exc)}
        except concurrent.futures.CancelledError:  # its client left, or the pilot stopped
            ended = {"ok": False, "interrupted": True, "cancelled": True,
                     "error": f"cancelled before it began ({self.why or 'its client left'})"}
            if run["spec"] is not None:  # planned here: nothing began, nothing interrupted
                withdraw_handover(plan.workdir)
        except BaseException as exc:  # noqa: the pilot failed; the client must hear of it
            ended = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self.last_busy = time.time()
        conn.say({"done": ended})
        if not ended.get("cancelled"):
            conn.say({"report": self._report(plan.workdir)})
        return plan.workdir

    def _report(self, rundir):
        """The run's report.html, drawn after its result by the drawer (bokeh and matplotlib
        imported there already, where a client would pay seconds for them); here if the
        drawer is gone. Its path, or None."""
        if self.drawer is not None:
            try:
                return self.drawer.draw(rundir).result(REPORT_WAIT_S)
            except Exception as exc:  # noqa: gone, or too slow: the report is drawn here
                log.warning("%s: %s; drawn by the holder", rundir, exc or type(exc).__name__)
        return Run(rundir, trust=True).write_report()

    def _check_open(self):
        """InputError unless the pilot is active, not stopping, with a minute left."""
        if self.state != "active" or self.stopping.is_set():
            raise InputError(f"the held pilot {self.request.name} is {self.state}"
                             + (f" ({self.why})" if self.why else ""))
        left = self.started + 60 * self.pilot.walltime - time.time()
        if left < 60:
            raise InputError(f"the held pilot {self.request.name} has {left:.0f} s of its "
                             "walltime left: start another (trajflow pilot start)")

    def _plan(self, run, conn):
        """(plan, its path) of a client's RunSpec, planned and written here as its client
        would have (for this pilot's cores, into the folder it locked); (None, None) when
        the input is bad, which the client is told in make_plan's words."""
        try:
            # its messages spelled as its client's user writes options (flags, or keywords)
            with command_line() if run["command_line"] else contextlib.nullcontext():
                spec = RunSpec(**run["spec"])
                plan = resolve(spec, cores=self.pilot.cpus, new_out=False)
            plan.asked_at = run["asked_at"]
            path = write_plan(plan)
        except InputError as exc:
            conn.say({"invalid": str(exc)})
            return None, None
        except Exception as exc:  # noqa: an input MDAnalysis could not read: said, not lost
            log.exception("planning a run in %s", run["spec"].get("out"))
            conn.say({"invalid": f"{type(exc).__name__}: {exc}"})
            return None, None
        record_handed_over(plan.workdir)  # "interrupted" until it says how it ended
        if not conn.say({"planned": path}):  # its client left meanwhile: not begun
            withdraw_handover(plan.workdir)
            return None, None
        return plan, path


class Connection:
    """A run's connection: its lines sent whole (events come from the pilot's thread, the
    end from the client's), and nothing raised once the client has gone."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def say(self, message) -> bool:
        """Whether it was sent (False: the client is gone)."""
        with self.lock:
            try:
                send(self.conn, message)
                return True
            except OSError:
                return False  # the client is gone; the run's end is on disk all the same


def _start_drawer(folder):
    """A ReportDrawer, or None (reports are then drawn in the holder) if it cannot start."""
    try:
        return ReportDrawer(folder)
    except OSError as exc:
        log.warning("no report drawer (%s): reports are drawn by the holder", exc)
        return None


def receive_first(conn, most=MAX_MESSAGE_BYTES):
    """A connection's first message, and the descriptor sent with it (a run's folder lock,
    held here while its run goes on) or None."""
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(conn, 1 << 16, 1)
        for fd in got:
            os.set_inheritable(fd, False)
        fds += got
        if not chunk or len(data) + len(chunk) > most:
            for fd in fds:
                os.close(fd)
            raise EOFError("a first message cut short or too long")
        data += chunk
    message = json.loads(data)
    if not isinstance(message, dict):
        for fd in fds:
            os.close(fd)
        raise ValueError("a message that is not a JSON object")
    for fd in fds[1:]:
        os.close(fd)
    return message, (fds[0] if fds else None)


def _run_message(message):
    """A "run" request's fields, checked (plain JSON from the owner's socket)."""
    plan, resume = message.get("plan"), message.get("resume", False)
    retries, env = message.get("retries", 1), message.get("env")
    spec, asked_at = message.get("spec"), message.get("asked_at", 0.0)
    flags = message.get("command_line") is True
    if spec is not None:
        if not isinstance(spec, dict) or resume or not is_finite_number(asked_at) or not all(
                isinstance(spec.get(k), str) and os.path.isabs(spec[k]) for k in ("out", "topology")):
            raise InputError("a run request's spec is a new run's RunSpec, its folder and "
                             "topology absolute paths")
        # only trajflow's own analyses are planned here: a user's code is never imported
        if not plannable_there(spec.get("analysis"), spec.get("args")):
            raise InputError("a held pilot plans built-in analyses only: plan your own "
                             "analysis in your process and send its plan")
    elif not isinstance(plan, str) or not os.path.isabs(plan):
        raise InputError("a run request names its plan by an absolute path")
    if not isinstance(resume, bool):
        raise InputError("a run request's resume is true or false")
    if env is not None and not isinstance(env, dict):
        raise InputError("a run request's env is an object")
    return {"plan": plan, "resume": resume, "retries": retries, "env": env, "spec": spec,
            "asked_at": asked_at, "command_line": flags}


def _cancel_on_hangup(messages, future, pilot):
    """The client hung up (Ctrl-C, or it died): its run is cancelled, or stopped where it
    is (its running tasks cancelled) if it has begun; the pilot's other runs go on."""
    try:
        messages.receive()
    except (EOFError, OSError, ValueError):
        pass
    if not future.done() and future.cancel():
        log.info("%s: cancelled (its client left before it began)", future.request.name)
    elif pilot.stop_run(future, "its client left (Ctrl-C, or it ended)"):
        log.info("%s: stopped (its client left; its running tasks are cancelled)",
                 future.request.name)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    folder = os.path.abspath(argv[0])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    check_private(folder)
    request = HeldRequest.from_dict(read_plain(os.path.join(folder, REQUEST), 1 << 16) or {})
    if read_record(folder) is not None:
        log.error("%s is held already", folder)
        return 2
    return Holder(folder, request).serve()


if __name__ == "__main__":
    sys.exit(main())
