"""Part files: what an analyze task hands to the reduce task.

One HDF5 file per analyze task (a block in tasks mode; all blocks, gathered,
in MPI mode) with datasets `frame`, `time` and the analysis' own arrays, and
one JSON attribute `trajflow_part` (what reduce checks it belongs to this run:
one attribute, because each h5py attribute costs ~0.07 ms and rank 0 writes
its part while the job's clock runs). Written under a temporary name and
renamed, so a part that exists was written whole; the attribute also holds a
CRC-32 of every array, so a part damaged afterwards (a truncated file, an
overwritten value) is found when it is read, named, and analysed again by
--resume.
"""
import contextlib
import json
import os
import zlib

import h5py
import numpy as np

from .rundir import replaced_whole, temporary_name

ATTRIBUTE = "trajflow_part"


def warm_up():
    """Start the HDF5 library (its first file in a process costs ~0.7 ms more than
    the next) on an in-memory file, before any rank's clock starts: like imports,
    that is start-up, not the analysis' writing."""
    with h5py.File("warm-up", "w", driver="core", backing_store=False) as f:
        f.create_dataset("x", data=np.zeros(1))
        f.attrs["x"] = "x"


def _plain(value):
    """numpy values in the attributes, as JSON has them."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"part attribute of type {type(value).__name__} is not JSON")


class DamagedPart(Exception):
    """A part file that cannot be read or whose data do not match its checksum."""


def checksum(arrays, row_order=None):
    """CRC-32 over the arrays' names and bytes, in name order (~1 GB/s); `row_order`:
    {key: [(start, stop)]}, the rows of that key in that order (as write_part writes them)."""
    crc = 0
    for key in sorted(arrays):
        crc = zlib.crc32(key.encode(), crc)
        spans = (row_order or {}).get(key)
        pieces = [arrays[key]] if spans is None else [arrays[key][a:b] for a, b in spans]
        for piece in pieces:
            crc = zlib.crc32(np.ascontiguousarray(piece).data, crc)
    return crc


def write_part(path, arrays, attrs, first_wins=False, row_order=None):
    """Write the part whole under a temporary name, then put it in place. With
    `first_wins` (two copies of a block racing, block_claims.py) a part already
    there is kept and False returned: the link fails where the part exists.
    `row_order`: {key: [(start, stop)]}, the rows of each array in the order written."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not first_wins:
        with replaced_whole(path) as tmp:
            _write_h5(tmp, arrays, attrs, row_order)
        return True
    tmp = temporary_name(path)
    try:
        _write_h5(tmp, arrays, attrs, row_order)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _write_h5(file, arrays, attrs, row_order=None):
    with h5py.File(file, "w") as f:
        for key, value in arrays.items():
            spans = (row_order or {}).get(key)
            if spans is None:
                f.create_dataset(key, data=value)
                continue
            rows = sum(stop - start for start, stop in spans)
            dataset = f.create_dataset(key, shape=(rows,) + value.shape[1:], dtype=value.dtype)
            at = 0
            for start, stop in spans:
                if stop > start:
                    dataset[at:at + stop - start] = value[start:stop]
                at += stop - start
        f.attrs[ATTRIBUTE] = json.dumps({**attrs, "crc32": checksum(arrays, row_order)},
                                        default=_plain)


def read_part(path):
    """(arrays, attrs) of one part file; DamagedPart naming it if it is not whole."""
    try:
        with h5py.File(path, "r") as f:
            arrays = {k: f[k][()] for k in f.keys()}
            attrs = json.loads(f.attrs[ATTRIBUTE])
    except (OSError, KeyError, ValueError) as exc:
        raise DamagedPart(f"part {path} cannot be read ({type(exc).__name__}: {exc})") from None
    if attrs.get("crc32") != checksum(arrays):
        raise DamagedPart(f"part {path} is damaged: its data do not match the checksum written "
                          "with it")
    return arrays, attrs


def is_whole(path):
    """True if the part exists and reads back with its checksum (a FIFO or a link planted
    in a run folder is not a part: it is never opened)."""
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        read_part(path)
    except (DamagedPart, FileNotFoundError):
        return False
    return os.path.exists(path)
