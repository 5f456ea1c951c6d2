"""Watch a pilot come up: say when it is active, and cancel it when its job
has started but its agent never reports ready.

RADICAL-Pilot waits for PMGR_ACTIVE until the walltime runs out. In one CI
run a SLURM pilot's agent started (its components up, `hostname` in its
agent_0.prof) and then waited forever on its own first request (preparing
its `rp` environment, a message on its control channel that never came
back); the client waited the whole 20-minute walltime and the job ended by
TimeLimit. (That request was lost: tasks/agent_rpc.py now sends it again
where the agent starts through trajflow; this watch stays for any other
hang.) Where the pilot's sandbox is on this disk (the local resources), the
start of its job shows (bootstrap_0.out appears); a pilot not active
`limit_s` (the watchdog's `start` bound) after that is cancelled and the
watch says so (`hung`), so that the caller can start another pilot. On a
remote cluster the job's start is not visible from here. Each step (pilot
submitted, its job handed over, started, active) is told `on_phase`, for the
watchdog in the parent (watchdog.py), which bounds the steps before.
"""
import logging
import os
import threading
import time
from trajflow.workflows.run.entk_client import local_sandbox
from trajflow.workflows.run.watchdog import PHASES

log = logging.getLogger(__name__)


class StartWatch:
    """A thread following one AppManager's pilot until it is active or final.

    `on_active(uid)` when it is active; `on_phase(step)` at 'submitted',
    'launched' and 'job started'. `local`: the pilot sandbox is on this disk,
    so a start that hangs can be seen, and is cancelled after `limit_s` (0: never).
    """

    def __init__(self, appman, on_active, local, limit_s=None, poll_s=0.5, on_phase=None):
        self.appman = appman
        self.on_active = on_active
        self.on_phase = on_phase or (lambda step: None)
        self.local = local
        self.limit_s = PHASES["start"].default_s if limit_s is None else limit_s
        self.poll_s = poll_s
        self.hung = None  # what happened, once a pilot that never came up was cancelled
        self._thread = threading.Thread(target=self._watch_or_say, name="trajflow-start-watch",
                                        daemon=True)

    def start(self):
        self._thread.start()
        return self

    def pilot(self):
        return getattr(getattr(self.appman, "_rmgr", None), "pilot", None)  # EnTK's, private

    def _watch_or_say(self):
        try:
            self._watch()
        except Exception as exc:  # never silent: without it a hung start waits out the walltime
            log.error("watching the pilot's start failed: %s: %s", type(exc).__name__, exc)

    def _watch(self):
        import radical.pilot as rp
        started = None  # when the pilot's job was first seen running
        told = set()

        def tell(step):
            if step not in told:
                told.add(step)
                self.on_phase(step)
        while True:
            pilot = self.pilot()
            state = getattr(pilot, "state", None)
            if state == rp.PMGR_ACTIVE:
                self.on_active(pilot.uid)
                return
            if state in rp.FINAL:
                return
            if pilot is not None:
                tell("submitted")
            if state == rp.PMGR_ACTIVE_PENDING:  # the job is the batch system's now
                tell("launched")
            if started is None and self.local and pilot is not None and job_started(pilot):
                started = time.time()
                tell("launched")
                tell("job started")
            if started is not None and self.limit_s and time.time() - started > self.limit_s:
                at = time.strftime("%H:%M:%S", time.localtime(started))
                self.hung = (f"the pilot's job started at {at} but its agent did not report ready within {self.limit_s:g} s "
                             "(RADICAL-Pilot's start hung); that pilot was cancelled")
                self._cancel(pilot)
                return
            time.sleep(self.poll_s)

    def _cancel(self, pilot):
        pmgr = getattr(getattr(self.appman, "_rmgr", None), "pmgr", None)
        try:
            pmgr.kill_pilots(pilot.uid, _timeout=20)  # a cancel asks the agent, which is not there
        except Exception as exc:  # the main thread still waits on the pilot: say why
            self.hung += f" (cancelling it failed: {type(exc).__name__}: {exc})"


def job_started(pilot) -> bool:
    """Whether the pilot's job has started: its bootstrapper's output file
    (bootstrap_0.out, opened by the job itself, also before the pre_bootstrap_0
    commands run) is in the sandbox."""
    sandbox = local_sandbox(pilot)
    return bool(sandbox) and os.path.exists(os.path.join(sandbox, "bootstrap_0.out"))
