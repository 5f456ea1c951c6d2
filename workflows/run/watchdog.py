"""No run waits silently: a bound for every phase of a pilot and of its runs.

The process that holds the pilot (session.py) can hang where trajflow has no
say: RADICAL's client creating its session on a full disk, a pilot job that
never starts, an agent that stops scheduling, a rank stopped with SIGSTOP.
So the watch lives in the parent (execute.PilotProcess), which only reads
the child's events and the runs' folders and can always act. Each phase has
a bound (`--limits NAME=S,...`, PilotSpec's `limits`): while a phase overruns
a quarter of it a line says so, at the bound the pilot is stopped, the runs
fail with the phase, the layer and what to do, and `--resume` goes on.

    phase    from -> to                                   layer
    session  first batch sent -> pilot submitted          RADICAL client
    submit   pilot submitted -> its job handed over       RADICAL client
    queue    job handed over -> job started (unbounded)   batch system
    start    job started -> agent active                  RADICAL agent
    task     a stage submitted -> its first task started  RADICAL agent
    stall    analyze running -> its frames advance        the tasks
    stage    split/reduce running -> ended (unbounded)    the tasks
    (an MPI analyze task's own reduce restarts its stall clock: reduce's start marker)
"""
import dataclasses
import glob
import logging
import os
import shutil
import time

from trajflow.tasks import procfs

log = logging.getLogger(__name__)

STALL_FACTOR = 20  # a stall bound is at least this many times a rank's time per frame
START_GRACE_S = 90.0  # the child's own cancel and replacement of a hung start go first
# a bounded wait fails once the session's disk has been full this long in it, not at its
# bound (300 s by default): RADICAL's components fail their state transitions there and
# do not go on
FULL_DISK_GRACE_S = 15.0
FULL_DISK_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class Phase:
    """One watched phase: its default bound (0: none), what it waits for, the layer
    that is waited on, and what to do when it overruns."""
    name: str
    default_s: float
    usual: str
    waits_for: str
    layer: str
    advice: str


PHASES = {p.name: p for p in (
    # session start to pilot submission took 2-4 s here (AppManager, rp.Session,
    # PilotManager); over SSH add a connection (1-3 s seen)
    Phase("session", 120, "2-4 s here", "RADICAL's client to start its session and submit the "
          "pilot", "RADICAL client",
          "RADICAL writes its session folder beside the run: check that disk and the session's "
          "*.log"),
    # the pilot's job handed to fork or sbatch: under a second here, a few over SSH
    Phase("submit", 300, "under 1 s here", "RADICAL's pilot launcher to hand the pilot's job "
          "to the batch system", "RADICAL client",
          "check that the batch system answers (`sbatch`, `squeue`) and the resource's "
          "access schema"),
    # the batch queue's time is the cluster's: no bound unless asked
    Phase("queue", 0, "the cluster's queue", "the pilot's job to start", "batch system",
          "ask for fewer cores or a shorter --walltime, or another --queue"),
    # job start to agent active: 13-25 s here (+14 s building kernels once)
    Phase("start", 300, "13-25 s here", "the pilot's agent to report ready after its job "
          "started", "RADICAL agent",
          "the pilot's bootstrap_0.out and agent_0.log in the session folder say how far it got"),
    # a stage submitted to its first task running: 1-3 s here; a busy pilot's cores
    # being taken is not a stall (any other task starting or ending restarts the clock)
    Phase("task", 300, "1-3 s here", "the first task of a stage to start", "RADICAL agent",
          "the agent's logs (agent_0.log, agent_scheduling.0000.log) in the pilot's sandbox"),
    # ranks rewrite their progress every 2 s while frames go: 300 s without one
    # is far beyond an open (the largest here: 40 s) or a slow frame
    Phase("stall", 300, "a report every 2 s", "the analyze ranks to report frames done",
          "the tasks", "a rank may be stopped (SIGSTOP), swapping or hung on its file system: "
          "`trajflow inspect RUNDIR` after the end shows each rank's phases"),
    # split (a copy of the trajectory) and reduce (the parts into result.h5) report no
    # frames: their time grows with the trajectory, so no bound unless asked, and said
    # every 5 minutes (a split task stopped by SIGSTOP waited for the walltime, silent)
    Phase("stage", 0, "seconds to minutes, with the trajectory's size", "a running split "
          "or reduce task to end", "the tasks",
          "the task may be stopped (SIGSTOP), swapping or hung on its file system"),
)}


def parse_limits(text):
    """'NAME=S,...' as {phase: seconds} (0: unbounded); ValueError naming the fix (the
    caller names the option, spelled as its user writes it)."""
    limits = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in PHASES:
            raise ValueError(f"{item!r} is not NAME=SECONDS with NAME one of "
                             f"{', '.join(PHASES)} (e.g. start=600,stall=900)")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not 0 <= seconds < float("inf"):  # NaN would disable the guard silently
            raise ValueError(f"{item!r}: the bound is a finite number of seconds, 0 or more "
                             "(0: none)")
        limits[name.strip()] = seconds
    return limits


def bounds(text):
    """Every phase's bound: the defaults, with those given in `text` instead."""
    return {**{name: p.default_s for name, p in PHASES.items()}, **parse_limits(text)}


@dataclasses.dataclass
class _RunWatch:
    """A run's stage under watch: its clock (None once nothing is watched), and for
    analyze the frames done, when they last changed and when its first task started."""
    plan: object
    stage: str
    clock: object
    marker: object = None  # the stage's start marker's mtime when it was submitted
    reduce_marker: object = None  # reduce's, for an analyze task that publishes the result
    base: int = 0          # frames done before this attempt (a resumed run's)
    frames: int = 0
    changed: float = 0.0
    first: float = 0.0


@dataclasses.dataclass
class _Clock:
    """A phase under way: which, since when, the quarters of its bound said."""
    phase: str
    since: float
    said: int = 0
    what: str = ""  # whose phase it is (the pilot, run R's analyze stage)
    full_since: float = 0.0  # since when the session's disk has been full in it (0: it is not)


class Watchdog:
    """The bounds of one pilot and its runs, fed with the child's events and polled.

    `check(now)` says (as log lines) each phase overrunning a quarter of its
    bound more, and returns the failure text of the first past its bound.
    """

    QUEUE_SAY_S = 300.0  # an unbounded wait (queue, stage) is said every 5 minutes

    def __init__(self, limits, session_root, child_pid=None, say=None):
        self.bounds = bounds(limits) if not isinstance(limits, dict) else {**bounds(""), **limits}
        self.session_root = session_root
        self.child_pid = child_pid
        self.say = say or log.warning
        self.pilot = None     # _Clock of the pilot's phase, None once active
        self.runs = {}        # run name -> _RunWatch
        self.active = False
        self.radical = {}     # pid -> title of RADICAL's processes seen in the child's group
        self.radical_noted_at = 0.0
        self.order = []       # runs going one at a time: only the first is watched

    # --- events ----------------------------------------------------------------
    def pilot_event(self, kind, now=None):
        """The pilot's side: 'batch' (its first runs sent), 'submitted', 'launched',
        'job started', 'active', 'restarted' (a hung start replaced)."""
        now = time.time() if now is None else now
        phase = {"batch": "session", "restarted": "session", "submitted": "submit",
                 "launched": "queue", "job started": "start"}.get(kind)
        if kind == "batch" and (self.pilot is not None or self.active):
            return  # the pilot is already on its way, or up
        if kind == "active":
            self.pilot, self.active = None, True
            self._note_radical()
            self.activity(now)  # the runs' stages were submitted before there was a pilot
        elif kind == "restarted":
            self.active = False
            self.radical.clear()  # the old session's processes ended by design
            self.pilot = _Clock(phase, now, what="the pilot")
        elif phase is not None and not self.active:
            self.pilot = _Clock(phase, now, what="the pilot")

    def run_event(self, run, plan, stage, kind, now=None):
        """A run's stage event: 'submitted' starts the watch of its first task."""
        now = time.time() if now is None else now
        self.activity(now)
        self._note_radical()
        if kind == "submitted" and stage:
            self.runs[run] = _RunWatch(plan, stage, _Clock("task", now, what=f"{run}'s {stage} "
                                                                           "stage"),
                                       marker=_marker_time(plan, stage),
                                       reduce_marker=_marker_time(plan, "reduce"))
        elif stage and run in self.runs and self.runs[run].stage == stage:
            self.runs[run].clock = None  # the stage ended

    def run_ended(self, run, now=None):
        """A run has ended: no more watch of it; in a batch run one at a time, the next
        run's clock starts now."""
        self.runs.pop(run, None)
        if run in self.order:
            self.order.remove(run)
            self.activity(time.time() if now is None else now)

    def one_at_a_time(self, names):
        """These runs go through the pilot one after another: only the first not ended
        is watched (the others' stages wait for it, by design)."""
        self.order = list(names)

    def activity(self, now):
        """Something happened on the pilot (a task started or ended): a stage waiting for
        cores another run holds is not stuck."""
        for watch in self.runs.values():
            if watch.clock is not None and watch.clock.phase == "task":
                watch.clock.since, watch.clock.said = now, 0

    # --- polling ---------------------------------------------------------------
    def _note_radical(self, now=None):
        """What of RADICAL runs now, to name what died should a phase overrun: noted at
        each stage event, the pilot's activation, a stage's first task's start and every
        NOTE_RADICAL_EVERY_S of the wait (a run's first stage is submitted before the
        pilot is up, and RADICAL starts its task manager's processes after that)."""
        self.radical_noted_at = time.time() if now is None else now
        if self.child_pid:
            self.radical.update(radical_processes(self.child_pid))

    def check(self, now=None):
        """Say what overruns; the failure text of a phase past its bound, or None."""
        now = time.time() if now is None else now
        if now - self.radical_noted_at >= NOTE_RADICAL_EVERY_S:
            self._note_radical(now)
        self._follow_runs(now)
        watches = [(self.pilot, None)] if self.pilot is not None else []
        if self.active:  # a run's stages wait for the pilot, whose phases are watched
            watches += [(w.clock, w) for name, w in self.runs.items() if w.clock is not None
                        and (not self.order or name == self.order[0])]
        for clock, watch in watches:
            failure = self._judge(clock, watch, now)
            if failure:
                return failure
        return None

    def _follow_runs(self, now):
        from trajflow.workflows.run.progress import frames_done
        for name, watch in self.runs.items():
            clock = watch.clock
            if clock is None:
                continue
            if clock.phase == "task" and _marker_time(watch.plan, watch.stage) != watch.marker:
                self.activity(now)
                self._note_radical()  # a task runs: the client's and agent's all are up
                # split and reduce: said while they run (unbounded unless asked)
                watch.clock = _Clock("stage", now, what=f"{name}'s {watch.stage} stage")
                if watch.stage == "analyze":
                    watch.clock = _Clock("stall", now, what=f"{name}'s analyze stage")
                    watch.base = watch.frames = frames_done(watch.plan)
                    watch.changed = watch.first = now
            elif clock.phase == "stall":
                reduce_marker = _marker_time(watch.plan, "reduce")
                if watch.stage == "analyze" and reduce_marker != watch.reduce_marker:
                    # an MPI analyze's root has begun to publish the result, its frames
                    # all done: a sign of life, as frames are (the stall bound runs
                    # again from here: a reduce is as quick as the gather before it, and
                    # a stage whose end RADICAL never reports still fails at it)
                    watch.reduce_marker = reduce_marker
                    clock.since, clock.said = now, 0
                    self.activity(now)
                    continue
                done = frames_done(watch.plan)
                if done != watch.frames:
                    watch.frames, watch.changed = done, now
                    clock.since, clock.said = now, 0
                    self.activity(now)  # frames go: the pilot's cores are busy, not stuck

    def _bound(self, clock, watch):
        """The phase's bound; a stall's at least STALL_FACTOR times a rank's time per
        frame so far (a heavy analysis reports seldom, and is not stuck)."""
        bound = self.bounds[clock.phase]
        if clock.phase == "start" and bound:
            bound += START_GRACE_S  # the child cancels a hung start itself, and replaces it
        if clock.phase == "stall" and bound and watch.frames > watch.base:
            plan = watch.plan
            per_frame = (watch.changed - watch.first) * max(1, plan.n_workers) / (watch.frames - watch.base)
            bound = max(bound, STALL_FACTOR * per_frame)
        return bound

    def _judge(self, clock, watch, now):
        """Say a new quarter of the bound passed; the failure text past the bound."""
        bound, phase = self._bound(clock, watch), PHASES[clock.phase]
        waited = now - clock.since
        if not bound:  # unbounded (the queue): said every QUEUE_SAY_S
            if waited >= (clock.said + 1) * self.QUEUE_SAY_S:
                clock.said += 1
                self.say(f"{clock.what}: waiting {_minutes(waited)} for {phase.waits_for} "
                         f"(no bound: --limits {phase.name}=S sets one)")
            return None
        if waited >= bound or self._full_for(clock, now) >= FULL_DISK_GRACE_S:
            return self.failure(clock, watch, waited, bound)
        quarter = int(4 * waited // bound)
        if quarter > clock.said:
            clock.said = quarter
            self.say(f"{clock.what}: waiting {waited:.0f} s for {phase.waits_for} (usually "
                     f"{phase.usual}); it fails at {bound:.0f} s{self._stopped_note()}")
        return None

    def failure(self, clock, watch, waited, bound):
        """What was waited for, on whom, what to do, and what was found wrong."""
        phase = PHASES[clock.phase]
        early = " and gave up before its bound, the disk being full" if waited < bound else ""
        text = (f"{clock.what} waited {waited:.0f} s for {phase.waits_for}{early} (bound {bound:.0f} s, "
                f"--limits {phase.name}=S; usually {phase.usual}); waiting on: {phase.layer}. "
                f"{phase.advice}")
        notes = [self._stopped_note().lstrip("; "), self._disk_note(), self._dead_note()]
        if clock.phase == "stall":
            notes.insert(0, _quiet_ranks(watch.plan))
            if watch.frames >= watch.plan.n_frames:
                text = (f"{clock.what}: every frame is done, but RADICAL has not reported the "
                        f"stage's end for {waited:.0f} s (bound {bound:.0f} s, --limits "
                        f"{phase.name}=S); waiting on: RADICAL (client or agent)")
        return "; ".join(filter(None, [text] + notes))

    def _full_for(self, clock, now):
        """How long the session's disk has been full during this wait (0: it is not)."""
        if self._free_bytes() >= FULL_DISK_BYTES:
            clock.full_since = 0.0
            return 0.0
        clock.full_since = clock.full_since or now
        return now - clock.full_since

    def _stopped_note(self):
        if self.child_pid and procfs.state(self.child_pid) == "T":
            return (f"; the process holding the pilot (pid {self.child_pid}) is stopped "
                    "(SIGSTOP, a suspended terminal or machine)")
        return ""

    def _dead_note(self):
        alive = radical_processes(self.child_pid) if self.child_pid else {}
        gone = sorted((title, pid) for pid, title in self.radical.items() if pid not in alive)
        if not gone:
            return ""
        return ("RADICAL processes that died during the run: "
                + ", ".join(f"{title} (pid {pid})" for title, pid in gone))

    def _free_bytes(self):
        """Free bytes on the session's file system (unknown: as if there were room)."""
        try:
            return shutil.disk_usage(self.session_root).free
        except OSError:
            return FULL_DISK_BYTES

    def _disk_note(self):
        free = self._free_bytes()
        if free < FULL_DISK_BYTES:
            return (f"the file system of {self.session_root} is full ({free / 1e6:.1f} MB free; "
                    "RADICAL and the tasks write there): free space, then --resume")
        return ""


def _quiet_ranks(plan):
    """How far a stalled run got, which blocks (ranks) reported least lately, and any
    of its task processes found stopped on this machine."""
    quiet = []
    for path in glob.glob(plan.path("progress", "analyze.block_*")):
        if path.endswith(".tmp"):
            continue
        try:
            age = time.time() - os.stat(path).st_mtime
        except OSError:
            continue
        quiet.append((age, int(path.rsplit("_", 1)[-1])))
    quiet.sort(reverse=True)
    words = [_frames_text(plan)]
    if quiet:
        words.append("last heard of: " + ", ".join(f"block {b} {age:.0f} s ago"
                                                   for age, b in quiet[:4]))
    stopped = stopped_tasks(plan.workdir)
    if stopped:
        words.append("stopped task processes here (state T, SIGSTOP): pid "
                     + ", ".join(map(str, stopped)))
    return "; ".join(words)


def _frames_text(plan):
    from trajflow.workflows.run.progress import frames_done
    return f"{min(frames_done(plan), plan.n_frames)} of {plan.n_frames} frames done"


def _marker_time(plan, stage):
    """The mtime of the stage's start marker (touched by each of its tasks), or None: a
    change since the stage was submitted is a task started (no clock compared, so a file
    server's skew does not matter)."""
    from trajflow.tasks.rundir import started_marker
    try:
        return os.stat(started_marker(plan.workdir, stage)).st_mtime_ns
    except OSError:
        return None


def _minutes(seconds):
    from trajflow.workflows.run.progress import eta_text
    return eta_text(seconds)


# a scan of /proc takes a few ms; a RADICAL process that dies within this time of its
# start is not named among the dead
NOTE_RADICAL_EVERY_S = 2.0


def radical_processes(group):
    """{pid: title} of RADICAL's processes (titled rp.*) in process group `group`: the
    client's components, and a local pilot's agent."""
    return {p.pid: p.title for p in procfs.processes()
            if p.group == group and p.name.startswith("rp.") and p.state != "Z"}


def stopped_tasks(workdir):
    """pids of trajflow task processes of the run in `workdir` that are stopped."""
    mark = (workdir.rstrip("/") + "/").encode()
    return sorted(p.pid for p in procfs.processes()
                  if p.state == "T" and b"trajflow.tasks." in p.cmdline and mark in p.cmdline)
