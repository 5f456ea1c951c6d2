"""The reduce task: join the parts in frame order, check them, publish result.h5.

A result is written only when every frame 0..n-1 is present exactly once and
every part was made from this run's inputs and selection; result.h5 appears
by rename, so a file by that name is always whole.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

from . import faults, mda_analyses
from .analyses import ANALYSIS_CLASSES
from .exit_codes import ANALYSIS_RAISED, INCOMPLETE_PARTS
from .parts import DamagedPart, read_part
from .plan import RunPlan, decode_path_arg
from .rundir import mark_started, replaced_whole
from .timing import RankTimer


class IncompleteResult(Exception):
    pass


def expected_parts(plan):
    return plan.execution.part_paths(plan)


def remove_parts(plan):
    """The parts, once result.h5 holds them: the result is the run's one copy (the
    demo's dihedrals were stored twice, 64 MB in parts/ and 64 MB in result.h5)."""
    for path in expected_parts(plan):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def combine_rules(plan):
    """{result: Combine} of the run's analysis: a built-in's declared rules, or a user
    analysis' part layout (its class' aggregator merges the results themselves)."""
    if plan.builtin:
        return ANALYSIS_CLASSES[plan.analysis].combine
    return mda_analyses.PART_COMBINE


def join_parts(plan):
    """Read and check every part; return (arrays in frame order, analysis attrs)."""
    missing = [p for p in expected_parts(plan) if not os.path.exists(p)]
    if missing:
        raise IncompleteResult(f"{len(missing)} part(s) missing, e.g. {missing[0]}")
    pieces, attrs = [], None
    for path in expected_parts(plan):
        try:
            arrays, a = read_part(path)
        except DamagedPart as exc:
            raise IncompleteResult(f"{exc}; trajflow run --resume analyses its blocks again")
        if a.get("input_checksum") != plan.input_checksum:
            raise IncompleteResult(f"{path} was made from other inputs")
        if a.get("selection") != plan.selection or a.get("analysis") != plan.analysis:
            raise IncompleteResult(f"{path} was made with another analysis or selection")
        for block_id, (start, stop) in zip(a["block_ids"], a["blocks"]):
            if list(plan.blocks[block_id]) != [start, stop]:
                raise IncompleteResult(f"{path}: block {block_id} is {start}-{stop}, "
                                       f"the plan says {plan.blocks[block_id]}")
        pieces.append((a["block_ids"][0], arrays))
        attrs = a
    # parts in block order: blocks are contiguous, so frames come in order (and a
    # user analysis' per-block results in the order its aggregator expects)
    pieces = [arrays for _, arrays in sorted(pieces, key=lambda p: p[0])]
    rules = combine_rules(plan)
    unruled = sorted(set(pieces[0]) - set(rules))
    if unruled:
        raise IncompleteResult(f"result {unruled[0]!r} has no declared rule to combine its "
                               f"pieces ({plan.analysis} declares {', '.join(sorted(rules))})")
    joined = {k: rules[k].merge([p[k] for p in pieces]) for k in pieces[0]}
    if not np.array_equal(joined["frame"], plan.frame_numbers()):
        n_seen = len(np.unique(joined["frame"]))
        what = "the chosen frames" if plan.frame_selection else f"0..{plan.n_frames - 1}"
        raise IncompleteResult(f"frames are not {what} exactly once, in order "
                               f"({len(joined['frame'])} rows, {n_seen} distinct frames)")
    return joined, attrs


def package_versions():
    import importlib.metadata as md
    out = {}
    for name in ("trajflow", "MDAnalysis", "numpy", "h5py", "mpi4py", "radical.pilot", "radical.entk"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def write_result(tmp, plan, arrays, analysis_attrs, results=None):
    """result.h5's content, into `tmp` (published by the caller): `frame`, `time`,
    then the kernels' arrays (rmsd, dihedrals) or, for a user's analysis, its
    concluded `results` under /results."""
    with h5py.File(tmp, "w") as f:
        f.create_dataset("frame", data=arrays["frame"].astype(np.int64))
        f.create_dataset("time", data=arrays["time"].astype(np.float64))
        f["time"].attrs["unit"] = "ps"
        if results is not None:
            mda_analyses.write_results(f.create_group("results"), results)
        else:
            kind = ANALYSIS_CLASSES[plan.analysis]
            for key, value in kind.datasets(arrays).items():
                f.create_dataset(key, data=np.asarray(value, dtype=np.float64))
                if key in kind.units:
                    f[key].attrs["unit"] = kind.units[key]
                if key in kind.columns:
                    f[key].attrs["columns"] = kind.columns[key]
        if "resids" in analysis_attrs:
            f.create_dataset("resid", data=np.asarray(analysis_attrs["resids"], dtype=np.int64))
        root = {
            "analysis": plan.analysis, "selection": plan.selection,
            "topology": plan.topology, "trajectories": json.dumps(plan.trajectories),
            "io": plan.io, "mode": plan.mode, "gather": plan.gather, "schedule": plan.schedule,
            "n_blocks": plan.n_blocks, "blocks": json.dumps(plan.blocks),
            "ranks": plan.execution.ranks_per_task(plan),
            "tasks": len(plan.execution.analyze_tasks(plan, [])),
            "repeat": plan.repeat, "n_frames": plan.n_frames,
            "input_checksum": plan.input_checksum, "compression": plan.compression or "none",
            "versions": json.dumps(package_versions()),
        }
        if plan.frame_selection:  # MDAnalysis' run(start, stop, step) or run(frames=)
            root["frame_selection"] = json.dumps(plan.frame_selection)
        if plan.universe:  # the MDAnalysis Universe keywords the files were read with
            root["universe"] = json.dumps(plan.universe)
        if plan.truncated:  # say so wherever the result goes
            root["truncated_input"] = json.dumps(plan.truncated)
        if not plan.builtin:
            root.update(analysis_args=json.dumps(plan.analysis_args),
                        analysis_class=analysis_attrs.get("analysis_class", ""),
                        factory=json.dumps(plan.factory))
        for key, value in root.items():
            f.attrs[key] = value


def publish(plan, within_task=None, rank=0):
    """Join the parts, publish result.h5, remove the parts; the task's exit code.

    The reduce task's whole work, and the MPI analyze task's last (its gather's root
    publishes what it has just written: no reduce process, no stage hand-off, 0.3 s
    of a small run). `within_task`: the task it runs in, whose RADICAL launch it is
    not (its record says so, and has no launch of its own), `rank` that task's rank."""
    mark_started(plan.workdir, "reduce")
    timer = RankTimer("reduce", rank=rank, within_task=within_task)
    try:
        with timer.phase("io"):
            arrays, attrs = join_parts(plan)
    except IncompleteResult as exc:
        print(f"reduce: no result written: {exc}", file=sys.stderr)
        return INCOMPLETE_PARTS
    results = None
    if not plan.builtin:  # merge the blocks with the class' aggregator, then _conclude()
        with timer.phase("compute"):
            try:
                results = mda_analyses.conclude(plan, arrays).results
            except mda_analyses.AnalysisRaised as exc:
                mda_analyses.print_users_traceback(exc)
                return ANALYSIS_RAISED
    with replaced_whole(plan.result_path()) as tmp:
        with timer.phase("write"):
            write_result(tmp, plan, arrays, attrs, results)
        # its timing record before its result is published: once result.h5 is there the
        # run is complete, and a disk that fills then must not fail it (CI: the record's
        # write failed just after the publish, and the run failed with its result whole
        # and its parts removed); a record not written leaves no result
        timer.finish(plan.profile_path("reduce"))
    remove_parts(plan)
    faults.linger_after_publish()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.reduce",
                                description="Join the analyze parts into result.h5 (runs inside the pilot).")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    args = p.parse_args(argv)
    return publish(RunPlan.load(decode_path_arg(args.plan)))


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
