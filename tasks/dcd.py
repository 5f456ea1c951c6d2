"""DCD read without MDAnalysis: the selected atoms' rows straight from the file.

Why: a rank that reads DCD for RMSD needs neither MDAnalysis' import (0.65 s of
every task's start-up) nor its per-frame decoding. DCD frames have a fixed
size after a small Fortran-record header, so the header is parsed here the way
MDAnalysis' libdcd (readdcd.h) parses it, frames are read in batches into one
reused buffer and numpy picks the atoms' x, y and z rows.

Only the plain layout is read here: little-endian, 3 dimensions, no fixed
atoms, and no unit cell where the analysis needs boxes (MDAnalysis turns the
CHARMM/NAMD cell conventions into dimensions). Anything else returns None from
`open_dcd` and goes through MDAnalysis' DCDReader. Times and steps are the ones
MDAnalysis' DCDReader and ChainReader report.
"""
import os
import struct
from typing import List, Optional

import numpy as np

# MDAnalysis' units.convert(delta, "AKMA", "ps"): factor["ps"] / factor["AKMA"]
_AKMA_TO_PS = 1.0 / (1 / 4.888821e-2)
_CELL_RECORD = 4 + 6 * 8 + 4  # CHARMM's unit cell: 6 doubles in a Fortran record


class DCDFile:
    """One DCD file's layout, read from its header; what TrajectoryBlockReader
    asks of a trajectory part (n_frames, dt) and the reading itself."""

    BATCH = 64  # frames per read into the reused buffer

    def __init__(self, filename, n_atoms, n_frames, header_size, frame_size, has_cell,
                 istart, nsavc, delta):
        self.filename = filename
        self.n_atoms, self.n_frames = n_atoms, n_frames
        self.header_size, self.frame_size, self.has_cell = header_size, frame_size, has_cell
        self.istart, self.nsavc = istart, nsavc
        self.dt = delta * _AKMA_TO_PS * nsavc  # as MDAnalysis' DCDReader.ts.dt
        self._buf = None

    @classmethod
    def from_header(cls, path) -> Optional["DCDFile"]:
        """The file's layout, or None where it is not the plain layout read here."""
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                head = fh.read(92)
                if len(head) < 92 or head[4:8] != b"CORD":
                    return None
                first, = struct.unpack_from("<i", head, 0)
                nset, istart, nsavc = struct.unpack_from("<3i", head, 8)
                namnf, = struct.unpack_from("<i", head, 40)
                extra, four_d = struct.unpack_from("<2i", head, 48)
                charmm, end = struct.unpack_from("<2i", head, 84)
                title = fh.read(8)
                title_size, n_title = struct.unpack("<2i", title) if len(title) == 8 else (0, -1)
                title_end = 92 + 8 + 80 * n_title + 4  # libdcd trusts NTITLE, not the size
                fh.seek(title_end)
                atoms = fh.read(12)
        except OSError:
            return None
        if first != 84 or end != 84 or (title_size - 4) % 80 or n_title < 0 or len(atoms) != 12:
            return None  # another byte order, or not a DCD: MDAnalysis knows or says
        four, n_atoms, four_end = struct.unpack("<3i", atoms)
        if four != 4 or four_end != 4 or n_atoms <= 0 or namnf != 0 or nsavc == 0:
            return None
        if charmm:
            delta = float(np.frombuffer(head, "<f4", 1, 44)[0])
            has_cell, ndims = extra != 0, 4 if four_d == 1 else 3
        else:  # X-PLOR: a double, no cell, no fourth dimension
            delta, has_cell, ndims = struct.unpack_from("<d", head, 44)[0], False, 3
        if ndims != 3:
            return None
        header_size = title_end + 12
        frame_size = (_CELL_RECORD if has_cell else 0) + 3 * (4 * n_atoms + 8)
        if size < header_size + frame_size:
            return None
        n_frames = (size - header_size - frame_size) // frame_size + 1  # as libdcd counts
        return cls(path, n_atoms, n_frames, header_size, frame_size, has_cell, istart, nsavc,
                   delta)

    def layout_problem(self):
        """Why the first frame is not laid out as the header says, or None. A header
        that promises a unit cell the frames lack makes MDAnalysis read each frame's
        first coordinates as its cell and everything after shifted, without a word."""
        with open(self.filename, "rb") as fh:
            fh.seek(self.header_size)
            raw = fh.read(4)
        marker = struct.unpack("<i", raw)[0] if len(raw) == 4 else None
        expected = _CELL_RECORD - 8 if self.has_cell else 4 * self.n_atoms
        if marker == expected:
            return None
        if self.has_cell and marker == 4 * self.n_atoms:
            return ("its header says every frame starts with a unit cell record, but the first "
                    "frame starts with the coordinates (MDAnalysis would read coordinates as the "
                    "cell and every frame shifted). The file's header is wrong: write the "
                    "trajectory again with the program that made it")
        return (f"its first frame starts with a record of {marker} bytes where its header "
                f"promises {expected} (a damaged DCD, or one written with another layout)")

    def times(self, lo, hi):
        """MDAnalysis' DCDReader time of frames [lo, hi): (frame + istart/nsavc) * dt."""
        return (np.arange(lo, hi) + self.istart / self.nsavc) * self.dt

    def read_atoms(self, idx, lo, hi):
        """(F, A, 3) float32 of atoms `idx` in frames [lo, hi), as an atom-major view
        of coordinate-major memory (the layout the RMSD kernel wants). Where the
        atoms end early in the frame (the protein before its solvent) only each
        coordinate record's rows up to the last of them are read, else whole frames:
        on the 47,681-atom solvated AdK, CA rows took 19 us a frame, whole frames 88
        (page cache, one rank), and two ranks reading whole frames share the memory
        bandwidth (E(2) 0.75)."""
        last = int(np.max(idx)) + 1
        rows = 4 * (last + 1)  # a record's marker and its atoms up to the last selected
        if 3 * rows <= self.frame_size // 4:
            return self._read_rows(idx, lo, hi, rows)
        return self._read_frames(idx, lo, hi)

    def _records(self):
        """Where the x, y and z records start in a frame (their markers), in 4-byte words."""
        first = (_CELL_RECORD if self.has_cell else 0) // 4
        return [first + k * (self.n_atoms + 2) for k in range(3)]

    def _read_frames(self, idx, lo, hi):
        size = self.frame_size
        if self._buf is None:
            self._buf = np.empty((self.BATCH, size // 4), dtype="<f4")
        markers = self._records()
        cols = np.concatenate([m + 1 + idx for m in markers])
        out = np.empty((hi - lo, 3, idx.size), dtype=np.float32)
        with open(self.filename, "rb", buffering=0) as fh:
            for i in range(lo, hi, self.BATCH):
                m = min(self.BATCH, hi - i)
                buf = self._buf[:m]
                fh.seek(self.header_size + i * size)
                if fh.readinto(memoryview(buf).cast("B")) != m * size:
                    self._short(i, m)
                self._check_markers(buf[:, markers], i, m)
                out[i - lo:i - lo + m] = np.take(buf, cols, axis=1).reshape(m, 3, idx.size)
        return out.transpose(0, 2, 1)

    def _read_rows(self, idx, lo, hi, rows):
        """Three reads a frame: each coordinate record from its marker to the last atom."""
        records = [4 * m for m in self._records()]
        cols = 1 + idx  # past the marker
        buf = np.empty((self.BATCH, 3, rows // 4), dtype="<f4")
        out = np.empty((hi - lo, 3, idx.size), dtype=np.float32)
        fd = os.open(self.filename, os.O_RDONLY)
        try:
            for i in range(lo, hi, self.BATCH):
                m = min(self.BATCH, hi - i)
                for j in range(m):
                    frame = self.header_size + (i + j) * self.frame_size
                    for k in range(3):
                        if os.preadv(fd, [buf[j, k]], frame + records[k]) != rows:
                            self._short(i, m)
                self._check_markers(buf[:m, :, 0], i, m)
                out[i - lo:i - lo + m] = buf[:m, :, cols]
        finally:
            os.close(fd)
        return out.transpose(0, 2, 1)

    def _check_markers(self, markers, i, m):
        if not np.all(markers.view("<i4") == 4 * self.n_atoms):
            raise OSError(f"{self.filename}: frame records {i}-{i + m - 1} are not "
                          f"{self.n_atoms} atoms' coordinates (a damaged DCD?)")

    def _short(self, i, m):
        raise OSError(f"{self.filename}: frames {i}-{i + m - 1} could not be read "
                      f"whole (the file is shorter than its header says)")

    def close(self):
        self._buf = None


class DCDTrajectory:
    """Several DCD files as one trajectory, with what TrajectoryBlockReader uses of
    MDAnalysis' ChainReader: its `readers`, `dts` and `total_times`."""

    def __init__(self, files: List[DCDFile]):
        self.readers = files
        self.dts = np.array([f.dt for f in files])
        self.total_times = self.dts * np.array([f.n_frames for f in files])

    def close(self):
        for f in self.readers:
            f.close()


def open_dcd(paths, need_boxes=False) -> Optional[DCDTrajectory]:
    """The files as a DCDTrajectory where all are plain DCD read here (no unit cell
    when boxes are needed); None sends them through MDAnalysis."""
    if not all(str(p).lower().endswith(".dcd") for p in paths):
        return None
    files = [DCDFile.from_header(str(p)) for p in paths]
    if any(f is None or (need_boxes and f.has_cell) for f in files):
        return None
    return DCDTrajectory(files)
