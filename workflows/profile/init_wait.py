"""The wait inside MPI_Init: what a rank spent there until the last rank came.

MPI_Init returns on all ranks at about one moment, once the last rank has come
(the process manager's fence). A rank that came early spends the difference
waiting for the late ones, as it does at the barrier after its work: it is
their doing, not its own set-up. Counted as set-up, it made every rank as slow
as the slowest: a node whose ranks took 9 s more to import (a CPU quota) made
the other nodes' ranks spend 12 s in MPI_Init, and the straggler judge saw
them all alike (a CI run's slow-node test, 2026-11).

The last rank to come spent the least there: MPI_Init's own cost. What each rank
spent beyond it is moved from its `t_setup` to its `t_wait` (and `t_init_wait`
says how much), and its timeline draws it as a wait, where it began: when the
rank entered MPI_Init. The record's `setup_parts` keep what the rank measured.
An MPI_Init after the rank's chunks (a dynamic schedule's early start) is timed as
a wait already, and is left as it is.
"""
import itertools

from trajflow.tasks.rundir import is_finite_number
from trajflow.tasks.timing import MPI_INIT_PART as INIT_PART

LEAST_S = 1e-6         # a wait shorter than this is left where it is


def _init_seconds(rec):
    """The rank's seconds in an MPI_Init of its set-up, or None where there is none to
    judge: not an MPI rank of several, not trajflow's marks (a foreign or damaged
    record), or an MPI_Init after the rank's chunks (`mpi_init_after_chunks`: timed
    inside its wait phase already, tasks/analyze.py late_mpi_init)."""
    parts = rec.get("setup_parts")
    if (not isinstance(parts, dict) or rec.get("mpi_init_after_chunks")
            or not isinstance(rec.get("size"), int) or rec["size"] < 2):
        return None
    if INIT_PART not in parts or not all(_seconds(v) for v in parts.values()):
        return None
    if not all(_seconds(rec.get(key)) for key in ("t_setup", "t_wait", "t_start")):
        return None
    return parts[INIT_PART]


def _seconds(value):
    return is_finite_number(value) and value >= 0


def attribute_init_waits(records):
    """Move each MPI rank's wait in MPI_Init from its set-up to its wait, per MPI task
    (its RADICAL session and task id, and the task's name): only where the task's
    records are one launch's (ranks 0 .. size-1, each once; a folder's profile files
    may hold an older attempt's too, without ids) and the wait can be drawn."""
    tasks = {}
    for rec in records:
        seconds = _init_seconds(rec)
        if seconds is not None:
            key = (rec["task"], rec.get("rp_session"), rec.get("rp_task_id"), rec["size"])
            tasks.setdefault(key, []).append((rec, seconds))
    for (_, _, _, size), ranks in tasks.items():
        if sorted(rec.get("rank") for rec, _ in ranks) != list(range(size)):
            continue
        own_cost = min(seconds for _, seconds in ranks)
        for rec, seconds in ranks:
            wait = min(seconds - own_cost, rec["t_setup"])
            if wait > LEAST_S:
                _move_to_wait(rec, wait)


def _move_to_wait(rec, wait):
    """Split the set-up interval that holds the wait (from where the rank entered
    MPI_Init), then move the seconds; nothing where no interval holds it."""
    parts = rec["setup_parts"]
    before = itertools.takewhile(lambda part: part[0] != INIT_PART, parts.items())
    entered = rec["t_start"] + sum(seconds for _, seconds in before)
    intervals = rec.get("intervals") or []
    for i, interval in enumerate(intervals):
        name, a, b = interval
        if name == "setup" and a <= entered and entered + wait <= b + LEAST_S:
            pieces = [("setup", a, entered), ("wait", entered, min(b, entered + wait)),
                      ("setup", min(b, entered + wait), b)]
            intervals[i:i + 1] = [list(p) for p in pieces if p[2] > p[1]]
            break
    else:
        return
    rec["t_init_wait"] = wait
    rec["t_setup"] -= wait
    rec["t_wait"] += wait

