"""The local trial of a user's analysis: what the tasks will do, on the first frames,
in a fresh Python on the workstation, before any pilot is requested.

    python -P -m trajflow.tasks.trial --plan PLAN --frames N

It loads the analysis as an analyze task does (RUNDIR/analysis/ of a staged
plan: the factory file's copy and the modules beside it, or the pickled
callable), with none of the user's folders on its path (-P, and run from the
staging folder), builds it on the inputs, runs its first N frames as MDAnalysis'
parallel run() does (two pieces on copies, `_prepare`, `_single_frame`, the
aggregator, `_conclude`: a result with no rule to combine it is named here), and
checks its results pickle as they must to travel from the analyze tasks to
reduce. `--frames 0`: load the analysis only (the data is not readable here).

Exit 0 and one JSON line {"frames": n, "seconds": s}; exit_codes.ANALYSIS_RAISED
with the traceback when the analysis' own code raised; 1 for anything else
(a module the analysis needs that is not there, an unreadable input).
"""
import argparse
import json
import pickle
import time

from . import mda_analyses
from .exit_codes import ANALYSIS_RAISED
from .plan import RunPlan

TRIAL_PIECES = 2  # the trial's frames in two pieces, merged by the analysis' own rules


def trial(plan, frames):
    """(frames run, seconds they took); AnalysisRaised if the analysis' code raised."""
    if frames == 0:
        with mda_analyses.users_code("loading the analysis"):
            mda_analyses.load_factory(*mda_analyses.plan_factory(plan))
        return 0, 0.0
    u, analysis = mda_analyses.open_analysis(plan, (plan.topology, plan.trajectories))
    chosen = plan.frame_numbers()[:frames]  # the run's first frames
    n = len(chosen)
    t0 = time.perf_counter()
    # in pieces, as the tasks run it: a result with no rule to combine it is found here
    mda_analyses.run_in_pieces(analysis, u, chosen, min(TRIAL_PIECES, n))
    seconds = time.perf_counter() - t0
    try:
        pickle.loads(pickle.dumps(analysis.results, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:
        raise mda_analyses.AnalysisRaised(
            f"{type(analysis).__name__}'s results cannot be pickled ({type(exc).__name__}: "
            f"{exc}); they travel from the analyze tasks to reduce pickled: keep numbers, "
            "arrays and plain containers in analysis.results") from exc
    u.trajectory.close()
    return n, seconds


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.trial",
                                description="Try a user's analysis on the first frames "
                                            "(on the workstation, before any pilot).")
    p.add_argument("--plan", required=True, help="a staged plan.json")
    p.add_argument("--frames", type=int, required=True,
                   help="frames to run (0: load only); the workstation's TRIAL_FRAMES")
    args = p.parse_args(argv)
    plan = RunPlan.load(args.plan)
    try:
        n, seconds = trial(plan, args.frames)
    except mda_analyses.AnalysisRaised as exc:
        mda_analyses.print_users_traceback(exc)
        return ANALYSIS_RAISED
    print(json.dumps({"frames": n, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
