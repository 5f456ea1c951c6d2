"""Whether a run's inputs are still the files it was planned on: each file's size and
modification time, as the plan recorded them.

A stat per file is cheap enough for every task and every rank, so a run whose io reads
the inputs as they are (--io shared) needs no split stage to refuse a trajectory that
was replaced or rewritten after planning. (The workstation's resume check hashes the
files' ends too: workflows/run/planning.input_checksum.)
"""
import os
from typing import List, Sequence


def input_stats(paths: Sequence[str]) -> List[List[int]]:
    """[size in bytes, modification time in ns] of each path, in order."""
    return [[st.st_size, st.st_mtime_ns] for st in (os.stat(p) for p in paths)]


def check_unchanged(plan, stage: str) -> None:
    """SystemExit naming the first input that is gone or changed since `plan` was
    planned; nothing for a plan that recorded no stats (written before they were)."""
    if not plan.input_stats:
        return
    paths = [plan.topology] + list(plan.trajectories)
    for path, (size, mtime_ns) in zip(paths, plan.input_stats):
        try:
            st = os.stat(path)
        except OSError as exc:
            raise SystemExit(f"{stage}: input {path!r} cannot be read now ({exc.strerror}); "
                             "restore it, or plan the run again") from None
        if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            raise SystemExit(f"{stage}: input {path!r} changed since the run was planned "
                             f"({st.st_size} bytes now, {size} planned; or its modification "
                             "time differs); its frames cannot be mixed with the plan's: "
                             "plan the run again")
