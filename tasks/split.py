"""The split task: prepare the trajectory for the analyze stage, per io strategy.

  shared: check the inputs still have the frames and atoms the plan counted;
  split:  write one trajectory segment per block (Khoshlessan et al. 2019, section 6.5.1),
          blocks shared round-robin over the MPI ranks or one block per task;
  h5md:   convert to one H5MD file with chunks of one frame (Jakupovic and Beckstein 2021).
Every output is written under a temporary name and renamed when whole.
"""
import argparse
import contextlib
import fcntl
import json
import os
import time

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


CONVERSION_SECONDS = "trajflow_conversion_s"  # a root attribute of the H5MD copy


def convert_h5md(plan, u, timer):
    """All frames, all atoms, into one H5MD file, chunk by chunk. A campaign's shared
    copy is made once: the first task converts under a lock, the others wait for
    it and reuse it, recording the converting task's time (kept in the file) so
    that strategies still compare with the conversion counted."""
    final = plan.h5md_path()
    os.makedirs(os.path.dirname(final), exist_ok=True)
    with exclusive(final + ".lock") if plan.shared_h5md else contextlib.nullcontext():
        if os.path.exists(final):  # written whole and renamed, so complete
            timer.info["conversion_reused_s"] = reuse_h5md(plan, final)
            return
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
            writer.file.attrs[CONVERSION_SECONDS] = time.time() - timer.t_start
        finally:
            writer.close()
        os.replace(tmp, final)


def reuse_h5md(plan, path):
    """The seconds the existing copy took to make, once it is checked to hold the plan's frames."""
    import h5py
    with h5py.File(path, "r") as f:
        shape = f["particles/trajectory/position/value"].shape
        seconds = float(f.attrs.get(CONVERSION_SECONDS, 0.0))
    if shape != (plan.n_frames, plan.n_atoms, 3):
        raise SystemExit(f"split: the H5MD copy {path} holds {shape[0]} frames of {shape[1]} "
                         f"atoms, the plan {plan.n_frames} of {plan.n_atoms}: it was made "
                         "from other inputs; delete it and run again")
    return seconds


@contextlib.contextmanager
def exclusive(path):
    """flock(2) on `path` while inside. Where the file system has no locks, none:
    two tasks then both convert and the last rename wins (same content)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)


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
