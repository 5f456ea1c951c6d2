"""Demo and benchmark trajectories, built once from MDAnalysisTests' files.

The AdK PSF/DCD (3341 atoms, 98 frames) or the solvated AdK GRO/XTC (47,681
atoms, 10 frames, periodic) concatenated K times, written to a cache folder
with time running on monotonically across copies. Nothing large
is ever committed; the cache is rebuilt if it is missing or incomplete.
"""
import os

import numpy as np
from trajflow.tasks.h5md import H5MDWriter
from trajflow.tasks.offsets_cache import cache_root
from trajflow.workflows.errors import InputError


def cache_dir() -> str:
    base = cache_root()
    os.makedirs(base, exist_ok=True)
    return base


def mdanalysis_data(*names):
    """MDAnalysisTests' data files by their names in MDAnalysisTests.datafiles;
    InputError saying how to install them when the package is missing (it is the
    `demo` extra, not a requirement: only the demo, the benchmarks and the tests use it)."""
    try:
        import MDAnalysisTests.datafiles as datafiles
    except ImportError:
        raise InputError("the demo and benchmark data come from MDAnalysisTests, which is not "
                         "installed: pip install 'trajflow[demo]' (or MDAnalysisTests)") from None
    return tuple(getattr(datafiles, name) for name in names)


def adk_files():
    return mdanalysis_data("PSF", "DCD")


def adk_concatenated(copies=100, fmt="DCD", folder=None):
    """(topology, trajectory) of AdK repeated `copies` times in format DCD, XTC or H5MD."""
    psf, dcd = adk_files()
    return psf, concatenated(psf, dcd, f"adk_x{copies}", copies, fmt, folder)


def solvated_concatenated(copies=20, fmt="XTC", folder=None):
    """(topology, trajectory) of MDAnalysisTests' solvated AdK (GRO/XTC, 47,681 atoms,
    10 frames, triclinic box) repeated `copies` times."""
    gro, xtc = mdanalysis_data("GRO", "XTC")
    return gro, concatenated(gro, xtc, f"solvated_x{copies}", copies, fmt, folder)


def concatenated(top, traj, name, copies, fmt, folder=None):
    """`traj` repeated `copies` times into the cache as `name.<fmt>` (DCD, XTC or
    H5MD), boxes kept, time and step running on monotonically across copies."""
    import MDAnalysis as mda
    import warnings
    folder = folder or cache_dir()
    path = os.path.join(folder, f"{name}.{fmt.lower()}")
    if os.path.exists(path):
        return path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(top, traj)
        coords = u.trajectory.timeseries(order="fac")  # AdK: (98, 3341, 3), 3.9 MB
        boxes = [None if ts.dimensions is None else ts.dimensions.copy() for ts in u.trajectory]
        dt = u.trajectory.dt
    n = len(coords)
    tmp = os.path.join(folder, f".{name}.tmp{os.getpid()}.{fmt.lower()}")
    if fmt.upper() == "XTC" and traj.lower().endswith(".xtc"):
        _repeat_xtc(traj, copies, tmp, dt)
    elif fmt.upper() == "H5MD":
        w = H5MDWriter(tmp, coords.shape[1], n * copies)  # periodic if any frame has a box
        dims = np.array([np.zeros(6, np.float32) if b is None else b for b in boxes])
        for c in range(copies):
            w.write((np.arange(n) + c * n) * dt, coords, dims)
        w.close()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = mda.Universe(top, coords[:1].copy(), format="MEMORY", dt=dt)
            with mda.Writer(tmp, n_atoms=coords.shape[1], format=fmt.upper(), dt=dt) as w:
                ts = out.trajectory.ts
                for c in range(copies):
                    for i in range(n):
                        ts.positions = coords[i]
                        ts.dimensions = boxes[i]
                        ts.frame = c * n + i
                        ts.time = (c * n + i) * dt
                        ts.data["step"] = c * n + i
                        w.write(out.atoms)
    os.replace(tmp, path)
    return path


def _repeat_xtc(src, copies, dst, dt):
    """An XTC's frames repeated as they are, not decoded and encoded again (a gigabyte in
    seconds, where MDAnalysis' writer takes minutes), each frame's step and time
    rewritten to run on: step c*n+i, time (c*n+i)*dt."""
    import struct
    from trajflow.tasks.xtc import frame_spans
    with open(src, "rb") as fh:
        data = fh.read()
    frames = [bytearray(data[start:end]) for start, end in frame_spans(src)]
    n = len(frames)
    with open(dst, "wb") as out:
        for c in range(copies):
            for i, frame in enumerate(frames):
                struct.pack_into(">if", frame, 8, c * n + i, (c * n + i) * dt)
                out.write(frame)
