"""Demo and benchmark trajectories, built once from MDAnalysisTests' AdK files.

The AdK PSF/DCD (3341 atoms, 98 frames) concatenated K times, written to a
cache folder with time running on monotonically across copies. Nothing large
is ever committed; the cache is rebuilt if it is missing or incomplete.
"""
import os

import numpy as np


def cache_dir() -> str:
    base = os.environ.get("TRAJFLOW_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trajflow")
    os.makedirs(base, exist_ok=True)
    return base


def adk_files():
    from MDAnalysisTests.datafiles import PSF, DCD
    return PSF, DCD


def adk_concatenated(copies=100, fmt="DCD", folder=None):
    """(topology, trajectory) of AdK repeated `copies` times in format DCD, XTC or H5MD."""
    import MDAnalysis as mda
    import warnings
    from trajflow.tasks.h5md import H5MDWriter
    psf, dcd = adk_files()
    folder = folder or cache_dir()
    path = os.path.join(folder, f"adk_x{copies}.{fmt.lower()}")
    if os.path.exists(path):
        return psf, path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(psf, dcd)
        coords = u.trajectory.timeseries(order="fac")  # (98, 3341, 3), 3.9 MB
        dt = u.trajectory.dt
    n = len(coords)
    tmp = os.path.join(folder, f".adk_x{copies}.tmp{os.getpid()}.{fmt.lower()}")
    if fmt.upper() == "H5MD":
        w = H5MDWriter(tmp, coords.shape[1], n * copies)
        for c in range(copies):
            w.write((np.arange(n) + c * n) * dt, coords)
        w.close()
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = mda.Universe(psf, coords[:1].copy(), format="MEMORY", dt=dt)
            with mda.Writer(tmp, n_atoms=coords.shape[1], format=fmt.upper(), dt=dt) as w:
                ts = out.trajectory.ts
                for c in range(copies):
                    for i in range(n):
                        ts.positions = coords[i]
                        ts.frame = c * n + i
                        ts.time = (c * n + i) * dt
                        ts.data["step"] = c * n + i
                        w.write(out.atoms)
    os.replace(tmp, path)
    return psf, path
