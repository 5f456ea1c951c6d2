"""Shared fixtures: real MDAnalysisTests files and trajectories built from them at run time."""
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", module="MDAnalysis")


@pytest.fixture(scope="session")
def adk():
    from MDAnalysisTests.datafiles import PSF, DCD
    return PSF, DCD


@pytest.fixture(scope="session")
def adk_xtc(adk, tmp_path_factory):
    """AdK's 98 frames written as XTC (lossy, so compared with MDAnalysis reading the XTC)."""
    import MDAnalysis as mda
    psf, dcd = adk
    path = str(tmp_path_factory.mktemp("xtc") / "adk.xtc")
    u = mda.Universe(psf, dcd)
    with mda.Writer(path, n_atoms=len(u.atoms)) as w:
        for _ in u.trajectory:
            w.write(u.atoms)
    return psf, path


@pytest.fixture(scope="session")
def solvated():
    """MDAnalysisTests' solvated AdK (GRO + XTC): 47,681 atoms, 10 frames, a triclinic
    (rhombic dodecahedron) box with the protein broken across it: consecutive CA
    atoms near residue 124 are ~80 Å apart in the raw coordinates."""
    from MDAnalysisTests.datafiles import GRO, XTC
    return GRO, XTC


@pytest.fixture(scope="session")
def solvated_trr():
    from MDAnalysisTests.datafiles import GRO, TRR
    return GRO, TRR


@pytest.fixture(scope="session")
def solvated_dcd(solvated, tmp_path_factory):
    """The solvated system written as DCD (with its unit cell), read through the DCD paths."""
    import MDAnalysis as mda
    gro, xtc = solvated
    path = str(tmp_path_factory.mktemp("solvated") / "solvated.dcd")
    u = mda.Universe(gro, xtc)
    with mda.Writer(path, n_atoms=len(u.atoms)) as w:
        for _ in u.trajectory:
            w.write(u.atoms)
    return gro, path


@pytest.fixture(scope="session")
def reference_results():
    """MDAnalysis' own answers, computed once per (topology, trajectories, analysis)."""
    cache = {}

    def compute(top, trajs, analysis):
        key = (top, tuple(trajs), analysis)
        if key not in cache:
            import MDAnalysis as mda
            from MDAnalysis.analysis import rms
            from MDAnalysis.analysis.dihedrals import Ramachandran
            u = mda.Universe(top, trajs[0] if len(trajs) == 1 else list(trajs))
            if analysis == "rmsd":
                r = rms.RMSD(u, select="name CA").run().results.rmsd
                cache[key] = {"frame": r[:, 0], "time": r[:, 1], "rmsd": r[:, 2]}
            else:
                rama = Ramachandran(u.select_atoms("protein")).run()
                ang = np.deg2rad(rama.results.angles)  # (F, R, 2)
                feats = np.stack([np.cos(ang[..., 0]), np.sin(ang[..., 0]),
                                  np.cos(ang[..., 1]), np.sin(ang[..., 1])], axis=2)
                times = np.array([u.trajectory.time for _ in u.trajectory])
                cache[key] = {"frame": np.arange(len(times)), "time": times,
                              "features": feats.reshape(len(times), -1)}
        return cache[key]
    return compute
