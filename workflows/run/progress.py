"""What the user sees while runs go: a line per event and a bar of frames analysed.

The events (pilot requested, pilot active, each stage submitted and ended,
each run's end) come from the process holding the pilot. The frames come from
the ranks themselves: each analyze rank rewrites a one-number file,
RUNDIR/progress/analyze.block_NNNNN, at most every 2 s (tasks/timing.py), and
this polls them; no message per frame travels anywhere. On a terminal each
run's analyze stage gets a tqdm bar; otherwise a plain line at every quarter.

The lines are records of the `trajflow` logger (INFO; DEBUG for a run asked
for progress=False), so a script silences or redirects trajflow as any
library: a handler added to the `trajflow` logger gets them. Where it has
none, the first Progress shows them on stderr itself (`show_on`); the
`trajflow` command does the same with its --quiet (cli/main.py).
"""
import glob
import logging
import os
import sys
import threading
import time

from tqdm import tqdm

log = logging.getLogger("trajflow")
_BARS = set()  # the tqdm bars on the screen: lines are written above them


class LineHandler(logging.Handler):
    """trajflow's records as lines on a stream ("trajflow HH:MM:SS ..."), above any bar;
    without a stream, on whatever sys.stderr is when the line is written (as logging's
    last resort does: a redirected or captured stderr gets the lines)."""

    def __init__(self, stream=None, level=logging.INFO):
        super().__init__(level)
        self._stream = stream
        self.setFormatter(logging.Formatter("trajflow %(asctime)s %(message)s", "%H:%M:%S"))

    @property
    def stream(self):
        return self._stream or sys.stderr

    def emit(self, record):
        try:
            text = self.format(record)
            if _BARS:
                tqdm.write(text, file=self.stream)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()
        except Exception:  # noqa: a closed stream must not break a run
            self.handleError(record)


def configured() -> bool:
    """Whether the `trajflow` logger has a handler of its own (not the NullHandler): a
    script that wants trajflow's records elsewhere adds one before its first run."""
    return any(not isinstance(h, logging.NullHandler) for h in log.handlers)


def show_on(stream=None, level=logging.INFO):
    """Show trajflow's records on `stream` (None: stderr, as it is at each line) from
    `level` up; the handler. They then stay out of the root logger's handlers (no line
    twice)."""
    handler = LineHandler(stream, level)
    log.addHandler(handler)
    log.propagate = False
    if log.level == logging.NOTSET or log.level > level:
        log.setLevel(level)
    return handler


def frames_done(plan):
    """Frames the analyze ranks of a run have reported done so far; all of them once its
    result is complete (its progress counts are then tidied away: outcomes.tidy)."""
    if os.path.exists(plan.result_path()):
        return plan.n_frames
    done = 0
    for path in glob.glob(plan.path("progress", "analyze.block_*")):
        if path.endswith(".tmp"):
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                done += int(fh.read().strip() or 0)
        except (OSError, ValueError):
            continue  # being replaced: next poll
    return done


def shown(enabled=True):
    """The level to log progress at (INFO, or DEBUG when not `enabled`), trajflow's lines
    shown on stderr first where the `trajflow` logger has no handler of its own."""
    if enabled and not configured():
        show_on()  # kept: later lines (and later Pilots) go to stderr too
    return logging.INFO if enabled else logging.DEBUG


def eta_text(seconds):
    """A time left as people say it: 40 s, 3 min, 1 h 20 min."""
    seconds = max(0, int(round(seconds)))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min"


def new_bar(**options):
    """A tqdm bar on stderr that trajflow's lines are written above."""
    bar = tqdm(file=sys.stderr, **options)
    _BARS.add(bar)
    return bar


def close_bar(bar):
    _BARS.discard(bar)
    bar.close()


class Progress:
    """Progress lines (logged) and bars (on `stream`, stderr); DEBUG records and no bar
    when not `enabled`. A `stream` given is where this Progress shows its lines too."""

    def __init__(self, enabled=True, stream=None, poll_s=1.0):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.poll_s = poll_s
        self._handler = None  # a handler of this Progress's own stream, removed at close
        if enabled and stream is not None:
            self._handler = show_on(stream)
        self.level = shown(enabled)
        self._tracked = {}   # run name -> [plan, tqdm bar or last quarter printed]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, text):
        log.log(self.level, text)

    def stage(self, run_name, plan, stage, kind, text):
        """A stage event of a run: its line, and the analyze stage's bar (its last
        count shown before the stage's end is)."""
        tracked = self.enabled and stage == "analyze" and plan is not None
        if tracked and kind != "submitted":
            self._untrack(run_name)
        self.line(f"{run_name}: {text}")
        if tracked and kind == "submitted":
            self._track(run_name, plan)

    def _track(self, run_name, plan):
        with self._lock:
            if run_name in self._tracked:
                return
            # since when, and from how many frames (a retried or resumed stage starts with
            # the blocks done before): the time left is timed on this attempt's frames
            since = (time.time(), min(frames_done(plan), plan.n_frames))
            bar = None
            if self.tty:
                bar = tqdm(total=plan.n_frames, initial=since[1], desc=f"{run_name} analyze",
                           unit="frame", file=self.stream, leave=False, dynamic_ncols=True)
                _BARS.add(bar)
            self._tracked[run_name] = [plan, bar if bar is not None else 0, since]
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, daemon=True,
                                                name="trajflow-progress")
                self._thread.start()

    def _untrack(self, run_name):
        with self._lock:
            plan, state, since = self._tracked.pop(run_name, (None, None, None))
        if plan is not None:
            self._show(run_name, plan, state, since)
            if not isinstance(state, int):
                _BARS.discard(state)
                state.close()

    def _poll(self):
        while not self._stop.wait(self.poll_s):
            with self._lock:
                tracked = list(self._tracked.items())
            for run_name, entry in tracked:
                entry[1] = self._show(run_name, *entry)

    def _show(self, run_name, plan, state, since):
        """Update a bar (tqdm shows the rate and the time left), or print a line when a
        new quarter is reached, with the time left at the rate so far; the new state."""
        done = min(frames_done(plan), plan.n_frames)
        if not isinstance(state, int):
            state.update(done - state.n)
            return state
        quarter = 4 * done // max(1, plan.n_frames)
        if quarter > state:
            left = ""
            t0, done0 = since
            if done0 < done < plan.n_frames:
                rate = (done - done0) / max(time.time() - t0, 1e-6)
                left = f", about {eta_text((plan.n_frames - done) / rate)} left"
            self.line(f"{run_name}: analyze {done} of {plan.n_frames} frames "
                      f"({100 * done // max(1, plan.n_frames)} %{left})")
        return max(quarter, state)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for run_name in list(self._tracked):
            self._untrack(run_name)
        if self._handler is not None:
            log.removeHandler(self._handler)
            self._handler = None
