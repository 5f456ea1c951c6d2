"""The split task: prepare the trajectory for the analyze stage, per io strategy.

  shared: check the inputs still have the frames and atoms the plan counted;
  split:  write one trajectory segment per block (Khoshlessan et al. 2019, section 6.5.1),
          blocks shared round-robin over the MPI ranks or one block per task;
  h5md:   convert to one H5MD file with chunks of one frame (Jakupovic and Beckstein 2021).
Every output is written under a temporary name and renamed when whole.
"""
import argparse
import json
import os
import sys

import numpy as np

from .h5md import H5MDWriter
from .plan import RunPlan, chunk_size, decode_path_arg, segment_format
from .readers import TrajectoryBlockReader, open_universe
from .timing import RankTimer


def check_inputs(plan, timer):
    u = open_universe(plan.topology, plan.trajectories, timer)
    n_frames, n_atoms = u.trajectory.n_frames, len(u.atoms)
    planned = plan.truncated["frames_in_files"] if plan.truncated else plan.n_frames
    if (n_frames, n_atoms) != (planned, plan.n_atoms):
        raise SystemExit(f"split: inputs changed since the run was planned: {n_frames} frames "
                         f"and {n_atoms} atoms now, {planned} and {plan.n_atoms} planned; "
                         "plan the run again")
    return u


def write_segment(plan, u, block, timer):
    """One block's frames, all atoms, into their own file; times into a sidecar."""
    import MDAnalysis as mda
    start, stop = plan.blocks[block]
    final = plan.segment_path(block)
    root, ext = os.path.splitext(final)
    tmp = f"{root}.tmp{os.getpid()}{ext}"
    times = np.empty(stop - start, dtype=np.float64)
    boxes = np.zeros((stop - start, 6), dtype=np.float32)
    with timer.phase("write"):
        with mda.Writer(tmp, n_atoms=len(u.atoms), format=segment_format(plan.trajectories[0])) as w:
            for i, ts in enumerate(u.trajectory[start:stop]):
                times[i] = u.trajectory.time  # cumulative over chained files
                if ts.dimensions is not None:
                    boxes[i] = ts.dimensions
                w.write(u.atoms)
        sidecar = {"time": times}
        if boxes.any():  # XTC/TRR keep the box as float32 vectors: 1 ulp off after the round trip
            sidecar["dimensions"] = boxes
        tmp_frames = plan.segment_frames_path(block) + f".tmp{os.getpid()}.npz"
        np.savez(tmp_frames, **sidecar)
        os.replace(tmp_frames, plan.segment_frames_path(block))
        os.replace(tmp, final)


def convert_h5md(plan, u, timer):
    """All frames, all atoms, into one H5MD file, chunk by chunk."""
    final = plan.h5md_path()
    tmp = f"{final}.tmp{os.getpid()}"
    # the box of every frame goes with it: an H5MD without it would silently
    # give analyses that apply the minimum image the wrong answer
    periodic = u.trajectory.ts.dimensions is not None
    reader = TrajectoryBlockReader(u.trajectory, np.arange(len(u.atoms)), need_boxes=periodic)
    writer = H5MDWriter(tmp, len(u.atoms), plan.n_frames, plan.compression, periodic=periodic)
    try:
        chunks = reader.chunks(0, plan.n_frames, chunk_size(plan.chunk_frames, len(u.atoms)))
        while True:
            with timer.phase("io"):
                chunk = next(chunks, None)
            if chunk is None:
                break
            with timer.phase("convert"):
                writer.write(chunk.times, chunk.coords, chunk.boxes, chunk.steps)
    finally:
        writer.close()
    os.replace(tmp, final)


def my_blocks(plan, block, rank, size):
    if block is not None:
        return [block]
    return list(range(rank, plan.n_blocks, size))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.split",
                                description="Prepare the trajectory for analysis (runs inside the pilot).")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    p.add_argument("--block", type=int, help="split io, tasks mode: the block to write")
    p.add_argument("--mpi", action="store_true", help="share the blocks over MPI ranks")
    args = p.parse_args(argv)
    plan = RunPlan.load(decode_path_arg(args.plan))
    rank, size = 0, 1
    if args.mpi:
        from mpi4py import MPI
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.makedirs(plan.path("split"), exist_ok=True)
    name = f"split.{plan.io}" + (f".block_{args.block:05d}" if args.block is not None else f".rank_{rank:05d}")
    timer = RankTimer("split", rank=rank, size=size, io=plan.io)
    u = check_inputs(plan, timer)
    if plan.io == "split":
        for b in my_blocks(plan, args.block, rank, size):
            write_segment(plan, u, b, timer)
    elif plan.io == "h5md" and rank == 0:
        convert_h5md(plan, u, timer)
    if rank == 0 and args.block in (None, 0):
        manifest = {"io": plan.io, "n_frames": plan.n_frames, "n_atoms": plan.n_atoms}
        with open(plan.path("split", "manifest.json"), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
    timer.finish(plan.profile_path(name))
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
