"""The split task: prepare the trajectory for the analyze stage, per io strategy.

  shared: check the inputs still have the frames and atoms the plan counted;
  split:  write one trajectory segment per block (H5MD: the input's float32 data, exact) (Khoshlessan et al. 2019, section 6.5.1),
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
from .plan import RunPlan, chunk_size, decode_path_arg
from .readers import open_universe
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


def copy_frames(u, start, stop, writer, timer, chunk_frames):
    """Frames [start, stop) of the Universe's trajectory, every atom, into an
    H5MDWriter chunk by chunk: the float32 positions, boxes (each frame its own),
    time (cumulative over chained files, as `trajectory.time`) and step exactly as
    MDAnalysis gives them, and velocities and forces where the frames have them.
    No lossy re-encoding: a segment or copy is the input's data, bit for bit."""
    traj = u.trajectory
    n_atoms = len(u.atoms)
    for pos in range(start, stop, chunk_frames):
        end = min(pos + chunk_frames, stop)
        n = end - pos
        coords = np.empty((n, n_atoms, 3), np.float32)
        boxes = np.zeros((n, 6), np.float32)
        times = np.empty(n, np.float64)
        steps = np.empty(n, np.int64)
        extra = {name: np.empty((n, n_atoms, 3), np.float32) for name in writer.data if name != "position"}
        with timer.phase("io"):
            for i, ts in enumerate(traj[pos:end]):
                coords[i] = ts.positions
                times[i] = traj.time
                steps[i] = ts.data.get("step", ts.frame)
                if ts.dimensions is not None:
                    boxes[i] = ts.dimensions
                if "velocity" in extra:
                    extra["velocity"][i] = ts.velocities
                if "force" in extra:
                    extra["force"][i] = ts.forces
        with timer.phase("convert"):
            writer.write(times, coords, boxes, steps, extra.get("velocity"), extra.get("force"))


def new_writer(u, path, n_frames, compression=None):
    """An H5MDWriter for all the Universe's atoms, with its velocities and forces if it has them."""
    ts = u.trajectory.ts
    return H5MDWriter(path, len(u.atoms), n_frames, compression,
                      velocities=ts.has_velocities, forces=ts.has_forces)


def write_segment(plan, u, block, timer):
    """One block's frames, all atoms, into an H5MD file of their own."""
    start, stop = plan.blocks[block]
    final = plan.segment_path(block)
    tmp = f"{final}.tmp{os.getpid()}"
    writer = new_writer(u, tmp, stop - start)
    try:
        copy_frames(u, start, stop, writer, timer, chunk_size(plan.chunk_frames, len(u.atoms)))
    finally:
        writer.close()
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
        writer = new_writer(u, tmp, plan.n_frames, plan.compression)
        try:
            copy_frames(u, 0, plan.n_frames, writer, timer, chunk_size(plan.chunk_frames, len(u.atoms)))
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
    plan.io_strategy.prepare(plan, u, my_blocks(plan, args.block, rank, size), rank, timer)
    if rank == 0 and args.block in (None, 0):
        manifest = {"io": plan.io, "n_frames": plan.n_frames, "n_atoms": plan.n_atoms}
        with open(plan.path("split", "manifest.json"), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
    timer.finish(plan.profile_path(name))
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
