"""Is every frame of an input trajectory whole? Checked on the workstation, before any pilot.

A truncated file (a copy cut short, a disk that filled up, a simulation
killed mid-write) was analysed silently (DCD: MDAnalysis drops the partial
frame) or failed on the pilot after a retry (XTC/TRR). Each check costs
O(frames) of index work at most, never a decode of the whole file:
  DCD   the file's size against its header and fixed frame size;
  XTC, TRR  MDAnalysis' frame index (every frame header, read when the file is
        opened) and a read of the last frame, which ends at the file's end;
  H5MD  the lengths of positions, their steps and times, and the box agree.
`whole_frames(reader)` says how many leading frames are whole and where the
damage starts, or None when the file is whole.
"""
import dataclasses
import os
import warnings
from typing import Optional
from trajflow.tasks.dcd import DCDFile
from trajflow.tasks.h5md import H5MDBlockReader, H5MDError, is_h5md


@dataclasses.dataclass
class Damage:
    file: str
    whole_frames: int        # frames that can be read in full, from the start
    frames_seen: int         # frames MDAnalysis counts in the file
    where: str               # where the damage starts, in words

    def describe(self):
        return (f"{self.file} is damaged or truncated: {self.whole_frames} whole frame(s) "
                f"({self.where})")


def unreadable(path) -> Optional[str]:
    """Why the file cannot be analysed as it is, whatever its length (so not a
    truncation --allow-truncated could pass), or None: a DCD whose frames are not
    laid out as its header says, an H5MD file trajflow's reader refuses (units)."""
    if str(path).lower().endswith(".dcd"):
        layout = DCDFile.from_header(str(path))
        return None if layout is None else layout.layout_problem()
    if is_h5md(path):
        try:
            H5MDBlockReader(str(path), [0]).close()
        except H5MDError as exc:
            return str(exc)
    return None


def whole_frames(reader) -> Optional[Damage]:
    """None if every frame of this (single-file) MDAnalysis reader is whole, else Damage."""
    kind = type(reader).__name__
    if kind == "DCDReader":
        return _dcd(reader)
    if kind in ("XTCReader", "TRRReader"):
        return _xdr(reader)
    if kind == "H5MDReader":
        return _h5md(reader.filename)
    return None


def _dcd(reader):
    f = reader._file
    try:
        header, first, size = f._header_size, f._firstframesize, f._framesize
    except AttributeError:
        return None
    body = os.path.getsize(reader.filename) - header
    if body < first:
        whole, rest = 0, body
    else:
        whole, rest = 1 + (body - first) // size, (body - first) % size
    if rest == 0 and whole >= reader.n_frames:
        return None
    cut = header + (first + (whole - 1) * size if whole else 0)
    return Damage(reader.filename, whole, reader.n_frames,
                  f"{rest} byte(s) of a partial frame from byte {cut}; each frame is {size} bytes")


def _xdr(reader):
    n = reader.n_frames
    if n == 0:
        return None
    last = _last_readable(reader, n)
    if last == n - 1:
        return None
    offsets = getattr(reader, "_offsets", None)
    at = int(offsets[last + 1]) if offsets is not None and len(offsets) > last + 1 else None
    return Damage(reader.filename, last + 1, n,
                  f"frame {last + 1} of {n} cannot be read"
                  + (f", from byte {at} of {os.path.getsize(reader.filename)}" if at is not None
                     else ""))


def _last_readable(reader, n):
    """The last frame that reads, looking back from the end (a cut-short file is
    damaged at its end); -1 if none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(n - 1, -1, -1):
            try:
                reader[i]
                reader[0]  # leave the reader where a fresh one is
                return i
            except Exception:
                continue
    return -1


def _h5md(path):
    import h5py
    with h5py.File(path, "r") as f:
        particles = f.get("particles")
        if particles is None or not len(particles):
            return None
        group = particles[next(iter(particles))]
        lengths = {}
        for name in ("position/value", "position/step", "position/time", "box/edges/value",
                     "box/edges/step", "box/edges/time"):
            item = group.get(name)
            if item is not None and getattr(item, "shape", ()) != ():
                lengths[name] = item.shape[0]
    if "position/value" not in lengths or len(set(lengths.values())) <= 1:
        return None
    whole = min(lengths.values())
    return Damage(path, whole, lengths["position/value"],
                  "datasets of different lengths: " +
                  ", ".join(f"{k} {v}" for k, v in lengths.items()))
