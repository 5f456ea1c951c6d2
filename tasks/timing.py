"""The per-rank timing record: phase intervals on RADICAL-Pilot's clock.

Each task process (each MPI rank) keeps one `RankTimer`. Phases are timed as
[start, stop] intervals with `time.time()`, the clock RADICAL-Pilot profiles
use, so both can be laid on one timeline. Intervals are per chunk, never per
frame, to keep the cost of capture negligible. At the end the record goes to
RUNDIR/profile/<name>.jsonl and, when RADICAL profiling is on, as `app_*`
events into the task's own profile ($RP_PROF_TGT).
"""
import json
import os
import socket
import time

from . import faults
from .placement import current_cpus, runqueue_wait_s
from .rundir import open_in_run, write_text

# Phase names follow Khoshlessan et al. 2019, Table 3 (t_open_topology, t_IO, ...), with
# what a rank does besides them named too, so that little of its time is left unaccounted
# (`t_overhead`): `setup` (from the task's main(): plan and kernel load, MPI init and its
# communicators, the chunk counter's window, the agreement before the first chunk),
# `claim` (taking the next chunk from the counter), `progress` (rewriting the file the
# workstation's progress bar reads) and `finalize` (closing readers and windows after
# the last collective).
PHASES = ("setup", "open_topology", "open_trajectory", "io", "compute", "claim", "progress",
          "wait", "comm", "write", "convert", "finalize")
# the phase a testing delay (faults.py, TRAJFLOW_TEST_DELAY) is injected into
FAULT_PHASES = {"open_topology": "open", "io": "io", "compute": "compute", "comm": "comm"}
PROGRESS_EVERY_S = 2.0  # how often a rank rewrites its progress file, at most
WAITING = ("wait", "comm")  # phases a rank may spend waiting for the others
MPI_INIT_PART = "mpi_init"  # the part of a rank's `setup_parts` that is its MPI_Init


def read_bytes():
    """Every byte this process has read so far through read(2) and its kin, from files
    and pipes, cache hits and its imports included (Linux' rchar), or None elsewhere:
    how much of a trajectory a rank really read, beside what it delivered."""
    try:
        with open("/proc/self/io", encoding="ascii") as fh:
            return int(fh.readline().split()[1])  # "rchar: N" comes first
    except (OSError, ValueError, IndexError):
        return None


def write_progress(path, frames):
    """A block's frames done so far, as the workstation's progress bar reads it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_text(path, f"{frames}\n")


class _Interval:
    """One timed phase. Phases nest: an inner phase's time is its own, not its outer's
    too (the outer is split around it), so a wide phase can name the glue between
    the narrow ones. A plain context manager: a rank enters thousands of them."""
    __slots__ = ("timer", "name", "t0")

    def __init__(self, timer, name):
        self.timer, self.name = timer, name

    def __enter__(self):
        now = time.time()
        stack = self.timer.open_phases
        if stack and now > stack[-1].t0:  # the outer phase's time so far
            outer = stack[-1]
            self.timer.intervals.append((outer.name, outer.t0, now))
        stack.append(self)
        self.t0 = now

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.timer.inject(self.name)
        now = time.time()
        if now > self.t0:  # an empty fragment (an outer phase's, between two inner) is none
            self.timer.intervals.append((self.name, self.t0, now))
        stack = self.timer.open_phases
        stack.pop()
        if stack:  # the outer phase goes on from here
            stack[-1].t0 = now
        return False


class RankTimer:
    """One task's (one MPI rank's) phases; with `progress_path`, its frames done so far.

    The testing hooks live here, not in the analysis loops: a rank with a
    `block` sleeps where TRAJFLOW_TEST_DELAY says, at the end of the first
    interval of that phase (so the delay is inside it, and a delayed gather
    delays only this rank).
    """

    def __init__(self, task: str, rank: int = 0, size: int = 1, progress_path=None,
                 setup_marks=None, neighbours=None, within_task=None, **info):
        """`neighbours`: a CpuNeighbours started with the record (the node's first rank's):
        what the node's other processes used meanwhile goes in the record. `within_task`:
        the task whose process this part of the run is done in (e.g. the reduce an MPI
        analyze's root does): not that RADICAL task's record, and no launch of its own."""
        self.task = task
        self.rank = rank
        self.size = size
        self.info = dict(info)
        self.intervals = []  # (phase, start, stop), none overlapping another
        self.open_phases = []  # the phases entered and not left, innermost last
        self.t_start = time.time() if not setup_marks else setup_marks[0][1]
        self.t_stop = None
        self.progress_path = progress_path
        self.frames_done = 0
        self.counting = True  # False: frames done now are not the block's (a backup copy's)
        self._progress_written = 0.0
        self._frames_written = 0
        self._runqueue_wait0 = runqueue_wait_s()
        self.neighbours = neighbours
        # the RADICAL task this record is of (None: a part of another task's process)
        self.radical_task = None if within_task else os.environ.get("RP_TASK_ID")
        if within_task:
            self.info["within_task"] = within_task
        if setup_marks:  # [(what was done, when)] from the task's main(): its set-up so far
            now = time.time()
            self.intervals.append(("setup", self.t_start, now))
            times = [t for _, t in setup_marks] + [now]
            self.info["setup_parts"] = {what: b - a for (what, _), a, b
                                        in zip(setup_marks, times, times[1:])}
            # the CPU this process used up to here (its interpreter's start-up too): flat in
            # N where the set-up's own work is, whatever waiting for the others cost
            self.info["setup_cpu_s"] = time.process_time()

    def phase(self, name: str):
        """`with timer.phase(name):` times its body as one interval of `name`."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; known: {PHASES}")
        if name in WAITING and self.progress_path and self._progress_written:
            self._write_progress()  # all its frames said before it waits for the others
        return _Interval(self, name)

    def inject(self, name: str):
        """The testing delay for this rank's block in this phase, once (see faults.py)."""
        block = self.info.get("block")
        if block is not None and name in FAULT_PHASES:
            faults.delay(block, FAULT_PHASES[name])

    def progress(self, frames: int):
        """`frames` more are done: rewrite the progress file (at most every
        PROGRESS_EVERY_S; the workstation sums them into its progress bar)."""
        if self.counting:
            self.frames_done += frames
        now = time.time()
        if self.progress_path and now - self._progress_written >= PROGRESS_EVERY_S:
            self._write_progress()
            self._progress_written = now

    def _write_progress(self):
        if self._frames_written == self.frames_done and self._progress_written:
            return
        with self.phase("progress"):
            write_progress(self.progress_path, self.frames_done)
        self._frames_written = self.frames_done

    def count(self, **amounts):
        """Add to the record's totals (`frames`, `bytes_read`): a rank of a dynamic
        schedule runs several chunks, and its record sums them."""
        for key, value in amounts.items():
            self.info[key] = self.info.get(key, 0) + value

    def add(self, name: str, t0: float, t1: float):
        """An interval measured by the caller (e.g. sums of per-frame times), outside any
        open phase (which would count the same time again)."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; known: {PHASES}")
        self.intervals.append((name, t0, t1))

    def totals(self) -> dict:
        out = {f"t_{p}": 0.0 for p in PHASES}
        for name, t0, t1 in self.intervals:
            out[f"t_{name}"] += t1 - t0
        stop = self.t_stop if self.t_stop is not None else time.time()
        out["t_total"] = stop - self.t_start
        out["t_overhead"] = out["t_total"] - sum(out[f"t_{p}"] for p in PHASES)
        # ready to run but waiting for a CPU another process held: on a workstation,
        # RADICAL's agent and client and EnTK sharing the ranks' cores
        wait = runqueue_wait_s()
        out["t_cpu_wait"] = (None if wait is None or self._runqueue_wait0 is None
                             else wait - self._runqueue_wait0)
        return out

    def record(self) -> dict:
        return {"task": self.task, "rank": self.rank, "size": self.size,
                "host": socket.gethostname(), "pid": os.getpid(),
                "rp_task_id": self.radical_task,
                "rp_session": os.environ.get("RP_SESSION_ID"),
                "t_start": self.t_start, "t_stop": self.t_stop, "read_bytes": read_bytes(),
                "cpus": current_cpus(),
                **self.info, **self.totals(),
                "intervals": [list(iv) for iv in self.intervals]}

    def finish(self, profile_path: str) -> dict:
        """Stop the clock and write the record (atomically) and RP events."""
        if self.progress_path:
            self._write_progress()
        if self.neighbours is not None:
            with self.phase("finalize"):
                self.info["cpu_neighbours"] = self.neighbours.measure()
        self.t_stop = time.time()
        rec = self.record()
        os.makedirs(os.path.dirname(profile_path), exist_ok=True)
        write_text(profile_path, json.dumps(rec) + "\n")
        self._to_radical_profile()
        return rec

    def _to_radical_profile(self):
        """Append `app_<phase>_start/stop` events, rank in the message, to $RP_PROF_TGT."""
        target = os.environ.get("RP_PROF_TGT")
        if not target or "within_task" in self.info:  # (a part of another task's
            return  # process: its events are not that task's)
        uid = os.environ.get("RP_TASK_ID", self.task)
        lines = [f"{self.t_start:.6f},app_start,trajflow,MainThread,{uid},AGENT_EXECUTING,rank={self.rank}\n"]
        for name, t0, t1 in self.intervals:
            msg = f"rank={self.rank}"
            lines.append(f"{t0:.6f},app_{name}_start,trajflow,MainThread,{uid},AGENT_EXECUTING,{msg}\n")
            lines.append(f"{t1:.6f},app_{name}_stop,trajflow,MainThread,{uid},AGENT_EXECUTING,{msg}\n")
        lines.append(f"{self.t_stop:.6f},app_stop,trajflow,MainThread,{uid},AGENT_EXECUTING,rank={self.rank}\n")
        try:
            with open_in_run(target, "a") as fh:
                fh.write("".join(lines))
        except OSError:
            pass  # the profile is a courtesy to RADICAL's tools; ours is on disk
