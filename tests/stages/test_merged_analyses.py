"""RMSF and PCA over blocks and ranks (tasks/parallel_analyses.py), against MDAnalysis'
serial classes, which cannot run them in parallel: RMSF to 1e-6 relative, PCA's
variances to 1e-6 relative and its components to 1e-5 up to sign, through every io
and mode, both schedules, frame ranges and lists, selections, align on and off, as
built-in names and as MDAnalysis' own classes returned by a user's factory."""
import os
import warnings

import MDAnalysis as mda
import numpy as np
import pytest
from MDAnalysis.analysis.pca import PCA
from MDAnalysis.analysis.rms import RMSF

from run_stages import plan_and_run
from trajflow.tasks.parallel_analyses import merge_moments, ParallelPCA, ParallelRMSF
from trajflow.tasks.results import open_result

FACTORIES = os.path.join(os.path.dirname(__file__), "..", "analyses", "factories.py")
PCA_SELECTION = "backbone and resid 10:40"
TOP_COMPONENTS = 8  # the well-separated ones: the smallest variances are rounding


def serial(cls, u, frames, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs).run(**frames).results


def assert_pca_equal(got, ref, n_frames=98):
    """The leading components (at most n_frames - 2: n frames span n - 1 dimensions, and
    the variance of the others is rounding, 1e-7 in MDAnalysis' float32 deviations)."""
    k = min(TOP_COMPONENTS, n_frames - 2)
    assert np.isrealobj(got["variance"]) and np.isrealobj(got["p_components"])
    np.testing.assert_allclose(got["variance"][:k], ref.variance[:k], rtol=1e-6)
    np.testing.assert_allclose(got["cumulated_variance"][:k], ref.cumulated_variance[:k],
                               rtol=1e-6)
    components, expected = got["p_components"][:, :k], ref.p_components[:, :k]
    signs = np.sign(np.sum(components * expected, axis=0))
    np.testing.assert_allclose(components * signs, expected, atol=1e-5)


CASES = [  # io, mode, schedule, frames
    ("shared", "mpi", "static", {}),
    ("h5md", "tasks", "static", {"start": 5, "stop": 90, "step": 3}),
    ("split", "mpi", "dynamic", {"frames": [0, 7, 3, 50, 51, 97, 20, 11]}),
    ("shared", "tasks", "dynamic", {"start": -40}),
]


@pytest.mark.parametrize("io,mode,schedule,frames", CASES)
def test_rmsf_equals_serial_mdanalysis(tmp_path, adk, io, mode, schedule, frames):
    top, traj = adk
    _, plan = plan_and_run(tmp_path / "run", top, [traj], "rmsf", io=io, mode=mode,
                           schedule=schedule, blocks=3, cpus=3, select="backbone",
                           side_by_side=True, **frames)
    got = open_result(plan.workdir)
    u = mda.Universe(top, traj)
    ref = serial(RMSF, u, frames, atomgroup=u.select_atoms("backbone"))
    np.testing.assert_allclose(got["rmsf"], ref.rmsf, rtol=1e-6)
    assert set(got) == {"rmsf", "frame", "time"}  # the moments are gone, nothing pickled


@pytest.mark.parametrize("align", [True, False])
@pytest.mark.parametrize("io,mode,schedule,frames", CASES[:3])
def test_pca_equals_serial_mdanalysis(tmp_path, adk, io, mode, schedule, frames, align):
    top, traj = adk
    _, plan = plan_and_run(tmp_path / "run", top, [traj], "pca", io=io, mode=mode,
                           schedule=schedule, blocks=3, cpus=3, select=PCA_SELECTION,
                           args={"align": align}, side_by_side=True, **frames)
    got = open_result(plan.workdir)
    u = mda.Universe(top, traj)
    assert_pca_equal(got, serial(PCA, u, frames, universe=u, select=PCA_SELECTION,
                                 align=align), plan.n_frames)


@pytest.mark.parametrize("name,args", [("mda_rmsf", {}), ("mda_pca", {"align": False})])
def test_mdanalysis_own_serial_classes_run_merged(tmp_path, adk, name, args):
    """A factory returning MDAnalysis' RMSF or PCA (serial-only in MDAnalysis) runs over
    blocks, as trajflow's merged class, and equals MDAnalysis' serial run."""
    top, traj = adk
    _, plan = plan_and_run(tmp_path / "run", top, [traj], f"{FACTORIES}:{name}", mode="mpi",
                           blocks=2, cpus=2, args=args, side_by_side=True)
    assert plan.factory["class"].endswith(("ParallelRMSF", "ParallelPCA"))
    got = open_result(plan.workdir)
    u = mda.Universe(top, traj)
    if name == "mda_rmsf":
        ref = serial(RMSF, u, {}, atomgroup=u.select_atoms("name CA"))
        np.testing.assert_allclose(got["rmsf"], ref.rmsf, rtol=1e-6)
    else:
        assert_pca_equal(got, serial(PCA, u, {}, universe=u, select=PCA_SELECTION, align=False))


def test_the_merged_classes_run_on_mdanalysis_own_backend(adk):
    """The same classes under MDAnalysis' run(backend="multiprocessing")."""
    u = mda.Universe(*adk)
    ref = serial(RMSF, u, {"step": 2}, atomgroup=u.select_atoms("name CA"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = ParallelRMSF(u.select_atoms("name CA")).run(step=2, backend="multiprocessing",
                                                          n_workers=3).results
        pca = ParallelPCA(u, select=PCA_SELECTION).run(backend="multiprocessing",
                                                       n_workers=2).results
    np.testing.assert_allclose(got.rmsf, ref.rmsf, rtol=1e-6)
    assert_pca_equal(pca, serial(PCA, u, {}, universe=u, select=PCA_SELECTION))


def test_moments_merge_exactly_whatever_the_split():
    """Chan's merge of (frames, mean, M) equals the moments of the whole, for sums of
    squares and co-moment matrices, with empty pieces among them."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(50, 6)) * 30 + 1000  # far from the origin, as coordinates may be
    cuts = [0, 1, 1, 17, 40, 50]
    pieces = [x[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

    def moments(p, matrix):
        if not len(p):
            return 0, np.zeros(6), np.zeros((6, 6)) if matrix else np.zeros(6)
        d = p - p.mean(axis=0)
        return len(p), p.mean(axis=0), d.T @ d if matrix else (d ** 2).sum(axis=0)

    for matrix in (False, True):
        n, mean, m = merge_moments([moments(p, matrix) for p in pieces])
        n_all, mean_all, m_all = moments(x, matrix)
        assert n == n_all
        np.testing.assert_allclose(mean, mean_all, rtol=1e-13)
        np.testing.assert_allclose(m, m_all, rtol=1e-9)


@pytest.mark.parametrize("name", ["rmsf", "pca"])
def test_merged_analyses_on_the_periodic_solvated_xtc(tmp_path, solvated, name):
    """A file nobody here wrote: MDAnalysisTests' solvated AdK (GRO/XTC, periodic, its own
    XTC precision), protein atoms only, through H5MD and tasks mode."""
    top, traj = solvated
    select = "name CA" if name == "rmsf" else "backbone and resid 20:40"
    _, plan = plan_and_run(tmp_path / "run", top, [traj], name, io="h5md", mode="tasks",
                           blocks=3, cpus=3, select=select, side_by_side=True)
    got = open_result(plan.workdir)
    u = mda.Universe(top, traj)
    if name == "rmsf":
        ref = serial(RMSF, u, {}, atomgroup=u.select_atoms(select))
        np.testing.assert_allclose(got["rmsf"], ref.rmsf, rtol=1e-6)
    else:
        assert_pca_equal(got, serial(PCA, u, {}, universe=u, select=select), plan.n_frames)
