"""H5MD, the fast format: writing it from any trajectory, reading blocks of it.

Written with h5py directly in the layout MDAnalysis' H5MDWriter uses (so its
H5MDReader opens our files with the same positions, box, time and step):
`particles/trajectory/position/{value,step,time}` with one frame per chunk
(1, n_atoms, 3) as Jakupovic and Beckstein 2021 found fastest, and, for a periodic system, the
box as `particles/trajectory/box/edges/{value,step,time}` (the 3x3 box
vectors of every frame). Time and step are kept monotonic across
concatenated inputs. Read with h5py directly: one hyperslab per chunk of
frames instead of MDAnalysis' per-frame path (about 9x slower per frame on AdK).
"""
import numpy as np
import h5py

LENGTH_TO_ANGSTROM = {"angstrom": 1.0, "a": 1.0, "nm": 10.0, "pm": 0.01}
TIME_TO_PS = {"ps": 1.0, "fs": 1e-3, "ns": 1e3}


def parse_compression(spec):
    """'gzip:4' -> ('gzip', 4); None or 'none' -> (None, None)."""
    if not spec or spec == "none":
        return None, None
    name, _, level = spec.partition(":")
    if name != "gzip":
        raise ValueError(f"unknown compression {spec!r}: use gzip:N with N from 0 to 9")
    level = int(level) if level else 4
    if not 0 <= level <= 9:
        raise ValueError(f"gzip level {level} out of range: use 0 to 9")
    return "gzip", level


def _time_and_step(group, n_frames):
    time = group.create_dataset("time", shape=(n_frames,), dtype=np.float64)
    time.attrs["unit"] = "ps"
    step = group.create_dataset("step", shape=(n_frames,), dtype=np.int64)
    return time, step


class H5MDWriter:
    """Append chunks of frames to a new H5MD file (positions and box in Å, time in ps).

    `periodic`: the system has a unit cell, so every frame's box is written
    (`write(..., boxes=...)` then takes the (F, 6) MDAnalysis dimensions);
    otherwise the box group says `boundary = none`, as the standard asks.
    """

    def __init__(self, path, n_atoms, n_frames, compression=None, group="trajectory",
                 periodic=False):
        comp, level = parse_compression(compression)
        self.file = h5py.File(path, "w")
        h5 = self.file.create_group("h5md")
        h5.attrs["version"] = np.array([1, 1])
        h5.create_group("author").attrs["name"] = "trajflow"
        creator = h5.create_group("creator")
        creator.attrs["name"] = "trajflow"
        creator.attrs["version"] = "0.1"
        particles = self.file.create_group(f"particles/{group}")
        pos = particles.create_group("position")
        self.value = pos.create_dataset(
            "value", shape=(n_frames, n_atoms, 3), dtype=np.float32,
            chunks=(1, n_atoms, 3), compression=comp, compression_opts=level)
        self.value.attrs["unit"] = "Angstrom"
        self.time, self.step = _time_and_step(pos, n_frames)
        box = particles.create_group("box")
        box.attrs["dimension"] = 3
        box.attrs["boundary"] = np.array([b"periodic" if periodic else b"none"] * 3)
        self.edges = None
        if periodic:
            edges = box.create_group("edges")
            self.edges = edges.create_dataset("value", shape=(n_frames, 3, 3), dtype=np.float32)
            self.edges.attrs["unit"] = "Angstrom"
            self.edges_time, self.edges_step = _time_and_step(edges, n_frames)
        self.n = 0
        self._step_offset, self._last_step, self._last_delta = 0, None, 1

    def write(self, times, coords, boxes=None, steps=None):
        """Frames in order: times (F,) ps, coords (F, A, 3) Å, boxes (F, 6) when
        periodic, the inputs' MD steps (default: the frame index)."""
        k = len(times)
        span = slice(self.n, self.n + k)
        steps = self._monotonic(np.arange(self.n, self.n + k) if steps is None else steps)
        self.value[span] = coords
        self.time[span] = times
        self.step[span] = steps
        if self.edges is not None:
            if boxes is None:
                raise ValueError("a periodic H5MD file needs every frame's box")
            from MDAnalysis.lib.mdamath import triclinic_vectors  # as its H5MDWriter writes them
            self.edges[span] = np.stack([triclinic_vectors(b) for b in boxes])
            self.edges_time[span] = times
            self.edges_step[span] = steps
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


class H5MDBlockReader:
    """Reads [start, stop) of chosen atoms from an H5MD file in chunks."""

    def __init__(self, path, atom_indices, comm=None):
        # With an MPI build of h5py, the ranks of an MPI task open the file
        # together (driver mpio, Jakupovic and Beckstein 2021); otherwise each opens it on its own.
        if comm is not None and h5py.get_config().mpi:
            self.file = h5py.File(path, "r", driver="mpio", comm=comm)
        else:
            self.file = h5py.File(path, "r")
        group = particle_group(self.file)
        pos = group["position"]
        self.value = pos["value"]
        self.n_frames, self.n_atoms = self.value.shape[:2]
        self.scale = _length_scale(self.value, path)
        self.times = self._times(pos)
        self.idx = np.asarray(atom_indices, dtype=np.intp)
        self.lo = int(self.idx.min()) if self.idx.size else 0
        self.hi = int(self.idx.max()) + 1 if self.idx.size else 0
        box = group.get("box")
        self.edges = box["edges"] if isinstance(box, h5py.Group) and "edges" in box else None
        # time-dependent (edges/value, one box per frame) or one box for all frames
        self.edges_per_frame = isinstance(self.edges, h5py.Group)
        if self.edges_per_frame:
            self.edges = self.edges["value"]
            if self.edges.shape[0] != self.n_frames:
                raise ValueError(f"{path}: {self.edges.shape[0]} boxes for {self.n_frames} "
                                 "frames; trajflow reads boxes sampled with every frame only")
        if self.edges is not None:
            self.edges_scale = _length_scale(self.edges, path, default=self.scale)

    def _times(self, pos):
        t = pos["time"]
        if t.shape == ():  # time-independent step: time = frame index x dt
            return np.arange(self.n_frames) * float(t[()])
        scale = TIME_TO_PS.get(_attr(t, "unit", "ps").lower(), 1.0)
        return np.asarray(t[:], dtype=np.float64) * scale

    def read(self, start, stop, with_boxes=True):
        """(times, coords (F, A, 3) float32, boxes (F, 6) or None) for frames [start, stop)."""
        # One hyperslab over the span of wanted atoms; chunks are whole frames,
        # so HDF5 reads the same bytes either way and numpy picks the atoms.
        span = self.value[start:stop, self.lo:self.hi]
        coords = span[:, self.idx - self.lo]
        if self.scale != 1.0:
            coords = coords * np.float32(self.scale)
        return self.times[start:stop], coords, self.boxes(start, stop) if with_boxes else None

    def boxes(self, start, stop):
        """(F, 6) MDAnalysis dimensions of frames [start, stop), or None without a box."""
        if self.edges is None:
            return None
        from MDAnalysis.lib.mdamath import triclinic_box
        if self.edges_per_frame:
            edges = np.asarray(self.edges[start:stop], dtype=np.float32)
        else:
            edges = np.repeat(np.asarray(self.edges[()], dtype=np.float32)[None], stop - start, 0)
        if self.edges_scale != 1.0:
            edges = edges * np.float32(self.edges_scale)
        if edges.ndim == 2:  # a rectangular box: edge lengths only
            return np.concatenate([edges, np.full_like(edges, 90.0)], axis=1)
        # as MDAnalysis' H5MDReader: core.triclinic_box of the float32 vectors
        return np.stack([triclinic_box(*e) for e in edges]).astype(np.float32)

    def close(self):
        self.file.close()


def _length_scale(dataset, path, default=None):
    unit = dataset.attrs.get("unit")
    if unit is None:
        if default is not None:
            return default
        unit = "nm"  # the H5MD default
    unit = unit.decode() if isinstance(unit, bytes) else str(unit)
    scale = LENGTH_TO_ANGSTROM.get(unit.lower())
    if scale is None:
        raise ValueError(f"{path}: unknown length unit {unit!r} of {dataset.name}")
    return scale


def _attr(obj, name, default):
    v = obj.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)
