"""A `Pilot`: one RADICAL pilot held for several runs (`trajflow.run`, api.py, makes
one of its own for one run).

    >>> import trajflow
    >>> from MDAnalysisTests.datafiles import PSF, DCD
    >>> run = trajflow.run(PSF, DCD, "rmsd")            # a pilot of its own, started and ended
    >>> run.results.rmsd[:3]

    >>> with trajflow.Pilot("local.localhost", cpus=2) as pilot:   # one pilot start for both
    ...     rmsd = pilot.submit(PSF, DCD, "rmsd")
    ...     dih = pilot.submit(PSF, DCD, "dihedrals", mode="tasks")
    ...     print(rmsd.result().results.rmsd[:, 2].mean(), dih.result().results.features.shape)

Every run is planned (inputs opened, atoms or the analysis checked) when it is
submitted, so bad input raises InputError at once, before any pilot. The
pilot is requested with the first run. Leaving the `with` block normally waits
for the runs submitted and then cancels the pilot; leaving it by an exception
or Ctrl-C cancels the pilot at once and ends its tasks (Ctrl-C raises
Interrupted). Runs submitted in a row (each submit starting while the one
before is planned or within 0.3 s of it) go to the pilot as one batch; a run
submitted while others run joins them at once (one live EnTK workflow,
entk_client.LiveWorkflow): runs side by side share the pilot's cores.
"""
import concurrent.futures
import dataclasses
import os
import threading
import time

from trajflow.tasks.rundir import (add_to_failure, begin_attempt, PLAN, record_dispatched,
                                   record_handed_over, record_outcome, withdraw_handover)
from trajflow.workflows.errors import InputError, Interrupted, RunFailed
from trajflow.workflows.run import resources
from trajflow.workflows.run.execute import PilotProcess, RunRequest, tell_run_ended
from trajflow.workflows.run.heartbeat import cancel_orphans
from trajflow.workflows.run.outcomes import (failed_for_good, forget_analyze_attempt,
                                             remove_partial_files)
from trajflow.workflows.run.planning import fit_to_cores, full_disk_note, resolve, write_plan
from trajflow.workflows.run.progress import Progress
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.signals import stop_on_signals
from trajflow.workflows.run.spec import PilotSpec, RunSpec, spelled, split_options, takes_options

COALESCE_S = 0.3  # runs submitted this close together go to the pilot as one batch
# while runs are on the pilot, how soon a new submit is handed over (a poll of the pilot
# process' pipe: ~100 cheap wake-ups a second, only while runs are in flight)
DISPATCH_POLL_S = 0.01


class RunFuture(concurrent.futures.Future):
    """A run submitted to a Pilot: ``.result()`` waits and gives its Run (or raises
    RunFailed / Interrupted), ``.done()``, ``.cancel()`` (True only while it
    has not started: a started run ends with its pilot), ``.path`` its folder.

    Examples
    --------
    >>> future = pilot.submit(PSF, DCD, "rmsd")
    >>> future.path              # the run's folder, there at once
    >>> run = future.result()    # blocks until the run has ended
    """

    def __init__(self, request):
        super().__init__()
        self.request = request
        self.path = request.plan.workdir
        self.name = request.name
        self.on_event = None  # also told each stage event (run, stage, kind, text)

    def __repr__(self):
        return f"<trajflow.RunFuture {self.request.plan.analysis} {self.path} " \
               f"{'done' if self.done() else 'running' if self.running() else 'pending'}>"


class Pilot:
    """One RADICAL pilot on a resource, held for several runs.

    Its options are PilotSpec's (listed below), `progress`: say what happens
    (pilot requested, each stage, each run's end) on stderr, and `reports`:
    write each run's report.html before its result is given (a held pilot
    writes it after).

    Examples
    --------
    >>> with trajflow.Pilot("local.localhost", cpus=2, walltime=30) as pilot:
    ...     first = pilot.run(PSF, DCD, "rmsd")
    ...     second = pilot.run(PSF, DCD, "rmsd", io="h5md")      # same pilot, no new start
    """

    @takes_options(PilotSpec)
    def __init__(self, resource="local.localhost", *, progress=True, reports=True, **options):
        spec = PilotSpec(resource=resource, **split_options(options, PilotSpec)[0])
        if spec.cpus is None:
            if not spec.local:
                raise InputError(f"Pilot({spec.resource!r}): give {spelled('cpus')}=N, the cores "
                                 f"to ask {spec.resource} for")
            spec = dataclasses.replace(spec, cpus=spec.local_cores())
        if spec.local and spec.cpus > spec.local_cores() and resources.agent_cores(spec.resource):
            raise InputError(f"{spelled('cpus', spec.cpus)}: {spec.resource} keeps "
                             f"{len(resources.agent_cores(spec.resource))} of this machine's "
                             f"cores for RADICAL, which leaves {spec.local_cores()} for tasks: "
                             f"ask for at most that many")
        self.spec = spec
        self.resource, self.cpus, self.walltime = spec.resource, spec.cpus, spec.walltime
        self.client_timeout, self.keep_sandbox = spec.client_timeout, spec.keep_sandbox
        self.limits = spec.limits
        self.description = spec.description()
        self.path = os.path.abspath(spec.path or
                                    f"trajflow-pilot-{time.strftime('%Y%m%d-%H%M%S')}")
        self._progress = Progress(progress)
        self._reports = reports     # write each run's report.html before its result is given
        self.coalesce_s = COALESCE_S  # a held pilot's runs come planned, each on its own
        self._process = None
        self._thread = None
        self._pending = []          # RunFutures not yet handed to the pilot
        self._running = {}          # run name -> RunFuture
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._planning = 0          # submits being planned right now
        self._last_submit = 0.0
        self._broken = None         # why the pilot can take no more runs
        self._names = set()

    @staticmethod
    def attach(name, progress=True):
        """The held pilot `name` (`trajflow pilot start --name NAME`): a HeldPilot, with
        this class's submit/run API; leaving its `with` block leaves the pilot held."""
        from trajflow.workflows.run.held_client import HeldPilot  # it builds on this module
        return HeldPilot(name, progress=progress)

    def __repr__(self):
        return f"<trajflow.Pilot {self.resource} {self.cpus} cpus " \
               f"{'active' if self._process else 'not started'}>"

    # --- lifetime --------------------------------------------------------------
    def __enter__(self):
        self._signals = stop_on_signals()
        self._signals.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self._leave(exc_type)
        finally:
            self._signals.__exit__(None, None, None)

    def _leave(self, exc_type):
        if exc_type is None:
            self.close()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.abort()  # raises Interrupted
        else:
            try:
                self.abort(f"{exc_type.__name__} raised in the `with` block")
            except Interrupted:
                pass  # the script's own exception is the one to see

    def close(self, wait=True):
        """No more runs: let the runs submitted end, then cancel the pilot (as
        leaving the `with` block does). `wait=False` returns at once; the pilot
        is then cancelled as soon as its last run has ended."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if not wait:
            return
        if self._thread is not None:
            try:
                while self._thread.is_alive():  # Thread.join alone would not see a Ctrl-C
                    self._thread.join(0.2)
            except KeyboardInterrupt:
                self.abort()
        if self._process is not None and not self._closed:
            self._process.close()
            self._closed = True
            self._progress.close()
            self._say("pilot cancelled")

    @property
    def session_dir(self):
        """The RADICAL session's folder (logs, profiles), once the pilot is started."""
        return self._process.session_dir if self._process is not None else None

    def abort(self, why="interrupted"):
        """Cancel the pilot now: runs not started are cancelled, running ones end
        (their tasks killed) with Interrupted, which is raised here too. `why`
        is said on stderr."""
        with self._cond:
            self._closing = True
            for future in self._pending:
                future.cancel()
            self._pending.clear()
            self._cond.notify_all()
        if self._process is not None and self._process.alive:
            try:
                self._process.interrupt(why)
            except Interrupted as exc:  # raised for the caller once the dispatcher has ended
                if self._thread is not None:
                    self._thread.join()
                self._progress.close()
                raise exc from None

    def stop_run(self, future, why):
        """Stop one run that has begun (its client left): its running tasks are
        cancelled and no stage follows; its future then fails with RunFailed saying
        `why`, and its folder can be resumed. The other runs go on. False if it has
        ended already or has not been handed over (cancel() that one)."""
        if future.done() or not future.running() or not self.alive:
            return False
        self._process.cancel_run(future.request.name, why)
        return True

    def start(self):
        """Request the pilot now and wait until it is active and has run an empty task
        (otherwise it is requested with the first run): what a held pilot does, so
        that its first run finds it warm. RuntimeError or Interrupted if it fails."""
        with self._cond:
            if self._process is not None:
                return
            self._start(warm=True)

    @property
    def load(self):
        """What the pilot has now: runs running and queued, and the cores the
        running ones take."""
        with self._cond:
            running = list(dict(self._running).values())  # copied whole under the GIL
            return {"running": len(running), "queued": len(self._pending),
                    "busy_cores": min(self.cpus, sum(min(self.cpus, f.request.plan.n_workers)
                                                     for f in running))}

    @property
    def alive(self):
        """False once the pilot has ended (closed, cancelled, or lost)."""
        return self._process is not None and self._process.alive and self._broken is None

    def _start(self, warm=False):
        if self._process is not None:
            return
        os.makedirs(self.path, exist_ok=True)
        self._say(f"pilot requested on {self.resource}: {self.cpus} cores for "
                  f"{self.walltime} min (session in {self.path})")
        self._process = PilotProcess(self.description, self.path, on_event=self._event,
                                     client_timeout=self.client_timeout,
                                     keep_sandbox=self.keep_sandbox, limits=self.limits)
        self._process.start()
        if warm:
            self._cond.release()  # runs submitted meanwhile wait as pending
            try:
                self._process.warm_up()
            except BaseException as exc:  # no dispatcher will ever run: take no more runs
                self._broken = exc
                raise
            finally:
                self._cond.acquire()
            self._say(f"pilot active on {self.resource} (session {self.session_dir})")
        self._thread = threading.Thread(target=self._dispatch, name="trajflow-pilot", daemon=True)
        self._thread.start()

    # --- runs ------------------------------------------------------------------
    @takes_options(RunSpec, skip=("topology", "trajectory", "analysis"))
    def submit(self, topology, trajectory, analysis, **options) -> RunFuture:
        """Plan a run and hand it to the pilot; returns at once with its RunFuture.

        Its options are RunSpec's (listed below), as for :func:`trajflow.run`.
        InputError at once for bad input (nothing written).
        """
        spec = RunSpec(topology=topology, trajectory=trajectory, analysis=analysis,
                       **split_options(options, RunSpec)[0])
        with self._cond:
            self._planning += 1  # the pilot waits for this run to join the next batch
        try:
            return self.submit_plan(resolve(spec, cores=self.cpus), spec)
        finally:
            with self._cond:
                self._planning -= 1
                self._cond.notify_all()

    def run(self, topology, trajectory, analysis, **kwargs) -> Run:
        """Run on this pilot and wait: the Run, or RunFailed / Interrupted.

        Same arguments as :func:`trajflow.run` (without the pilot's own).

        Examples
        --------
        >>> with trajflow.Pilot(cpus=2) as pilot:
        ...     run = pilot.run(PSF, DCD, "rmsd", io="h5md")
        """
        return self.submit(topology, trajectory, analysis, **kwargs).result()

    def submit_plan(self, plan, spec=None, resume=False) -> RunFuture:
        """Hand a plan already made (and not yet written) to the pilot; `spec` gives
        the run's retries, env and progress (default: RunSpec's defaults)."""
        spec = spec or RunSpec()
        self._check_open()
        plan = fit_to_cores(plan, self.cpus)
        path = prepare_run(plan, resume, self._say)
        future = RunFuture(RunRequest(self._unique_name(plan), plan, path, spec.retries, resume,
                                      spec.env, spec.progress))
        hold_lock_until_done(plan, future, self._say)
        return self._enqueue(future)

    def submit_written(self, plan, path, spec, resume=False, on_event=None) -> RunFuture:
        """A plan its client has written to `path` (prepare_run) and whose folder's lock
        it holds: a held pilot's runs (held_holder.py). `on_event(run, stage, kind,
        text)`: also told each of its stage events."""
        self._check_open()
        future = RunFuture(RunRequest(self._unique_name(plan), plan, path, spec.retries,
                                      resume, spec.env, spec.progress))
        future.on_event = on_event
        return self._enqueue(future)

    def _check_open(self):
        if self._closing:
            raise RuntimeError("this Pilot is closed (it takes no more runs): start a new one")
        if self._broken is not None:
            raise RuntimeError(f"this Pilot can take no more runs: {self._broken}")

    def _enqueue(self, future):
        plan = future.request.plan
        with self._cond:
            self._start()
            self._pending.append(future)
            self._last_submit = time.time()
            self._cond.notify_all()
        self._say_for(future, f"{future.request.name}: submitted ({plan.analysis}, {plan.io}/{plan.mode}, "
                  f"{plan.n_blocks} blocks, {plan.n_frames} frames) -> {plan.workdir}")
        return future

    def _unique_name(self, plan):
        base = os.path.basename(plan.workdir) or "run"
        with self._cond:  # a held pilot's clients submit from threads of their own
            name, k = base, 1
            while name in self._names:
                k += 1
                name = f"{base}.{k}"
            self._names.add(name)
        return name

    def _dispatch(self):
        """The pilot's side: hand runs over as they come (those submitted together as
        one batch), beside the runs already on the pilot; resolve each run's future
        as it ends."""
        in_flight = {}  # batch id -> its RunFutures
        batch = []
        try:
            while True:
                batch, last = self._take_batch(wait=not in_flight)
                if batch:
                    self._running.update({f.request.name: f for f in batch})
                    for f in batch:  # its wait behind the runs before it ends here
                        try:
                            record_dispatched(f.request.plan.workdir)
                        except Exception:  # noqa: a moment of its profile never stops a run
                            pass
                    in_flight[self._process.send_batch([f.request for f in batch],
                                                       close_after=last)] = batch
                    batch = []
                elif last and not in_flight:
                    return
                message = self._process.next_message(timeout=DISPATCH_POLL_S)
                if message is None:
                    continue
                kind, payload = message
                if kind == "ended":
                    tell_run_ended(self._ended, *payload)
                elif kind == "report":
                    for f in in_flight.pop(payload[0], []):
                        if not f.done():  # ended without a word from the pilot (it should not)
                            f.set_exception(RunFailed(f"run {f.request.name} ended without an "
                                                      "outcome", run=Run(f.path, trust=True)))
        except BaseException as exc:  # the pilot is gone: every run not ended fails with it
            self._broken = exc
            with self._cond:
                pending = [f for f in self._pending if f.set_running_or_notify_cancel()]
                self._pending.clear()
            self._fail_all(batch + [f for b in in_flight.values() for f in b] + pending, exc)

    def _take_batch(self, wait):
        """([RunFuture], whether the pilot is closing) of the runs waiting. `wait`: until
        one comes (nothing is on the pilot); else none while a script's submits in a row
        are still coming (one is being planned, or came under coalesce_s ago)."""
        with self._cond:
            while wait and not self._pending and not self._closing:
                self._cond.wait()
            while self._pending and not self._closing and (
                    self._planning or time.time() - self._last_submit < self.coalesce_s):
                if not wait:
                    return [], False
                self._cond.wait(self.coalesce_s)
            batch = [f for f in self._pending if f.set_running_or_notify_cancel()]
            self._pending.clear()
            return batch, self._closing

    def _fail_all(self, futures, exc):
        """The pilot is gone (`exc`): each run not ended fails with it, or is done if its
        result was complete on disk before."""
        for f in futures:
            if f.done():
                continue
            run = Run(f.path, trust=True)  # complete on disk before the pilot went: done
            if run.ok:
                f.set_result(run)
                continue
            why = f"{exc}"
            if run.outcome is None and f.running():  # the child died: say so on disk
                note = full_disk_note(f.request.plan)
                why += f"; {note}" if note else ""
                try:
                    record_outcome(f.request.plan.workdir, "failed", why)
                except OSError as err:  # a full disk: the run still fails, said here
                    why += f" (its outcome.json could not be written: {err})"
            elif not isinstance(exc, (Interrupted, KeyboardInterrupt)):
                try:  # its outcome written, then the pilot failed: both are its story
                    add_to_failure(f.request.plan.workdir, why)
                except OSError:
                    pass
            # a lost pilot fails its runs as any failure does (a RunFailed with the run)
            if isinstance(exc, (Interrupted, KeyboardInterrupt)):
                f.set_exception(exc)
            else:
                failed = RunFailed(f"run {f.request.name} failed: {why}",
                                   run=Run(f.path, trust=True))
                failed.__cause__ = exc
                f.set_exception(failed)

    def _ended(self, name, outcomes):
        future = self._running.pop(name)
        run = Run(future.path, trust=True)
        if self._reports:
            run.write_report()  # (its pilot's row too once that has ended: see run_plan)
        if run.ok:
            self._say_for(future, f"{name}: done -> {run.result_path}")
            future.set_result(run)
            return
        failed = failed_for_good(outcomes)
        outcome = run.outcome or {}
        why = ("; ".join(filter(None, [failed[0].describe() if failed else None,
                                       outcome.get("error")]))  # e.g. the node it lost
               or f"stopped after {outcome.get('stopped_at')}")
        self._say_for(future, f"{name}: FAILED")
        future.set_exception(RunFailed(f"run {name} failed: {why}", failed, run))

    # --- progress --------------------------------------------------------------
    def _event(self, run_name, stage, kind, text):
        future = self._running.get(run_name)
        if future is not None and future.on_event is not None:
            future.on_event(run_name, stage, kind, text)
        if future is None or future.request.progress:
            self._progress.stage(run_name, future.request.plan if future else None, stage, kind,
                                 text)

    def _say(self, text):
        self._progress.line(text)

    def _say_for(self, future, text):
        """A line about one run: said unless that run was asked for progress=False."""
        if future.request.progress:
            self._say(text)


def prepare_run(plan, resume, say):
    """Write a new run's folder and plan, or set a resumed run's folder for its next
    attempt; the plan's path."""
    if resume:  # a pilot of this run whose client died must not run beside this one
        cancel_orphans(plan.workdir, say)
        remove_partial_files(plan)
        forget_analyze_attempt(plan)
        begin_attempt(plan.workdir)
        return plan.save(plan.path(PLAN))
    return write_plan(plan)


def hold_lock_until_done(plan, future, say):
    """The run's folder says "interrupted" from now until the run says how it ended, and
    its lock (one run per RUNDIR) is released when `future` is done."""
    lock = plan.lock
    if lock is None:
        return
    record_handed_over(plan.workdir)

    def release(done, workdir=plan.workdir):
        if done.cancelled():  # it never began: nothing was interrupted
            withdraw_handover(workdir)
        lock.release()
    future.add_done_callback(release)
    lock.say_taken_over(say)
