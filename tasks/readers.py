"""Block readers: frames [start, stop) of the atoms an analysis needs, a chunk at a time.

Every reader yields `Chunk`s of at most `chunk_frames` frames, so a rank's
memory is bounded by the chunk whatever the trajectory's length. Three paths:
- MDAnalysis readers (DCD, XTC, TRR, any format it reads; several files as one
  ChainReader trajectory): DCD through `timeseries` (bulk, in C), the rest
  frame by frame, copying only the wanted atoms;
- split segments: the same, shifted to global frame numbers, times from the
  split stage's sidecar;
- H5MD: h5py hyperslabs (see h5md.py).
"""
import dataclasses
from typing import Iterator, Optional

import contextlib
import warnings

import numpy as np
# Imported with the module, not in the timed open: interpreter start-up and
# imports happen before a rank's clock starts (RADICAL's rank_start shows them).
import MDAnalysis as mda
from MDAnalysis.coordinates.memory import MemoryReader

from .h5md import H5MDBlockReader


@dataclasses.dataclass
class Chunk:
    frames: np.ndarray          # (F,) int64 global frame numbers
    times: np.ndarray           # (F,) float64, ps, as MDAnalysis' ts.time
    coords: np.ndarray          # (F, A, 3) float32, Å, the wanted atoms only
    boxes: Optional[np.ndarray]  # (F, 6) float32 or None

    @property
    def nbytes(self) -> int:
        return self.coords.nbytes


def open_universe(topology, trajectories, timer=None):
    """Open topology and trajectory as two timed steps (t_open_topology, t_open_trajectory)."""
    phase = timer.phase if timer is not None else (lambda name: contextlib.nullcontext())
    warnings.filterwarnings("ignore", module="MDAnalysis")
    with phase("open_topology"):
        u = mda.Universe(topology)
    with phase("open_trajectory"):
        trajectories = list(trajectories)
        u.load_new(trajectories[0] if len(trajectories) == 1 else trajectories)
    return u


def open_topology(topology, timer):
    """A Universe of the topology alone, for strategies that read coordinates with h5py.

    A topology without coordinates (PSF) gets a one-frame in-memory placeholder,
    because MDAnalysis' analysis set-up (Ramachandran) expects a trajectory.
    """
    warnings.filterwarnings("ignore", module="MDAnalysis")
    with timer.phase("open_topology"):
        u = mda.Universe(topology)
        if not hasattr(u, "trajectory"):
            u.load_new(np.zeros((1, len(u.atoms), 3), dtype=np.float32), format=MemoryReader)
    return u


class UniverseBlockReader:
    """Chunks of a Universe's trajectory, one sub-reader at a time for chained files."""

    def __init__(self, universe, atom_indices, need_boxes=False, frame_offset=0, times=None):
        self.u = universe
        self.idx = np.asarray(atom_indices, dtype=np.intp)
        self.need_boxes = need_boxes
        self.frame_offset = frame_offset  # global number of this trajectory's frame 0
        self.times = times                # overrides readers' times (split segments)
        traj = universe.trajectory
        self.parts = list(traj.readers) if hasattr(traj, "readers") else [traj]
        sizes = [r.n_frames for r in self.parts]
        self.part_starts = np.concatenate([[0], np.cumsum(sizes)])

    @property
    def n_frames(self):
        return int(self.part_starts[-1])

    def chunks(self, start, stop, chunk_frames) -> Iterator[Chunk]:
        """Yield chunks covering local frames [start, stop) of this trajectory."""
        for pos in range(start, stop, chunk_frames):
            end = min(pos + chunk_frames, stop)
            pieces = [self._read_in_part(p, max(pos, a) - a, min(end, b) - a)
                      for p, (a, b) in enumerate(zip(self.part_starts[:-1], self.part_starts[1:]))
                      if a < end and b > pos]
            times = np.concatenate([t for t, _, _ in pieces])
            coords = np.concatenate([c for _, c, _ in pieces])
            boxes = None if pieces[0][2] is None else np.concatenate([b for _, _, b in pieces])
            if self.times is not None:
                times = np.asarray(self.times[pos:end], dtype=np.float64)
            elif len(self.parts) > 1:
                times = self._chain_times(pos, end)
            frames = np.arange(pos, end, dtype=np.int64) + self.frame_offset
            yield Chunk(frames, times, coords, boxes)

    def _chain_times(self, start, stop):
        """ChainReader's cumulative time (`trajectory.time`, what rms.RMSD reports):
        the earlier files' total times plus this file's frames times its dt."""
        traj = self.u.trajectory
        frames = np.arange(start, stop)
        part = np.searchsorted(self.part_starts, frames, side="right") - 1
        offsets = np.concatenate([[0.0], np.cumsum(traj.total_times)])
        return offsets[part] + (frames - self.part_starts[part]) * np.asarray(traj.dts)[part]

    def _read_in_part(self, p, lo, hi):
        reader = self.parts[p]
        if type(reader).__name__ == "DCDReader" and not self._has_boxes(reader):
            return self._read_dcd(reader, lo, hi)
        n = hi - lo
        coords = np.empty((n, self.idx.size, 3), dtype=np.float32)
        times = np.empty(n, dtype=np.float64)
        boxes = np.zeros((n, 6), dtype=np.float32) if self.need_boxes else None
        for i, ts in enumerate(reader[lo:hi]):
            coords[i] = ts.positions[self.idx]
            times[i] = ts.time
            if boxes is not None and ts.dimensions is not None:
                boxes[i] = ts.dimensions
        return times, coords, boxes

    def _has_boxes(self, reader):
        return self.need_boxes and reader.ts.dimensions is not None

    def _read_dcd(self, reader, lo, hi):
        """DCD in bulk: coordinates by `timeseries`, times linear in the frame as DCD defines them."""
        coords = reader.timeseries(atomgroup=self.u.atoms[self.idx], start=lo, stop=hi, order="fac")
        t0 = reader[lo].time
        times = t0 + np.arange(hi - lo) * reader.ts.dt
        boxes = np.zeros((hi - lo, 6), dtype=np.float32) if self.need_boxes else None
        return times, np.ascontiguousarray(coords, dtype=np.float32), boxes

    def close(self):
        self.u.trajectory.close()


class H5MDChunkReader:
    """Chunks of an H5MD file through h5py."""

    def __init__(self, path, atom_indices, need_boxes=False, comm=None):
        self.h5 = H5MDBlockReader(path, atom_indices, comm)
        self.need_boxes = need_boxes

    @property
    def n_frames(self):
        return self.h5.n_frames

    def chunks(self, start, stop, chunk_frames) -> Iterator[Chunk]:
        for pos in range(start, stop, chunk_frames):
            end = min(pos + chunk_frames, stop)
            times, coords, boxes = self.h5.read(pos, end)
            if self.need_boxes and boxes is None:
                boxes = np.zeros((end - pos, 6), dtype=np.float32)
            yield Chunk(np.arange(pos, end, dtype=np.int64), times, coords,
                        boxes if self.need_boxes else None)

    def close(self):
        self.h5.close()


def is_h5md(path) -> bool:
    return str(path).lower().endswith((".h5md", ".h5"))
