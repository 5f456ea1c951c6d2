"""One part of an MDAnalysis run() handed to trajflow.Backend (runs inside the pilot).

MDAnalysis' run(backend=...) splits the frames into computation groups and
asks its backend to apply `_compute` to each. trajflow.Backend writes the
bound `_compute` (cloudpickle: the analysis object with its Universe) and
each group into RUNDIR/backend/; here one task runs one group, its frame loop
timed like every analyze rank's (io and compute apart, the same record in
RUNDIR/profile/), and hands back what MDAnalysis merges: frames, times,
results. The part task that finds every part written then collects (`--collect`, the
reduce task, where only that is left): it checks every part is there and whole and puts
them, in order and still pickled, into results.pickle, whose presence means the run is
complete (`read_pieces` unpickles them where they are used: a collect never imports
MDAnalysis for it, 0.35-0.45 s of the collect task's 0.7 s).

  python -m trajflow.tasks.backend_part --plan PLAN --part I
  python -m trajflow.tasks.backend_part --plan PLAN --collect
"""
import argparse
import os
import pickle
import types
import warnings

import numpy as np

from . import faults, mda_analyses
from .exit_codes import ANALYSIS_RAISED
from .modes import TasksMode
from .plan import RunPlan, decode_path_arg
from .rundir import mark_started, replaced_whole
from .timing import RankTimer


def function_path(plan):
    return plan.path("backend", "compute.pickle")


def group_path(plan, part):
    return plan.path("backend", f"group_{part:05d}.npy")


def part_path(plan, part):
    return plan.path("parts", f"backend_{part:05d}.pickle")


def _write_pickle(path, obj):
    with replaced_whole(path) as tmp, open(tmp, "wb") as fh:  # streamed: results may be large
        pickle.dump(obj, fh, protocol=pickle.HIGHEST_PROTOCOL)


def run_part(plan, part):
    import cloudpickle
    faults.maybe_fail(plan.workdir, part)
    timer = RankTimer("analyze", rank=0, size=1, block=part, mode=TasksMode.name,
                      progress_path=plan.progress_path(part))
    with timer.phase("open_topology"):  # the analysis and its Universe, unpickled
        with open(function_path(plan), "rb") as fh:
            compute = cloudpickle.load(fh)
        group = np.load(group_path(plan, part))
    analysis = compute.func.__self__  # functools.partial(analysis._compute, ...)
    mda_analyses.time_frame_loop(analysis, timer, part)
    with warnings.catch_warnings(), mda_analyses.users_code(type(analysis).__name__):
        warnings.simplefilter("ignore")
        done = compute(group)
    timer.info.update(frames=len(group))
    with timer.phase("comm"):  # handed to reduce as a file, as tasks mode does
        _write_pickle(part_path(plan, part), types.SimpleNamespace(
            frames=done.frames, times=done.times, results=done.results))
    timer.finish(plan.profile_path(f"analyze.block_{part:05d}"))


def collect(plan, within_task=None):
    """results.pickle from the parts (see the module's docstring); `within_task`: done
    by a part task, which found every part written."""
    mark_started(plan.workdir, "reduce")
    timer = RankTimer("reduce", within_task=within_task)
    with timer.phase("io"):
        missing = [p for p in range(plan.n_blocks) if not os.path.exists(part_path(plan, p))]
        if missing:
            raise SystemExit(f"backend collect: parts {missing} are missing; the run is "
                             "not complete")
        pieces = []
        for p in range(plan.n_blocks):
            with open(part_path(plan, p), "rb") as fh:
                pieces.append(fh.read())
            if not _whole_pickle(pieces[-1]):
                raise SystemExit(f"backend collect: {part_path(plan, p)} is not a whole "
                                 "pickle; the run is not complete")
    with timer.phase("write"):
        _write_pickle(plan.result_path(), pieces)
    timer.finish(plan.profile_path("reduce"))


def _whole_pickle(data):
    """Whether `data` is one complete pickle stream, read opcode by opcode (nothing in it
    is run or built)."""
    import pickletools
    try:
        last = None
        for last, _, _ in pickletools.genops(data):
            pass
    except Exception:  # noqa: a truncated or foreign stream, whatever genops raises
        return False
    return last is not None and last.name == "STOP"


def read_pieces(path):
    """The parts a collect put in results.pickle, in order (each unpickled: only for a
    run whose writer is trusted; a folder of trajflow before 0.19 holds them unpickled
    already). Each part's bytes are let go once it is unpickled: the peak stays near one
    copy of the results."""
    with open(path, "rb") as fh:
        raw = pickle.load(fh)
    raw.reverse()
    pieces = []
    while raw:
        piece = raw.pop()
        pieces.append(pickle.loads(piece) if isinstance(piece, bytes) else piece)
    return pieces


def concluded(plan):
    """The analysis of a finished run, as MDAnalysis' run() leaves it after its backend's
    apply: the parts' frames and times joined, their results merged by the class' own
    aggregator, then _conclude() (how a reopened run gets its results)."""
    import cloudpickle
    with open(function_path(plan), "rb") as fh:
        analysis = cloudpickle.load(fh).func.__self__
    pieces = read_pieces(plan.result_path())
    analysis.frames = np.hstack([p.frames for p in pieces])
    analysis.times = np.hstack([p.times for p in pieces])
    analysis.n_frames = len(analysis.frames)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis.results = analysis._get_aggregator().merge([p.results for p in pieces])
        analysis._conclude()
    return analysis


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.backend_part",
                                description="One part of an MDAnalysis run() on trajflow.Backend.")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--part", type=int, help="the computation group to run")
    group.add_argument("--collect", action="store_true", help="gather the parts, in order")
    args = p.parse_args(argv)
    plan = RunPlan.load(decode_path_arg(args.plan))
    if args.collect:
        collect(plan)
        return 0
    mark_started(plan.workdir, "analyze")
    try:
        run_part(plan, args.part)
    except mda_analyses.AnalysisRaised as exc:  # not retried: it would raise again
        mda_analyses.print_users_traceback(exc)
        return ANALYSIS_RAISED
    if all(os.path.exists(part_path(plan, p)) for p in range(plan.n_blocks)):
        # every part is there (this one written last, or at the same time as another,
        # which collects too: the same bytes, published by rename): collect them here,
        # with no reduce task to start and no stage hand-off (0.3-0.5 s of a small run)
        collect(plan, within_task="analyze")
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
