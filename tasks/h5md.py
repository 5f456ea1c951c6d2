"""H5MD, the fast format: writing it from any trajectory, reading blocks of it.

Written with h5py directly in the layout MDAnalysis' H5MDWriter uses (so its
H5MDReader opens our files with the same positions, box, time and step):
`particles/trajectory/position/{value,step,time}`, chunked for the run's
selection (chunk_shape, below), and, for a periodic system, the
box as `particles/trajectory/box/edges/{value,step,time}` (the 3x3 box
vectors of every frame). Time and step are kept monotonic across
concatenated inputs. Read with h5py directly: one hyperslab per chunk of
frames instead of MDAnalysis' per-frame path (about 9x slower per frame on AdK).
"""
import json

import numpy as np
import h5py

from . import units

# Every frame's box as MDAnalysis gives it (a, b, c, alpha, beta, gamma; float32,
# zeros for a frame without one), beside the standard box/edges vectors: the
# vectors do not give the same dimensions back to the last bit, and a copy must.
DIMENSIONS = "trajflow/dimensions"
# each frame's time as written in its file (ts.time): what MDAnalysis gives an analysis'
# `times`, where the H5MD time is a chain's cumulative `trajectory.time` (copies.py)
WRITTEN_TIME = "trajflow/written_time"
SUFFIX = ".h5md"


# Positions are chunked along the atoms at the selection's end, so that a selection
# of the first atoms (a protein before its solvent) reads its own chunks only, with
# several frames per chunk; Jakupovic and Beckstein 2021 found the layout the
# biggest lever. Measured (solvated AdK, 47,681 atoms; 214 CA among the first 3,341;
# 50-frame reads; us per frame): one whole frame per chunk 65, (1, 3341) 12,
# (4 to 16, 3341) 8.4 to 9.2, DCD's rows 7.6 to 8.2; compressed: gzip:1 2,942 whole
# frames and 194 split, lzf 99. So no compression unless asked for (disk space only).
CHUNK_BYTES = 256 * 1024
MAX_FRAMES_PER_CHUNK = 16
LAYOUT = "trajflow"  # the group whose `layout` attribute records the choice


def chunk_shape(n_atoms, n_frames, selection_end=None):
    """(frames, atoms, 3) of a position chunk: atoms up to the selection's end (all
    without one), and as many frames (1 to 16) as make about CHUNK_BYTES."""
    # never narrower than a full chunk of frames fills: a selection ending at atom 20
    # would make 2,400 chunks of 4 KB a frame block (HDF5's per-chunk costs dominate)
    narrowest = CHUNK_BYTES // (MAX_FRAMES_PER_CHUNK * 12)
    atoms = max(1, min(n_atoms, max(selection_end or n_atoms, narrowest)))
    frames = max(1, min(MAX_FRAMES_PER_CHUNK, n_frames, CHUNK_BYTES // (atoms * 12)))
    return (frames, atoms, 3)


def is_h5md(path) -> bool:
    """Whether MDAnalysis would read `path` as H5MD (it goes by the extension)."""
    return str(path).lower().endswith(SUFFIX)


def parse_compression(spec):
    """'gzip:4' -> ('gzip', 4); 'lzf' -> ('lzf', None); None or 'none' -> (None, None)."""
    if not spec or spec == "none":
        return None, None
    if spec == "lzf":  # h5py's own filter: fast, every h5py reads it (not every HDF5 tool)
        return "lzf", None
    name, _, level = spec.partition(":")
    if name != "gzip":
        raise ValueError(f"unknown compression {spec!r}: use gzip:N with N from 0 to 9, "
                         "or lzf")
    level = int(level) if level else 4
    if not 0 <= level <= 9:
        raise ValueError(f"gzip level {level} out of range: use 0 to 9")
    return "gzip", level


class H5MDWriter:
    """Append chunks of frames to a new H5MD file (positions and box in Å, time in ps).

    Every frame's box is written as it comes (zeros where a frame has none);
    whether the file declares a periodic system is decided at `close()` from
    all the frames written, never from the first: a trajectory whose first
    frame has no cell loses none of the later ones. Velocities and forces,
    where the input has them, go in as MDAnalysis' H5MDWriter writes them.
    """

    def __init__(self, path, n_atoms, n_frames, compression=None, group="trajectory",
                 velocities=False, forces=False, selection_end=None):
        comp, level = parse_compression(compression)
        chunks = chunk_shape(n_atoms, n_frames, selection_end)
        self.file = h5py.File(path, "w")
        h5 = self.file.create_group("h5md")
        h5.attrs["version"] = np.array([1, 1])
        h5.create_group("author").attrs["name"] = "trajflow"
        creator = h5.create_group("creator")
        creator.attrs["name"] = "trajflow"
        creator.attrs["version"] = "0.1"
        self.particles = self.file.create_group(f"particles/{group}")
        self.data = {}
        for name, unit, wanted in (("position", "Angstrom", True),
                                   ("velocity", "Angstrom ps-1", velocities),
                                   ("force", "kJ mol-1 Angstrom-1", forces)):
            if wanted:
                self.data[name] = self._element(name, (n_frames, n_atoms, 3), unit,
                                                chunks=chunks, compression=comp,
                                                compression_opts=level)
        box = self.particles.create_group("box")
        box.attrs["dimension"] = 3
        self.edges = self._element("box/edges", (n_frames, 3, 3), "Angstrom")
        self.dimensions = self.file.create_dataset(DIMENSIONS, shape=(n_frames, 6), dtype=np.float32)
        self.written_time = self.file.create_dataset(WRITTEN_TIME, shape=(n_frames,),
                                                     dtype=np.float64)
        self.file[LAYOUT].attrs["layout"] = json.dumps(
            {"chunks": list(chunks), "selection_end": selection_end, "compression": compression
             or "none", "why": "a selection of atoms [0, selection_end) reads its own chunks"})
        pos = self.particles["position"]
        self.time, self.step = pos["time"], pos["step"]
        self.n, self.any_box = 0, False
        self._step_offset, self._last_step, self._last_delta = 0, None, 1

    def _element(self, name, shape, unit, **layout):
        """An H5MD time-dependent element: value, and time and step (shared by all)."""
        group = self.particles.create_group(name)
        value = group.create_dataset("value", shape=shape, dtype=np.float32, **layout)
        value.attrs["unit"] = unit
        if name == "position":
            time = group.create_dataset("time", shape=(shape[0],), dtype=np.float64)
            time.attrs["unit"] = "ps"
            group.create_dataset("step", shape=(shape[0],), dtype=np.int64)
        else:  # hard links: one time and one step for every element
            group["time"], group["step"] = self.particles["position/time"], self.particles["position/step"]
        return value

    def write(self, times, coords, boxes=None, steps=None, velocities=None, forces=None,
              written_times=None):
        """Frames in order: times (F,) ps, coords (F, A, 3) Å, boxes (F, 6) MDAnalysis
        dimensions (zeros or None: no box), the inputs' MD steps (default: the frame index),
        each frame's time as written in its file (default: `times`)."""
        from MDAnalysis.lib.mdamath import triclinic_vectors  # as its H5MDWriter writes them
        k = len(times)
        span = slice(self.n, self.n + k)
        self.step[span] = self._monotonic(np.arange(self.n, self.n + k) if steps is None else steps)
        self.time[span] = times
        self.written_time[span] = times if written_times is None else written_times
        for name, values in (("position", coords), ("velocity", velocities), ("force", forces)):
            if name in self.data:
                self.data[name][span] = values
        boxes = np.zeros((k, 6), np.float32) if boxes is None else np.asarray(boxes, np.float32)
        self.dimensions[span] = boxes
        self.edges[span] = np.stack([triclinic_vectors(b) for b in boxes])
        self.any_box |= bool(np.any(boxes[:, :3] != 0))
        self.n += k

    def _monotonic(self, steps):
        """The inputs' steps, shifted where they restart (concatenated files or
        copies) so that they keep increasing, as the H5MD standard requires."""
        out = np.asarray(steps, dtype=np.int64).copy()
        for i in range(len(out)):
            out[i] += self._step_offset
            if self._last_step is not None and out[i] <= self._last_step:
                shift = self._last_step + self._last_delta - out[i]
                self._step_offset += shift
                out[i] += shift
            if self._last_step is not None:
                self._last_delta = max(1, int(out[i] - self._last_step))
            self._last_step = int(out[i])
        return out

    def close(self):
        """The box's boundary from every frame written: periodic if any had a cell;
        otherwise no edges at all and boundary `none`, as the standard asks."""
        box = self.particles["box"]
        if not self.any_box:
            del box["edges"]
        box.attrs["boundary"] = np.array([b"periodic" if self.any_box else b"none"] * 3)
        self.file.close()


def particle_group(file):
    """The first group under /particles (trajflow writes one, `trajectory`)."""
    particles = file.get("particles")
    if not isinstance(particles, h5py.Group) or not len(particles):
        raise ValueError("no particles group: not an H5MD trajectory")
    return particles[next(iter(particles))]


def missing_box(path):
    """Why the H5MD file at `path` cannot give a box, or None when it can.

    A file whose box declares every boundary `none` is a non-periodic system
    and needs none; a file with neither edges nor that declaration has lost
    its box (as trajflow's own conversion did before 0.2), and an analysis
    that applies the minimum image would compute without it.
    """
    with h5py.File(path, "r") as f:
        group = particle_group(f)
        box = group.get("box")
        if isinstance(box, h5py.Group) and "edges" in box:
            return None
        boundary = [] if box is None else [
            b.decode() if isinstance(b, bytes) else str(b) for b in np.atleast_1d(box.attrs.get("boundary", []))]
        if boundary and all(b == "none" for b in boundary):
            return None
        return (f"its particles group {group.name!r} has no box/edges and does not declare a "
                "non-periodic system (box attribute boundary = none)")


COLLECTIVE = "collective"  # RunPlan.mpi_reads: every rank takes part in each MPI-IO read
# H5Pget_mpio_actual_io_mode's answers (H5Ppublic.h)
MPIO_MODES = {0: "no collective", 1: "chunk independent", 2: "chunk collective",
              3: "chunk mixed", 4: "contiguous collective"}


def actual_mpio_mode(dxpl_id):
    """What HDF5 did in the last read on the transfer list `dxpl_id` (MPIO_MODES), from
    H5Pget_mpio_actual_io_mode, which h5py does not wrap: asking for collective I/O is
    no proof of it (h5py's fast path once read independently whatever was asked).
    None where the HDF5 library cannot be found in this process."""
    import ctypes
    lib = _hdf5_library()
    if lib is None:
        return None
    mode = ctypes.c_int(-1)
    if lib.H5Pget_mpio_actual_io_mode(ctypes.c_int64(dxpl_id), ctypes.byref(mode)) < 0:
        return None
    return MPIO_MODES.get(mode.value, str(mode.value))


_HDF5 = []


def _hdf5_library():
    """The HDF5 library h5py loaded (from /proc/self/maps), opened by ctypes once."""
    if not _HDF5:
        import ctypes
        import re
        path = None
        try:
            with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    name = line.rsplit(" ", 1)[-1].strip()
                    if re.search(r"/libhdf5(_mpich|_openmpi)?(-[^/]*)?\.so", name) \
                            and "_hl" not in name:
                        path = name
                        break
        except OSError:
            pass
        try:
            _HDF5.append(ctypes.CDLL(path) if path else None)
        except OSError:
            _HDF5.append(None)
    return _HDF5[0]


class H5MDError(ValueError):
    """An H5MD file trajflow cannot read as MDAnalysis would: the message names
    the file, the dataset and the fix."""


class H5MDBlockReader:
    """Reads [start, stop) of chosen atoms from an H5MD file in chunks, as
    MDAnalysis' H5MDReader gives them: positions float32 in Å (float64 data cast
    first, then converted from its unit), time in ps from the position's `time`
    in its unit, each frame's box from its own edges. Units are required, as
    MDAnalysis requires them; a box whose unit differs from the positions' is
    converted from its own (MDAnalysis converts it from the positions' unit,
    which is wrong; the data written is the truth). A trajflow copy's boxes are
    read exact from its DIMENSIONS dataset.
    """

    def __init__(self, path, atom_indices, comm=None, collective=False):
        # With an MPI build of h5py, the ranks of an MPI task open the file
        # together (driver mpio, Jakupovic and Beckstein 2021); otherwise each opens it on its own.
        mpio = comm is not None and h5py.get_config().mpi
        if mpio:
            self.file = h5py.File(path, "r", driver="mpio", comm=comm)
        else:
            self.file = h5py.File(path, "r")
        # collective: every rank's positions read is one MPI-IO collective call, which
        # the ranks must make equally often (pad_collective evens them up at the end)
        self.collective = bool(collective and mpio)
        self.position_reads = 0
        self.mpio_mode = None  # what HDF5 says it did in the last collective read
        self.path = path
        group = particle_group(self.file)
        pos = group.get("position")
        if not isinstance(pos, h5py.Group) or "value" not in pos:
            raise H5MDError(f"{path}: {group.name} has no position/value: trajflow analyses "
                            "positions; write them into the file (MDAnalysis' H5MDWriter does)")
        self.value = pos["value"]
        self.n_frames, self.n_atoms = self.value.shape[:2]
        self.scale = units.to_angstrom(_unit(self.value, units.H5MD_LENGTH, path))
        self.times = self._times(pos)
        self.idx = np.asarray(atom_indices, dtype=np.intp)
        self.lo = int(self.idx.min()) if self.idx.size else 0
        self.hi = int(self.idx.max()) + 1 if self.idx.size else 0
        self.dimensions = self.file.get(DIMENSIONS)
        box = group.get("box")
        edges = box.get("edges") if isinstance(box, h5py.Group) else None
        # time-dependent (edges/value, one box per frame) or one box for all frames
        self.edges_per_frame = isinstance(edges, h5py.Group)
        self.edges = edges["value"] if self.edges_per_frame else edges
        # whole frames: those every time-dependent dataset has (planning refuses a
        # file whose lengths differ unless --allow-truncated asks for these)
        self.n_frames = min(self.n_frames, len(self.times),
                            self.edges.shape[0] if self.edges_per_frame else self.n_frames)
        if self.edges is not None:
            unit = (_unit(self.edges, units.H5MD_LENGTH, path) if "unit" in self.edges.attrs
                    else _unit(self.value, units.H5MD_LENGTH, path))
            self.edges_scale = units.to_angstrom(unit)

    def _times(self, pos):
        """Each frame's time in ps, computed as MDAnalysis computes it: the stored
        value (float32 stays float32) times the unit's factor, unless that is 1."""
        t = pos.get("time")
        if t is None:
            raise H5MDError(f"{self.path}: {pos.name} has no time dataset; MDAnalysis cannot "
                            "read such a file either: write the frames' times with a unit")
        factor = units.to_ps(_unit(t, units.H5MD_TIME, self.path))
        if t.shape == ():  # time-independent step: time = frame index x dt
            return np.arange(self.n_frames) * (float(t[()]) * factor)
        values = np.asarray(t[:])
        if factor != 1.0:
            values = values * (np.float32(factor) if values.dtype == np.float32 else factor)
        return values.astype(np.float64)

    def read(self, start, stop, with_boxes=True):
        """(times, coords (F, A, 3) float32, boxes (F, 6) or None) for frames [start, stop)."""
        # One hyperslab over the span of wanted atoms: HDF5 reads the chunks it
        # touches (a selection's own, in trajflow's copies; see chunk_shape) and
        # numpy picks the atoms.
        if self.collective:
            span = self._read_collective(np.s_[start:stop, self.lo:self.hi])
        else:
            span = self.value[start:stop, self.lo:self.hi]
        self.position_reads += 1
        coords = span[:, self.idx - self.lo].astype(np.float32, copy=False)
        if self.scale != 1.0:
            coords *= np.float32(self.scale)
        return self.times[start:stop], coords, self.boxes(start, stop) if with_boxes else None

    def boxes(self, start, stop):
        """(F, 6) MDAnalysis dimensions of frames [start, stop), or None without a box."""
        if self.edges is None:  # a non-periodic system
            return None
        if self.dimensions is not None:
            return np.asarray(self.dimensions[start:stop], dtype=np.float32)
        from MDAnalysis.lib.mdamath import triclinic_box
        edges = self.edges[start:stop] if self.edges_per_frame else np.repeat(
            self.edges[()][None], stop - start, 0)
        if edges.ndim == 2:  # a rectangular box: edge lengths only
            dims = np.concatenate([edges, np.full((len(edges), 3), 90.0)], axis=1).astype(np.float32)
        else:  # as MDAnalysis' H5MDReader: triclinic_box of the stored vectors
            dims = np.stack([triclinic_box(*e) for e in edges]).astype(np.float32)
        if self.edges_scale != 1.0:
            dims[:, :3] *= np.float32(self.edges_scale)
        return dims

    def _read_collective(self, where):
        """One collective MPI-IO read. Not `dset[...]`: h5py's fast path for plain slices
        reads with the default (independent) transfer whatever `dset.collective` says;
        read_direct passes the dataset's collective transfer list to HDF5."""
        shape = tuple(len(range(*s.indices(n))) for s, n in zip(where, self.value.shape))
        out = np.empty(shape + self.value.shape[2:], dtype=self.value.dtype)
        with self.value.collective:
            self.value.read_direct(out, where)
            self.mpio_mode = actual_mpio_mode(self.value._dxpl.id)
        return out

    def pad_collective(self, calls):
        """Collective reads of one position until this rank has made `calls` (agreed by
        every rank before the first chunk, see analyze.FrameSources): MPI-IO matches
        collective reads call for call, so a rank with fewer chunks takes part in the
        others' last reads. An empty selection would not do: h5py skips it."""
        while self.collective and self.position_reads < calls:
            self._read_collective(np.s_[0:1, self.lo:self.lo + 1])
            self.position_reads += 1

    def close(self):
        self.file.close()


def _unit(dataset, known, path):
    """The dataset's `unit` in MDAnalysis' spelling; refused as MDAnalysis refuses it."""
    unit = dataset.attrs.get("unit")
    if unit is None:
        raise H5MDError(f"{path}: {dataset.name} has no unit attribute; MDAnalysis refuses such a "
                        f"file too. Add one (e.g. h5py: f[{dataset.name!r}].attrs['unit'] = "
                        f"{next(iter(known))!r}) naming the unit it was written in")
    unit = unit.decode() if isinstance(unit, bytes) else str(unit)
    if unit not in known:
        raise H5MDError(f"{path}: {dataset.name} has unit {unit!r}, which MDAnalysis does not "
                        f"know; use one of {', '.join(sorted(known))}")
    return known[unit]
