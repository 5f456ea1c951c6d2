"""When a run is long enough for its numbers to be judged.

Two questions, two rules, kept here side by side:

- its stragglers: its analyze ranks ran long enough (MIN_ANALYSIS_S) to tell a
  late rank from the noise of starting processes;
- its strategy and its CPU wait: its analysis itself (the slowest rank's open,
  I/O and compute) took MIN_ANALYSIS_S and MIN_ANALYSIS_SHARE of the run's wall
  time; below that, the pilot and the launch decide the run's time, not --io,
  --mode or the rank count.
"""
from trajflow.workflows.profile.wall_time import QUEUED, WAITING_FOR_CORES
MIN_ANALYSIS_S = 2.0      # an analysis shorter than this is noise beside a task's start-up
MIN_ANALYSIS_SHARE = 0.1  # ... as is one under this share of the run's wall time
OTHERS_TIME = (QUEUED, WAITING_FOR_CORES)  # of a run's wall time, what other runs took


def stragglers_not_judged(records):
    """Why the stragglers of one run's records are not judged, or None where they are."""
    ranks = [r for r in records if r["task"] == "analyze"]
    if not ranks:
        return None
    span = max(r["t_stop"] for r in ranks) - min(r["t_start"] for r in ranks)
    if span >= MIN_ANALYSIS_S:
        return None
    return (f"its analyze ranks ran {span:.2f} s, too short to tell a straggler from "
            f"start-up noise ({MIN_ANALYSIS_S:.0f} s at least)")


def too_short_for_advice(times) -> bool:
    """Whether a run's analysis (run_times) is too short for its strategy or its CPU
    wait to be judged: its share is of the run's own wall time, not of what it waited
    for other runs (in the pilot's queue, or for cores they held)."""
    parts = (times.get("wall") or {}).get("parts", {})
    own = times["whole"] - sum(parts.get(p, 0.0) for p in OTHERS_TIME)
    return times["analysis"] < max(MIN_ANALYSIS_S, MIN_ANALYSIS_SHARE * own)
