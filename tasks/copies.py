"""trajflow's own H5MD files of a trajectory: a segment per block (io split) or one
copy of it all (io h5md), written from MDAnalysis' frames exactly, under a
temporary name and renamed when whole. A run of chosen frames copies just those
(its positions are then the copies' rows)."""
import contextlib
import fcntl
import os
import time

import numpy as np

from .h5md import H5MDWriter
from .readers import is_continuous_chain
from .rundir import replaced_whole


def copy_frames(u, numbers, writer, timer, chunk_frames):
    """The frames `numbers` (global, in order) of the Universe's trajectory, every atom,
    into an H5MDWriter chunk by chunk: the float32 positions, boxes (each frame its own),
    time (cumulative over chained files, as `trajectory.time`; over a continuous chain
    the time written, as MDAnalysis' `trajectory.time` there counts the frames it
    dropped), each frame's written time, and step exactly as MDAnalysis gives them, and
    velocities and forces where the frames have them.
    No lossy re-encoding: a segment or copy is the input's data, bit for bit."""
    traj = u.trajectory
    continuous = is_continuous_chain(traj)
    n_atoms = len(u.atoms)
    for pos in range(0, len(numbers), chunk_frames):
        wanted = numbers[pos:pos + chunk_frames]
        n = len(wanted)
        contiguous = n == int(wanted[-1]) - int(wanted[0]) + 1 and np.all(np.diff(wanted) == 1)
        frames = traj[int(wanted[0]):int(wanted[-1]) + 1] if contiguous else traj[wanted]
        coords = np.empty((n, n_atoms, 3), np.float32)
        boxes = np.zeros((n, 6), np.float32)
        times = np.empty(n, np.float64)
        written = np.empty(n, np.float64)
        steps = np.empty(n, np.int64)
        extra = {name: np.empty((n, n_atoms, 3), np.float32) for name in writer.data if name != "position"}
        with timer.phase("io"):
            for i, ts in enumerate(frames):
                coords[i] = ts.positions
                times[i] = traj.time
                written[i] = ts.time
                steps[i] = ts.data.get("step", ts.frame)
                if ts.dimensions is not None:
                    boxes[i] = ts.dimensions
                if "velocity" in extra:
                    extra["velocity"][i] = ts.velocities
                if "force" in extra:
                    extra["force"][i] = ts.forces
        with timer.phase("convert"):
            writer.write(written if continuous else times, coords, boxes, steps,
                         extra.get("velocity"), extra.get("force"), written)


def new_writer(plan, u, path, n_frames, compression=None):
    """An H5MDWriter for all the Universe's atoms, with its velocities and forces if it
    has them, chunked for the plan's selection (h5md.chunk_shape)."""
    ts = u.trajectory.ts
    return H5MDWriter(path, len(u.atoms), n_frames, compression,
                      velocities=ts.has_velocities, forces=ts.has_forces,
                      selection_end=selection_end(plan))


def selection_end(plan):
    """One past the plan's last selected atom, or None (all atoms: a user analysis
    whose atoms are known only to its own code)."""
    try:
        indices = plan.load_selection().get("atom_indices")
    except (OSError, ValueError):
        return None
    return int(np.max(indices)) + 1 if indices is not None and len(indices) else None


def write_segment(plan, u, block, timer):
    """One block's frames, all atoms, into an H5MD file of their own."""
    start, stop = plan.blocks[block]
    with replaced_whole(plan.segment_path(block)) as tmp:
        writer = new_writer(plan, u, tmp, stop - start)
        try:
            copy_frames(u, plan.frame_numbers(start, stop), writer, timer,
                        plan.frames_per_chunk(len(u.atoms)))
        finally:
            writer.close()


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
        with replaced_whole(final) as tmp:
            writer = new_writer(plan, u, tmp, plan.n_frames, plan.compression)
            try:
                copy_frames(u, plan.frame_numbers(), writer, timer,
                            plan.frames_per_chunk(len(u.atoms)))
                writer.file.attrs[CONVERSION_SECONDS] = time.time() - timer.t_start
            finally:
                writer.close()


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
