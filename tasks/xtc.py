"""XTC read selectively: each frame decoded only up to the last atom wanted.

Why: XTC is what most users have, and decoding it is CPU-bound (2.5-13 % of
the read bandwidth, measured); MDAnalysis decodes every atom of a frame, so a
CA RMSD of a solvated protein decodes 47,681 atoms to use 214. Atoms are
stored in order, so where the selection comes before the solvent, decoding
stops at the last selected atom and the rest of the frame's bytes are never
looked at. The decoder is xdrfile's (kernel_code.py), compiled with the
kernels; coordinates equal MDAnalysis' XTC reader's bit for bit, as do
times and steps.

Frame positions come from MDAnalysis' own offsets file beside the trajectory
(`.NAME_offsets.npz`, written when the run was planned; in trajflow's cache
where the folder is read-only: offsets_cache.py) when it matches the file,
else from one pass over the frames' headers. Not read here (None from
`open_xtc`, MDAnalysis reads them): files whose frames have 9 atoms or fewer
(stored uncompressed), other magic numbers, and runs that need boxes.
"""
import os
import struct
from typing import List, Optional

import numpy as np

from .offsets_cache import lookup

MAGIC = 1995
_HEAD = struct.Struct(">iiif9fi")           # magic, natoms, step, time, box, natoms
_COMPRESSED = struct.Struct(">f3i3iii")     # precision, minint, maxint, smallidx, nbytes
HEADER_BYTES = _HEAD.size + _COMPRESSED.size  # 92
PREFIX_MARGIN = 1.25  # a frame's wanted atoms may take more bytes than the last ones did
_PAD = 256  # bytes after a chunk's last frame: a damaged frame's last atom may read ~100 ahead


class XTCFile:
    """One XTC file's frames: where each starts, and its step and time."""

    def __init__(self, filename, n_atoms, offsets, size):
        self.filename, self.n_atoms = filename, n_atoms
        self.offsets = np.asarray(offsets, dtype=np.int64)  # frame starts, + the file's end
        self.size = size
        self.n_frames = len(self.offsets) - 1
        self.dt = None  # ChainReader needs it only for several files (not read here)
        self._prefix = {}  # n_wanted -> bytes of each frame's compressed data to read

    @classmethod
    def open(cls, path) -> Optional["XTCFile"]:
        """The file's frame index (its first header checked by xtc_readable); OSError
        where a later header is not where the one before says."""
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(_HEAD.size)
        n_atoms = _HEAD.unpack(head)[1]
        offsets = lookup(path, n_atoms)  # MDAnalysis' beside the file, or trajflow's cache
        offsets = list(_scan_offsets(path, size) if offsets is None else offsets)
        # whole frames only, whichever index was used (MDAnalysis' counts a cut last frame)
        while offsets and _end_of_last(path, offsets[-1], size) > size:
            offsets.pop()
        if not offsets:
            raise OSError(f"{path}: holds no whole frame (its first frame is cut short at byte "
                          f"{size}); restore the file")
        return cls(path, n_atoms, offsets + [_end_of_last(path, offsets[-1], size)], size)

    def read(self, idx, lo, hi):
        """(coords (F, A, 3) float32 Å of atoms idx, times (F,) ps, steps (F,)) of
        frames [lo, hi)."""
        n_wanted = int(idx.max()) + 1 if idx.size else 0
        prefix = self._prefix.get(n_wanted)
        if prefix:  # each frame's first bytes only, as far as its wanted atoms took before
            got = self._decode(lo, hi, n_wanted, prefix)
            if got is None:  # some frame's atoms took more bytes: read them whole
                self._prefix.pop(n_wanted)
        if not prefix or got is None:
            got = self._decode(lo, hi, n_wanted, None)
            self._learn(n_wanted, got[3], got[4])
        out, times, steps = got[:3]
        coords = out if idx.size == n_wanted and _is_range(idx) else out[:, idx]
        return coords, times, steps

    def _learn(self, n_wanted, used, sizes):
        """Read only PREFIX_MARGIN x the bytes that decoding the wanted atoms took, where
        that is well under the frames' size (a protein first in a solvated system:
        7 % of a frame for CA RMSD of AdK; the rest of each frame is never read)."""
        if n_wanted < self.n_atoms and len(used):
            prefix = int(used.max() * PREFIX_MARGIN) + 512
            if prefix < 0.5 * float(np.mean(sizes)):
                self._prefix[n_wanted] = prefix

    def _decode(self, lo, hi, n_wanted, prefix):
        """(out (F, n_wanted, 3), times, steps, bytes used, compressed sizes), or None
        where `prefix` bytes of a frame were not enough for its wanted atoms."""
        n = hi - lo
        frame_starts = self.offsets[lo:hi]
        sizes = self.offsets[lo + 1:hi + 1] - frame_starts
        take = sizes if prefix is None else np.minimum(sizes, HEADER_BYTES + prefix)
        starts = np.zeros(n, dtype=np.int64)
        starts[1:] = np.cumsum(take)[:-1]
        buf = np.zeros(int(take.sum()) + _PAD, dtype=np.uint8)
        self._read_into(buf, frame_starts, take, starts, lo, hi)
        heads = [_HEAD.unpack_from(buf, s) for s in starts]
        comp = [_COMPRESSED.unpack_from(buf, s + _HEAD.size) for s in starts]
        if any(h[0] != MAGIC or h[1] != self.n_atoms for h in heads):
            raise OSError(f"{self.filename}: frames {lo}-{hi - 1} do not start where its "
                          "index says (the file changed since it was indexed?)")
        nbytes = np.array([c[8] for c in comp], dtype=np.int64)
        out = np.empty((n, n_wanted, 3), dtype=np.float32)
        used = np.zeros(n, dtype=np.int64)
        bad = _decoder()(buf, starts + HEADER_BYTES, np.minimum(nbytes, take - HEADER_BYTES),
                         np.array([c[0] for c in comp], dtype=np.float32),
                         np.array([c[1:4] for c in comp], dtype=np.int64).reshape(n, 3),
                         np.array([c[4:7] for c in comp], dtype=np.int64).reshape(n, 3),
                         np.array([c[7] for c in comp], dtype=np.int64), out, used)
        if bad >= 0:
            if prefix is not None and take[bad // 2] < sizes[bad // 2]:
                return None  # (a whole read says whether the frame itself is bad)
            self._refuse(lo + bad // 2, bad % 2)
        times = np.array([h[3] for h in heads], dtype=np.float32).astype(np.float64)
        steps = np.array([h[2] for h in heads], dtype=np.int64)
        return out, times, steps, used, nbytes

    def _read_into(self, buf, frame_starts, take, starts, lo, hi):
        """The frames' bytes (all of them, or each one's first `take`) into buf."""
        view = memoryview(buf)
        fd = os.open(self.filename, os.O_RDONLY)
        try:
            if np.array_equal(take, self.offsets[lo + 1:hi + 1] - frame_starts):  # one read
                runs = [(int(frame_starts[0]), 0, int(take.sum()))]
            else:
                runs = [(int(f), int(s), int(t)) for f, s, t in zip(frame_starts, starts, take)]
            for offset, at, length in runs:
                if os.preadv(fd, [view[at:at + length]], offset) != length:
                    raise OSError(f"{self.filename}: frames {lo}-{hi - 1} could not be read "
                                  "whole")
        finally:
            os.close(fd)

    def _refuse(self, frame, past_table):
        where = f"frame {frame} (byte {int(self.offsets[frame])})"
        if past_table:
            raise OSError(
                f"{self.filename}: {where} uses a compression index past the end of "
                "xdrfile's table, whose value no reader defines (MDAnalysis decodes it "
                "with whatever follows the table in its own library); coordinates this "
                "large need a lower XTC precision: write the trajectory again with one "
                "(or as TRR/DCD/H5MD)")
        raise OSError(f"{self.filename}: {where} is damaged (its compressed coordinates "
                      "do not decode within its bytes)")

    def close(self):
        pass


def _is_range(idx):
    """idx is 0, 1, ..., n - 1 (the whole frame, or a prefix): no copy is needed."""
    return idx.size == 0 or (idx[0] == 0 and idx[-1] == idx.size - 1
                             and bool(np.all(np.diff(idx) == 1)))


def _decoder():
    from .kernels import _entry
    return _entry("xtc_decode")


def _frame_bytes(head, comp):
    n_atoms = head[1]
    return HEADER_BYTES + (comp[8] + 3) // 4 * 4 if n_atoms > 9 else _HEAD.size + 12 * n_atoms


def _scan_offsets(path, size):
    """Frame starts from one pass over the frames' headers; a last frame cut short
    is left out (the plan analyses whole frames only)."""
    offsets, pos = [], 0
    with open(path, "rb") as fh:
        while pos + HEADER_BYTES <= size:
            fh.seek(pos)
            raw = fh.read(HEADER_BYTES)
            head, comp = _HEAD.unpack_from(raw), _COMPRESSED.unpack_from(raw, _HEAD.size)
            if head[0] != MAGIC:  # (MDAnalysis' reader died of SIGFPE on such a file, seen)
                raise OSError(f"{path}: frame {len(offsets)} (byte {pos}) does not start with "
                              "an XTC header: the file is damaged there")
            end = pos + _frame_bytes(head, comp)
            if end > size:
                break
            offsets.append(pos)
            pos = end
    return offsets


def frame_spans(path):
    """(start, end) of each whole frame of an XTC file, in bytes."""
    size = os.path.getsize(path)
    starts = _scan_offsets(path, size)
    if not starts:
        return []
    return list(zip(starts, starts[1:] + [_end_of_last(path, starts[-1], size)]))


def _end_of_last(path, last, size):
    """Where the frame starting at `last` ends (past `size` when it is cut short)."""
    with open(path, "rb") as fh:
        fh.seek(last)
        raw = fh.read(HEADER_BYTES)
    if len(raw) < HEADER_BYTES:
        return size + 1
    return last + _frame_bytes(_HEAD.unpack_from(raw), _COMPRESSED.unpack_from(raw, _HEAD.size))


class XTCTrajectory:
    """One XTC file as TrajectoryBlockReader reads a trajectory (its `readers`)."""

    def __init__(self, files: List[XTCFile]):
        self.readers = files

    def close(self):
        pass


def xtc_readable(paths, need_boxes=False):
    """Whether open_xtc will read these (its first header only: no index built)."""
    if need_boxes or len(paths) != 1 or not str(paths[0]).lower().endswith(".xtc"):
        return False
    try:
        with open(paths[0], "rb") as fh:
            head = fh.read(_HEAD.size)
    except OSError:
        return False
    return len(head) == _HEAD.size and _HEAD.unpack(head)[0] == MAGIC and _HEAD.unpack(head)[1] > 9


def open_xtc(paths, need_boxes=False) -> Optional[XTCTrajectory]:
    """A single XTC file read here, or None (several files, boxes needed, or a
    layout left to MDAnalysis)."""
    if not xtc_readable(paths, need_boxes):
        return None
    f = XTCFile.open(str(paths[0]))
    return None if f is None else XTCTrajectory([f])
