"""A run as a Python object: its results as arrays, its plan, how it ended, its profile.

Everything is read from RUNDIR alone (result.h5, plan.json, outcome.json,
profile/, radical/), so a run made by the CLI, by a script or on another
machine opens the same way:

    >>> import trajflow
    >>> run = trajflow.open_run("runs/adk-rmsd")
    >>> run.results.rmsd[:3]              # (frame, time, rmsd) rows, as MDAnalysis' RMSD gives them
    >>> run.frame, run.time               # every frame analysed, and its time (ps)
    >>> run.profile.stragglers            # flags with the numbers behind them
    >>> print(run.summary())              # what `trajflow run` prints at the end
"""
import html
import logging
import os

from trajflow.tasks.mda_analyses import PickledNotLoaded
from trajflow.tasks.plan import PlanError, RunPlan
from trajflow.tasks.rundir import has_plan, PLAN, REPORT, read_outcome
from trajflow.workflows.errors import InputError, RunFailed
from trajflow.tasks import backend_part
from trajflow.workflows.profile.inspection import (how_it_ended, inspect_runs, straggler_lines,
                                                   summary_text)
from trajflow.workflows.profile.report_html import (html_table, library_once, render_body,
                                                    result_plot, write_html)
from trajflow.workflows.profile.wall_time import describe as describe_wall, whole_from_outcome
from trajflow.tasks.results import open_result

log = logging.getLogger(__name__)


class Run:
    """One trajflow run, read from its folder.

    Attributes
    ----------
    path : str
        the run's folder (RUNDIR).
    plan : RunPlan
        what was asked: inputs, analysis, io, mode, blocks (``plan.to_dict()``).
    trust : bool
        whether results stored with pickle are loaded (unpickling runs code of whoever
        wrote the folder): True for the runs this process made, else as opened.
    not_loaded : list of str
        the results left unread for want of `trust` (after ``results`` was read).

    Examples
    --------
    >>> run = trajflow.open_run("runs/adk-rmsd")
    >>> run.ok, run.outcome["status"]
    (True, 'done')
    >>> run.results.rmsd.shape            # frame, time, rmsd: MDAnalysis RMSD's layout
    (9800, 3)
    """

    def __init__(self, path, trust=False):
        self.path = os.path.abspath(path)
        if not os.path.exists(os.path.join(self.path, PLAN)):
            raise FileNotFoundError(f"{self.path!r} is not a trajflow run (no {PLAN}): "
                                    "give the folder a run wrote (its --out / out=)")
        try:
            self.plan = RunPlan.load(os.path.join(self.path, PLAN))
        except PlanError as exc:
            raise InputError(str(exc)) from None
        self.plan.workdir = self.path  # a folder moved or copied elsewhere reads from where it is
        self.trust = trust
        self.not_loaded = []
        self._results = None

    def __repr__(self):
        outcome = self.outcome
        state = outcome["status"] if outcome else "not ended"
        return f"<trajflow.Run {self.plan.analysis} {self.plan.io}/{self.plan.mode} " \
               f"{self.plan.n_blocks} blocks, {state}: {self.path}>"

    def _repr_html_(self):
        """In a notebook: what the run was, how it ended, and its result's first plot."""
        plan = self.plan
        wall = "-" if self.wall_s is None else f"{self.wall_s:.1f} s"
        rows = [["analysis", plan.analysis], ["state", self.state],
                ["frames", plan.n_frames], ["strategy", f"{plan.io}/{plan.mode}, "
                                                        f"{plan.n_blocks} blocks"],
                ["wall time", wall], ["folder", self.path]]
        parts = [html_table(["trajflow run", ""], rows)]
        if self.ok:
            plot = self._first_plot()
            if plot:
                parts.append(f'<img alt="result" src="{plot}">')
        else:
            parts.append("<pre>" + html.escape("\n".join(
                how_it_ended(self.path, plan)["lines"])) + "</pre>")
        return "".join(parts)

    def _first_plot(self):
        """The first result that is one number per frame, against time (rmsd: its
        third column), as a PNG; None if there is none (or none may be read)."""
        try:
            results = self.results
        except InputError:  # a Backend run opened without trust
            return None
        for key, value in results.items():
            if key in ("frame", "time"):
                continue
            if key == "rmsd" and getattr(value, "ndim", 0) == 2:
                value = value[:, 2]  # (frame, time, rmsd)
            plot = result_plot(results["time"], value, key)
            if plot:
                return plot
        return None

    @property
    def state(self):
        """"done", "failed" or "not ended" (no outcome.json: running, or its client killed)."""
        if self.ok:
            return "done"
        return "failed" if self.outcome else "not ended"

    @property
    def wall_s(self):
        """Seconds from the call to the run's end, where both are known, else None."""
        return whole_from_outcome(self.plan.asked_at, self.outcome)

    @property
    def result_path(self):
        return self.plan.result_path()

    @property
    def outcome(self):
        """How the run ended (outcome.json as a dict: status "done" or "failed",
        stopped_at, error, failed_tasks), or None while it has not ended."""
        return read_outcome(self.path)

    @property
    def ok(self):
        """True when its result is there, complete (and its outcome, if written, says done)."""
        return how_it_ended(self.path, self.plan)["ok"]

    @property
    def results(self):
        """The results as an MDAnalysis ``Results`` of numpy arrays (``.rmsd``,
        ``["features"]``, your analysis' own names, ``.frame``, ``.time``).
        RunFailed if the run has no complete result."""
        if self._results is None:
            if not self.ok:
                outcome = self.outcome or {}
                raise RunFailed(f"run {self.path} has no complete result (it "
                                f"{'ended ' + outcome['status'] if outcome else 'has not ended'}"
                                f"{': ' + outcome['error'] if outcome.get('error') else ''}); "
                                "see run.outcome", run=self)
            self._results = self._backend_results() if self.plan.backend else \
                open_result(self.result_path, self.trust)
            self.not_loaded = sorted(_not_loaded(self._results))
            if self.not_loaded:
                log.warning("%s: %d object(s) stored with pickle, not loaded (%s): "
                            "open_run(%r, trust=True) if you trust who wrote it",
                            self.path, len(self.not_loaded), ", ".join(self.not_loaded),
                            self.path)
        return self._results

    def _backend_results(self):
        """An MDAnalysis run() through trajflow.Backend: the analysis' results as its
        run() concluded them, with `frame` and `time`."""
        from MDAnalysis.analysis.results import Results
        if not self.trust:
            raise InputError(f"run {self.path} was made by trajflow.Backend: its results are "
                             "stored with pickle (MDAnalysis' own analysis object), and "
                             "unpickling runs whatever code the folder's writer put there; "
                             f"open_run({self.path!r}, trust=True) if you trust who wrote it")
        analysis = backend_part.concluded(self.plan)
        return Results(analysis.results, frame=analysis.frames, time=analysis.times)

    @property
    def frame(self):
        """The frame number of every result row."""
        return self.results["frame"]

    @property
    def time(self):
        """The time (ps) of every result row, as MDAnalysis' trajectory.time."""
        return self.results["time"]

    @property
    def profile(self):
        """Per-task and per-rank timings, stragglers and advice (a Profile)."""
        return Profile([self.path])

    def write_report(self):
        """RUNDIR/report.html (timeline, phases, stragglers, how it ended); its path, or
        None when it could not be written (a report never hides a result)."""
        try:
            path = self.plan.path(REPORT)
            write_html(self.profile.report, path, f"trajflow run {self.path}", user_target=False)
            return path
        except Exception as exc:  # noqa: a full disk, a damaged profile
            log.warning("%s: no report.html (%s)", self.path, exc)
            return None

    def summary(self):
        """The text `trajflow run` prints for this run: how it ended (what failed, where
        and why, what a resume runs again), stragglers, advice."""
        lines = how_it_ended(self.path, self.plan)["lines"]
        lines.append(f"{os.path.basename(self.path)}: profiles: {self.plan.path('profile')}")
        times = self.profile.report["advice"].get(os.path.basename(self.path), {}).get("times")
        if times and times.get("wall"):
            lines.append(f"  wall time {describe_wall(times['wall'])}")
        if self.plan.truncated:
            t = self.plan.truncated
            lines.append(f"  TRUNCATED INPUT: {t['file']}: analysed {t['analysed']} whole frames "
                         f"of {t['frames_in_files']} ({t['where']})")
        lines += ["  " + line for line in self.profile.summary_lines()]
        return "\n".join(lines)


class Profile:
    """The timing records of one or more runs, judged.

    Attributes
    ----------
    records : list of dict
        one row per task and MPI rank: run, task, rank, block, host, frames,
        t_open_topology, t_open_trajectory, t_io, t_compute, t_wait, t_comm,
        t_launch, t_total (seconds) and the intervals of the timeline.
    stragglers : list of dict
        the members flagged by the straggler rule, most harmful first, each
        with the numbers behind the flag (duration, median, ratio, cause).
    advice : dict
        run name -> the papers' advice for its t_compute/t_IO.

    Examples
    --------
    >>> prof = trajflow.open_run("runs/adk-rmsd").profile
    >>> [(r["rank"], round(r["t_io"], 2)) for r in prof.records if r["task"] == "analyze"]
    >>> prof.to_html("adk-rmsd.html")
    >>> prof.to_pandas().groupby("task").t_total.max()      # with pandas installed
    """

    def __init__(self, rundirs):
        self.rundirs = [os.path.abspath(d) for d in rundirs]
        self.report = inspect_runs(self.rundirs)
        self.records = self.report["records"]
        self.stragglers = self.report["stragglers"]
        self.advice = {run: a["text"] for run, a in self.report["advice"].items()}
        self.scaling = self.report["scaling"]

    def _repr_html_(self):
        """In a notebook: the interactive timeline, stragglers, advice, the phase tables
        (BokehJS in the notebook's first such display only)."""
        return render_body(self.report, with_library=library_once())

    def __repr__(self):
        return (f"<trajflow.Profile of {len(self.rundirs)} run(s): {len(self.records)} task "
                f"and rank records, {len(self.stragglers)} straggler flag(s)>")

    def to_pandas(self):
        """The records as a pandas DataFrame (pandas is not a trajflow requirement)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Profile.to_pandas() needs pandas: pip install pandas "
                              "(Profile.records holds the same rows as dicts)") from None
        return pandas.DataFrame([{k: v for k, v in r.items() if k != "intervals"}
                                 for r in self.records])

    def to_html(self, path, title=None):
        """Write the offline HTML report (timeline, phases, stragglers); returns `path`."""
        write_html(self.report, path, title or f"trajflow {', '.join(self.rundirs)}")
        return path

    def summary_lines(self):
        """Stragglers and advice in a few lines (what the CLI prints after a run)."""
        lines = straggler_lines(self.report)
        lines += ["advice: " + text for text in self.advice.values()]
        return lines

    def table(self):
        """The phase table, stragglers, advice and scaling as text (`trajflow inspect`)."""
        return summary_text(self.report)


def _not_loaded(results, prefix=""):
    """The keys (nested ones as a.b) of results left unread for want of trust."""
    for key, value in results.items():
        if isinstance(value, PickledNotLoaded):
            yield prefix + key
        elif isinstance(value, dict):
            yield from _not_loaded(value, f"{prefix}{key}.")


def find_runs(folder, depth=4, unreadable=None):
    """The runs in `folder` and below it (`depth` levels: a campaign's runs/RES/EXP), by
    path; a run's own folders are not searched. A folder whose plan is not trajflow's is
    left out, and (path, why) appended to `unreadable` if given."""
    found = []
    for root, dirs, _ in os.walk(os.path.abspath(folder)):
        if has_plan(root):
            try:
                found.append(Run(root))
            except (InputError, OSError) as exc:
                if unreadable is not None:
                    unreadable.append((root, str(exc)))
            dirs[:] = []
        elif root.count(os.sep) - os.path.abspath(folder).count(os.sep) >= depth:
            dirs[:] = []
        else:
            dirs.sort()
    return found


def open_run(path, trust=False):
    """Reopen a run from its folder (made by the CLI, a script, or another machine).

    Opening a run never runs code from it: results stored with pickle (your own
    analysis' objects, a trajflow.Backend run's results) are loaded only with
    ``trust=True``, since unpickling runs whatever code the folder's writer put there.

    Examples
    --------
    >>> run = trajflow.open_run("runs/adk-rmsd")
    >>> run.results.rmsd
    >>> trajflow.open_run("runs/mine", trust=True).results.contacts   # a pickled object
    """
    return Run(path, trust)
