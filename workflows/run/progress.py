"""What the user sees while runs go: a line per event and a bar of frames analysed.

The events (pilot requested, pilot active, each stage submitted and ended,
each run's end) come from the process holding the pilot. The frames come from
the ranks themselves: each analyze rank rewrites a one-number file,
RUNDIR/progress/analyze.block_NNNNN, at most every 2 s (tasks/timing.py), and
this polls them; no message per frame travels anywhere. On a terminal each
run's analyze stage gets a tqdm bar; otherwise a plain line at every quarter.
"""
import glob
import os
import sys
import threading
import time


def frames_done(plan):
    """Frames the analyze ranks of a run have reported done so far."""
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


class Progress:
    """Progress lines and bars on `stream` (stderr); nothing at all when not `enabled`."""

    def __init__(self, enabled=True, stream=None, poll_s=1.0):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.poll_s = poll_s
        self._tracked = {}   # run name -> [plan, tqdm bar or last quarter printed]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, text):
        if not self.enabled:
            return
        text = f"trajflow {time.strftime('%H:%M:%S')} {text}"
        if self.tty and self._tracked:
            from tqdm import tqdm
            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def stage(self, run_name, plan, stage, kind, text):
        """A stage event of a run: its line, and the analyze stage's bar."""
        self.line(f"{run_name}: {text}")
        if not self.enabled or stage != "analyze" or plan is None:
            return
        if kind == "submitted":
            self._track(run_name, plan)
        else:
            self._untrack(run_name)

    def _track(self, run_name, plan):
        with self._lock:
            if run_name in self._tracked:
                return
            bar = None
            if self.tty:
                from tqdm import tqdm
                bar = tqdm(total=plan.n_frames, desc=f"{run_name} analyze", unit="frame",
                           file=self.stream, leave=False, dynamic_ncols=True)
            self._tracked[run_name] = [plan, bar if bar is not None else 0]
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, daemon=True,
                                                name="trajflow-progress")
                self._thread.start()

    def _untrack(self, run_name):
        with self._lock:
            plan, state = self._tracked.pop(run_name, (None, None))
        if plan is not None:
            self._show(run_name, plan, state)
            if not isinstance(state, int):
                state.close()

    def _poll(self):
        while not self._stop.wait(self.poll_s):
            with self._lock:
                tracked = list(self._tracked.items())
            for run_name, entry in tracked:
                entry[1] = self._show(run_name, *entry)

    def _show(self, run_name, plan, state):
        """Update a bar, or print a line when a new quarter is reached; the new state."""
        done = min(frames_done(plan), plan.n_frames)
        if not isinstance(state, int):
            state.update(done - state.n)
            return state
        quarter = 4 * done // max(1, plan.n_frames)
        if quarter > state:
            self.line(f"{run_name}: analyze {done} of {plan.n_frames} frames "
                      f"({100 * done // max(1, plan.n_frames)} %)")
        return max(quarter, state)

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for run_name in list(self._tracked):
            self._untrack(run_name)
