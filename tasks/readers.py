"""Block readers: frames [start, stop) of the atoms an analysis needs, a chunk at a time.

Every reader yields `Chunk`s of at most `chunk_frames` frames, so a rank's
memory is bounded by the chunk whatever the trajectory's length. Three paths:
- trajectories opened without a topology, several files as one: plain DCD
  and single XTC files read by trajflow itself (dcd.py, xtc.py), any other
  format MDAnalysis reads (and those where boxes are needed) through its
  readers, frame by frame, copying only the wanted atoms;
- H5MD (a user's own file, trajflow's copy, or a split segment shifted to
  global frame numbers): h5py hyperslabs (see h5md.py).
"""
import contextlib
import dataclasses
import warnings
from typing import Iterator, Optional, Protocol

import numpy as np
# Imported with the module, not in the timed open: interpreter start-up and
# imports happen before a rank's clock starts (RADICAL's rank_start shows them).

from .dcd import DCDFile, open_dcd
from .xtc import XTCFile, open_xtc
from .h5md import H5MDBlockReader, is_h5md
from .offsets_cache import keep_offsets_in_cache
from .universe_args import topology_keywords


@dataclasses.dataclass
class Chunk:
    frames: np.ndarray          # (F,) int64 global frame numbers
    times: np.ndarray           # (F,) float64, ps, as MDAnalysis' trajectory.time
    coords: np.ndarray          # (F, A, 3) float32, Å, the wanted atoms only
    boxes: Optional[np.ndarray]  # (F, 6) float32, or None when no frame has a cell
    steps: Optional[np.ndarray] = None  # (F,) int64 MD steps as the reader gives them

    @property
    def nbytes(self) -> int:
        return self.coords.nbytes


class BlockReader(Protocol):
    """What the analyze loop asks of a reader (TrajectoryBlockReader and
    H5MDChunkReader have it): frames [start, stop) as Chunks of at most
    `chunk_frames` frames, global frame numbers in each chunk, then close()."""

    n_frames: int

    def chunks(self, start: int, stop: int, chunk_frames: int) -> Iterator[Chunk]:
        ...

    def close(self) -> None:
        ...


def _phase(timer, name):
    return timer.phase(name) if timer is not None else contextlib.nullcontext()


def open_universe(topology, trajectories, timer=None, universe=None, read_as=None):
    """Topology and trajectory as a Universe (the split stage writes with it): the
    topology with the run's Universe keywords `universe` (universe_args.py), the
    trajectory with `read_as` (RunPlan.reader_keywords: none on trajflow's own copies)."""
    import MDAnalysis as mda
    warnings.filterwarnings("ignore", module="MDAnalysis")
    keep_offsets_in_cache()
    with _phase(timer, "open_topology"):
        u = mda.Universe(topology, **topology_keywords(universe))
    with _phase(timer, "open_trajectory"):
        trajectories = list(trajectories)
        u.load_new(trajectories[0] if len(trajectories) == 1 else trajectories,
                   **(read_as or {}))
    return u


def open_block_reader(trajectories, atom_indices, need_boxes, timer=None, comm=None,
                      frame_offset=0, collective=False, keywords=None) -> "BlockReader":
    """The block reader for these files: one H5MD file through h5py (`collective`:
    its MPI-IO reads collective, see H5MDBlockReader), anything else as a
    trajectory (open_trajectory; `keywords`: the run's for reading the user's files)."""
    trajectories = list(trajectories)
    if len(trajectories) == 1 and is_h5md(trajectories[0]) and not keywords:
        with _phase(timer, "open_trajectory"):
            reader = H5MDChunkReader(trajectories[0], atom_indices, need_boxes, comm, frame_offset,
                                     collective)
        if timer is not None:  # the profile says how the file was opened: "mpio" or "sec2"
            timer.info["h5md_driver"] = reader.h5.file.driver
            timer.info["h5md_reads"] = "collective" if reader.h5.collective else "independent"
        return reader
    return TrajectoryBlockReader(open_trajectory(trajectories, timer, need_boxes, keywords),
                                 atom_indices, need_boxes, frame_offset)


def open_trajectory(trajectories, timer=None, need_boxes=False, keywords=None):
    """The trajectory alone, no topology: several files become one ChainReader,
    plain DCD files a DCDTrajectory (dcd.py: no MDAnalysis import, no decoding),
    one XTC file an XTCTrajectory (xtc.py: decoded up to the last atom wanted).
    With reader `keywords` (a format, continuous, dt, ...: universe_args.py) it is
    MDAnalysis' own reader, which is what they are for.

    Analyze ranks need no topology: their atoms were resolved on the
    workstation, which saves every rank the topology parse (Khoshlessan et al. 2019's
    t_open_topology, seconds per rank for large systems).
    """
    trajectories = list(trajectories)
    with _phase(timer, "open_trajectory"):
        if not keywords:
            native = open_dcd(trajectories, need_boxes) or open_xtc(trajectories, need_boxes)
            if native is not None:
                return native
        from MDAnalysis.coordinates.core import reader as mda_reader
        warnings.filterwarnings("ignore", module="MDAnalysis")
        keep_offsets_in_cache()
        return mda_reader(trajectories[0] if len(trajectories) == 1 else trajectories,
                          **(keywords or {}))


def is_continuous_chain(trajectory) -> bool:
    """MDAnalysis' ChainReader with continuous=True: its files overlap, and it keeps each
    file's frames up to where the next one starts (its `_start_frames`)."""
    return hasattr(trajectory, "readers") and hasattr(trajectory, "_sf")


class _Atoms:
    """What DCDReader.timeseries reads of an AtomGroup: its indices."""

    def __init__(self, indices):
        self.indices = indices

    def __len__(self):
        return len(self.indices)


class TrajectoryBlockReader:
    """Chunks of an MDAnalysis trajectory reader, one sub-reader at a time for chained files."""

    def __init__(self, trajectory, atom_indices, need_boxes=False, frame_offset=0):
        self.traj = trajectory
        self.idx = np.asarray(atom_indices, dtype=np.intp)
        self.need_boxes = need_boxes
        self.frame_offset = frame_offset  # global number of this trajectory's frame 0
        self.parts = list(trajectory.readers) if hasattr(trajectory, "readers") else [trajectory]
        self.continuous = is_continuous_chain(trajectory)
        if self.continuous:  # each file's frames up to where the next file starts
            self.part_starts = np.append(np.asarray(trajectory._sf, dtype=np.int64),
                                         trajectory.n_frames)
        else:
            self.part_starts = np.concatenate([[0], np.cumsum([r.n_frames for r in self.parts])])

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
            times = np.concatenate([c.times for c in pieces])
            coords = np.concatenate([c.coords for c in pieces])
            steps = np.concatenate([c.steps for c in pieces])
            boxes = None if all(c.boxes is None for c in pieces) else np.concatenate(
                [np.zeros((len(c.times), 6), np.float32) if c.boxes is None else c.boxes
                 for c in pieces])
            if len(self.parts) > 1 and not self.continuous:  # a continuous chain: as written
                times = self._chain_times(pos, end)
            frames = np.arange(pos, end, dtype=np.int64) + self.frame_offset
            yield Chunk(frames, times, coords, boxes, steps)

    def _chain_times(self, start, stop):
        """ChainReader's cumulative time (`trajectory.time`, what rms.RMSD reports):
        the earlier files' total times plus this file's frames times its dt."""
        frames = np.arange(start, stop)
        part = np.searchsorted(self.part_starts, frames, side="right") - 1
        offsets = np.concatenate([[0.0], np.cumsum(self.traj.total_times)])
        return offsets[part] + (frames - self.part_starts[part]) * np.asarray(self.traj.dts)[part]

    def _read_in_part(self, p, lo, hi) -> Chunk:
        """Frames [lo, hi) of one file (frame numbers left to the caller)."""
        reader = self.parts[p]
        if isinstance(reader, XTCFile):
            coords, times, steps = reader.read(self.idx, lo, hi)
            return Chunk(None, times, coords, None, steps)
        # MDAnalysis' CHARMM/NAMD DCDReader in bulk (Å, no conversion); not its LAMMPS
        # DCDReader of the same name, whose units MDAnalysis converts frame by frame
        if isinstance(reader, DCDFile) or (type(reader).__module__ == "MDAnalysis.coordinates.DCD"
                                           and type(reader).__name__ == "DCDReader"
                                           and not self._has_boxes(reader)):
            return self._read_dcd(reader, lo, hi)
        n = hi - lo
        coords = np.empty((n, self.idx.size, 3), dtype=np.float32)
        times = np.empty(n, dtype=np.float64)
        steps = np.arange(lo, hi, dtype=np.int64)
        boxes = np.zeros((n, 6), dtype=np.float32) if self.need_boxes else None
        for i, ts in enumerate(reader[lo:hi]):
            coords[i] = ts.positions[self.idx]
            times[i] = ts.time
            steps[i] = ts.data.get("step", steps[i])
            if boxes is not None and ts.dimensions is not None:
                boxes[i] = ts.dimensions
        return Chunk(None, times, coords, boxes, steps)

    def _has_boxes(self, reader):
        """Whether boxes must be read frame by frame: the file's header says it has
        a cell (any frame may: the frame read last says nothing of the others)."""
        return self.need_boxes and bool(reader._file.header["is_periodic"])

    def _read_dcd(self, reader, lo, hi):
        """DCD in bulk (no box), times linear in the frame as DCD defines them,
        steps as MDAnalysis' DCDReader reports them (the frame's position + 1):
        trajflow's own DCD reading where the layout is plain, else `timeseries`."""
        steps = np.arange(lo + 1, hi + 1, dtype=np.int64)
        if isinstance(reader, DCDFile):
            return Chunk(None, reader.times(lo, hi), reader.read_atoms(self.idx, lo, hi), None,
                         steps)
        header = reader._file.header  # each frame's time as DCDReader computes it
        times = ((np.arange(lo, hi) + header["istart"] / header["nsavc"]) * reader.ts.dt
                 + reader.ts.data.get("time_offset", 0.0))
        coords = np.ascontiguousarray(reader.timeseries(
            atomgroup=_Atoms(self.idx), start=lo, stop=hi, order="fac"), dtype=np.float32)
        return Chunk(None, times, coords, None, steps)

    def close(self):
        self.traj.close()


class H5MDChunkReader:
    """Chunks of an H5MD file through h5py."""

    def __init__(self, path, atom_indices, need_boxes=False, comm=None, frame_offset=0,
                 collective=False):
        self.h5 = H5MDBlockReader(path, atom_indices, comm, collective)
        self.need_boxes = need_boxes
        self.frame_offset = frame_offset  # global number of this file's frame 0 (a segment's)

    @property
    def n_frames(self):
        return self.h5.n_frames

    def chunks(self, start, stop, chunk_frames) -> Iterator[Chunk]:
        for pos in range(start, stop, chunk_frames):
            end = min(pos + chunk_frames, stop)
            times, coords, boxes = self.h5.read(pos, end, self.need_boxes)
            yield Chunk(np.arange(pos, end, dtype=np.int64) + self.frame_offset, times, coords, boxes)

    def close(self):
        self.h5.close()



class SelectedFrames:
    """A reader's frames by global number (a run's chosen frames: MDAnalysis'
    run(start, stop, step) or run(frames=)), seen as frames 0..n-1 of a block.

    Numbers that rise densely (a step up to DENSE_STEP) are read as one span of
    the underlying reader and the rows wanted kept; others frame by frame."""
    DENSE_STEP = 4

    def __init__(self, reader, numbers):
        self.reader = reader
        self.numbers = np.asarray(numbers, dtype=np.int64)

    @property
    def n_frames(self):
        return len(self.numbers)

    def chunks(self, start, stop, chunk_frames) -> Iterator[Chunk]:
        for pos in range(start, stop, chunk_frames):
            wanted = self.numbers[pos:min(pos + chunk_frames, stop)]
            lo, hi = int(wanted[0]), int(wanted[-1]) + 1
            dense = np.all(np.diff(wanted) > 0) and hi - lo <= self.DENSE_STEP * len(wanted)
            if dense:
                pieces = [(next(iter(self.reader.chunks(lo, hi, hi - lo))), wanted - lo)]
            else:
                pieces = [(next(iter(self.reader.chunks(int(f), int(f) + 1, 1))), [0])
                          for f in wanted]
            yield Chunk(wanted.copy(),
                        np.concatenate([c.times[rows] for c, rows in pieces]),
                        np.concatenate([c.coords[rows] for c, rows in pieces]),
                        None if pieces[0][0].boxes is None else
                        np.concatenate([c.boxes[rows] for c, rows in pieces]),
                        None if pieces[0][0].steps is None else
                        np.concatenate([c.steps[rows] for c, rows in pieces]))

    def close(self):
        self.reader.close()
