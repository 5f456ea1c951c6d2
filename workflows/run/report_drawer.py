"""A held pilot's run reports, drawn in a process of their own beside its holder.

Why: a run's report.html (bokeh and matplotlib, ~0.3 s of CPU) was drawn in the
holder after the run's result, where it held the holder's GIL while EnTK's
threads there dispatched the next runs' tasks, and took a core from their
tasks. Here one Python, with bokeh and matplotlib imported once, draws them
one after another at a lower priority (nice +10) than the tasks: a run's
result reaches its client first, its report follows.

    python -m trajflow.workflows.run.report_drawer HELD_FOLDER

(its holder's folder, named to tell whose it is in a process list) reads run
folders, one absolute path a line, on stdin, and answers each on stdout, in order,
with a JSON line {"path": ..., "report": its report.html or null}. It ends at stdin's
end, or when its parent (the holder) dies.
"""
import collections
import concurrent.futures
import importlib
import json
import logging
import os
import subprocess
import sys
import threading

from trajflow.tasks.procfs import die_with_parent

log = logging.getLogger(__name__)

# below the tasks (0), yet never starved (SCHED_IDLE would be, by a pilot's long run on
# every core, while its finished runs' folders stay locked until their reports are drawn)
NICE = 10
MODULE = "trajflow.workflows.run.report_drawer"


class ReportDrawer:
    """The holder's side: draw(path) -> a Future of the report's path (None when it could
    not be written; an exception when the drawer itself is gone). Start it from a thread
    that lives as long as the holder (its death signal follows the starting thread)."""

    def __init__(self, holder_folder):
        self._proc = subprocess.Popen([sys.executable, "-m", MODULE, holder_folder],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      close_fds=True)
        self._pending = collections.deque()  # Futures, in the order their paths were sent
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name="trajflow-report-drawer")
        self._reader.start()

    def draw(self, rundir) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        path = os.path.abspath(rundir)
        with self._lock:
            try:
                self._proc.stdin.write(path.encode() + b"\n")
                self._proc.stdin.flush()
            except (OSError, ValueError) as exc:  # it is gone (or closed)
                future.set_exception(RuntimeError(f"the report drawer is gone ({exc})"))
                return future
            self._pending.append((path, future))
        return future

    def _read(self):
        """Each answer to the path it names, in order; whatever ends this loop (the
        drawer's end, an answer that is not its own) fails what is left: no caller waits
        for ever."""
        try:
            for line in self._proc.stdout:
                with self._lock:
                    path, future = self._pending.popleft() if self._pending else (None, None)
                if future is None:
                    raise ValueError("an answer to no request")
                answer = json.loads(line)
                if not isinstance(answer, dict) or answer.get("path") != path:
                    raise ValueError(f"an answer that is not {path}'s")
                future.set_result(answer.get("report"))
        except ValueError as exc:
            log.warning("the report drawer's answers: %s; reports are drawn by the holder",
                        exc)
            self._proc.kill()
        finally:
            with self._lock:  # it ended: no answer will come for what is left
                left, self._pending = list(self._pending), collections.deque()
            for _, future in left:
                future.set_exception(RuntimeError("the report drawer ended before it drew "
                                                  "this"))

    def close(self, timeout=30.0):
        """Let it draw what it was sent (up to `timeout`), then end it."""
        with self._lock:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("the report drawer did not end within %.0f s: killed", timeout)
            self._proc.kill()
            self._proc.wait()
        self._reader.join(5)


def main():
    die_with_parent(os.getppid())
    os.nice(NICE)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s report drawer %(levelname)s %(message)s")
    from trajflow.workflows.run.runs import Run
    from trajflow.workflows.profile.report_html import pyplot
    pyplot()  # matplotlib and bokeh imported once, before the first run's report
    importlib.import_module("bokeh.plotting")
    for line in sys.stdin:
        path = line.rstrip("\n")
        try:  # the holder's own runs (planned or sent by its owner), as it opened them
            report = Run(path, trust=True).write_report()
        except Exception as exc:  # noqa: a damaged folder; the next one is drawn all the same
            log.warning("%s: no report (%s: %s)", path, type(exc).__name__, exc)
            report = None
        sys.stdout.write(json.dumps({"path": path, "report": report}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
