"""Part files: what an analyze task hands to the reduce task.

One HDF5 file per analyze task (a block in tasks mode; all blocks, gathered,
in MPI mode) with datasets `frame`, `time` and the analysis' own arrays, and
attributes that let reduce check it belongs to this run. Written under a
temporary name and renamed, so a part that exists is a whole part.
"""
import json
import os

import h5py
import numpy as np


def write_part(path, arrays, attrs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with h5py.File(tmp, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)
        for key, value in attrs.items():
            f.attrs[key] = json.dumps(value) if isinstance(value, (dict, list, tuple)) else value
    os.replace(tmp, path)


def read_part(path):
    """(arrays, attrs) of one part file."""
    with h5py.File(path, "r") as f:
        arrays = {k: f[k][()] for k in f.keys()}
        attrs = {k: _load_attr(v) for k, v in f.attrs.items()}
    return arrays, attrs


def _load_attr(value):
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, np.generic):
        return value.item()
    return value
