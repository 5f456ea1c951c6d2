"""RMSF and PCA over blocks of frames: MDAnalysis' own classes with a declared combination.

MDAnalysis runs RMSF and PCA serially only (`_analysis_algorithm_is_parallelizable`
is False): each keeps running sums over the frames in attributes, which no
parallel backend can merge. Here each piece of frames keeps its moments in
`results[MOMENTS]` = (frames, mean, M), M the sum of squared deviations from the
piece's mean (RMSF: per atom and axis) or their co-moment matrix (PCA); MDAnalysis'
own ResultsGroup merges the pieces with Chan, Golub and LeVeque's pairwise update,
exact in exact arithmetic whatever the split; `_conclude` then computes what the
serial class computes from the merged moments. PCA aligns every frame onto the
run's first frame, as the serial class does, in every piece.

The classes run through MDAnalysis' own `run(backend=...)` as well as trajflow's
blocks and ranks; a factory that returns MDAnalysis' `RMSF` or `PCA` is given
these (`parallel_version`).

    >>> from trajflow.tasks.parallel_analyses import ParallelRMSF
    >>> ParallelRMSF(u.select_atoms("name CA")).run(backend="multiprocessing", n_workers=2)
"""
import numpy as np
from MDAnalysis.analysis.base import Results, ResultsGroup
from MDAnalysis.analysis.pca import PCA
from MDAnalysis.analysis.rms import RMSF

MOMENTS = "trajflow_moments"  # a piece's (frames, mean, M) in results; gone after _conclude


def merge_moments(pieces):
    """(frames, mean, M) of the pieces together (Chan, Golub & LeVeque 1979): M a sum of
    squared deviations (same shape as mean) or a co-moment matrix (mean a vector)."""
    n, mean, moment = 0, None, None
    for n_b, mean_b, moment_b in pieces:
        if n_b == 0:
            continue
        if n == 0:
            n, mean, moment = n_b, np.array(mean_b, dtype=np.float64), \
                np.array(moment_b, dtype=np.float64)
            continue
        total = n + n_b
        delta = np.asarray(mean_b, dtype=np.float64) - mean
        spread = np.outer(delta, delta) if moment.ndim == 2 and mean.ndim == 1 else delta ** 2
        moment = moment + moment_b + spread * (n * n_b / total)
        mean = mean + delta * (n_b / total)
        n = total
    return n, mean, moment


class _Moments:
    """What both classes share: parallelisable by their declared merge of moments."""
    _analysis_algorithm_is_parallelizable = True

    @classmethod
    def get_supported_backends(cls):
        return ("serial", "multiprocessing", "dask")

    def _get_aggregator(self):
        return ResultsGroup(lookup={MOMENTS: merge_moments})

    def _merged_moments(self):
        """The run's (frames, mean, M), taken out of results."""
        moments = self.results.pop(MOMENTS, None)
        if moments is None or moments[0] == 0:
            raise ValueError(f"{type(self).__name__}: no frame was analysed")
        return moments


class ParallelRMSF(_Moments, RMSF):
    """MDAnalysis' RMSF (no superposition: align the trajectory first, as for RMSF),
    merged over pieces of frames; `results.rmsf` as the serial class gives it."""

    def _prepare(self):
        super()._prepare()
        self.results = Results()  # a second run() starts from nothing, as a piece must
        self.results[MOMENTS] = (0, self.mean, self.sumsquares)  # a piece with no frame

    def _single_frame(self):
        super()._single_frame()  # the serial class' own update (Welford), per piece
        self.results[MOMENTS] = (self._frame_index + 1, self.mean, self.sumsquares)

    def _conclude(self):
        n, self.mean, self.sumsquares = self._merged_moments()
        self.results.rmsf = np.sqrt(self.sumsquares.sum(axis=1) / n)
        if not (self.results.rmsf >= 0).all():
            raise ValueError("Some RMSF values negative; overflow or underflow occurred")


class ParallelPCA(_Moments, PCA):
    """MDAnalysis' PCA merged over pieces of frames: the mean and the covariance of the
    (aligned) positions, then their eigen-decomposition; `results.variance`,
    `cumulated_variance` and `p_components` as the serial class gives them (real, as a
    covariance's are). The covariance is (3N)^2 float64 per piece: 8 MB for 340 atoms."""

    def _setup_frames(self, trajectory, start=None, stop=None, step=None, frames=None):
        """The whole run's frames (each piece aligns onto the run's first one)."""
        super()._setup_frames(trajectory, start=start, stop=stop, step=step, frames=frames)
        self._run_n_frames = self.n_frames
        self._run_first_frame = self._sliced_trajectory[0].frame if self.n_frames else 0

    def _prepare(self):
        if self._mean is not None:
            raise ValueError("PCA over pieces of frames computes the mean itself: drop mean=")
        if self._run_n_frames == 1:
            raise ValueError("No covariance information can be gathered from a single "
                             "trajectory frame.")
        self._u.trajectory[self._run_first_frame]  # the reference, as the serial class
        self._reference = self._u.select_atoms(self._select)
        self._atoms = self._u.select_atoms(self._select)
        self._n_atoms = self._atoms.n_atoms
        self._ref_atom_positions = self._reference.positions
        self._ref_cog = self._reference.center_of_geometry()
        self._ref_atom_positions -= self._ref_cog
        n_dim = self._n_atoms * 3
        self._count, self._xmean, self.cov = 0, np.zeros(n_dim), np.zeros((n_dim, n_dim))
        self.results = Results()
        self.results[MOMENTS] = (0, self._xmean, self.cov)  # a piece with no frame

    def _single_frame(self):
        if self.align:
            from MDAnalysis.analysis.align import _fit_to
            mobile_cog = self._atoms.center_of_geometry()
            _fit_to(self._atoms.positions - mobile_cog, self._ref_atom_positions, self._atoms,
                    mobile_com=mobile_cog, ref_com=self._ref_cog)
        x = self._atoms.positions.ravel().astype(np.float64)
        self._count += 1
        delta = x - self._xmean  # Welford's update of the mean and the co-moment matrix
        self._xmean = self._xmean + delta / self._count
        self.cov += np.outer(delta, x - self._xmean)
        self.results[MOMENTS] = (self._count, self._xmean, self.cov)

    def _conclude(self):
        n, self._xmean, comoment = self._merged_moments()
        # what transform() needs, on this object (its pieces ran on copies of it)
        self._atoms = self._reference = self._u.select_atoms(self._select)
        self._n_atoms = self._atoms.n_atoms
        self.mean = self._xmean.reshape(-1, 3)
        self.cov = (comoment + comoment.T) / (2 * (n - 1))  # symmetric, as x x^T sums are
        # eigh, for a symmetric matrix: real, where the serial class' eig gives complex
        # pairs for the vanishing variances of fewer frames than dimensions (same leading
        # components, to 1e-8 here)
        e_vals, e_vects = np.linalg.eigh(self.cov)
        sort_idx = np.argsort(e_vals)[::-1]
        self._variance = e_vals[sort_idx]
        self._p_components = e_vects[:, sort_idx]
        self._calculated = True
        self.n_components = self._n_components


PARALLEL_VERSIONS = {RMSF: ParallelRMSF, PCA: ParallelPCA}


def parallel_version(analysis):
    """`analysis` itself, or, for MDAnalysis' serial-only RMSF and PCA, the same object
    as its parallel class here (its arguments and state are the serial class')."""
    parallel = PARALLEL_VERSIONS.get(type(analysis))
    if parallel is ParallelPCA and analysis._mean is not None:
        raise ValueError("PCA with mean= cannot be merged over blocks (trajflow computes the "
                         "mean of the frames): drop mean=, or run it serially with MDAnalysis")
    if parallel is not None:
        analysis.__class__ = parallel
    return analysis


# --- `--analysis rmsf` and `--analysis pca`: factories of the built-in names ------
def rmsf(universe, select="name CA"):
    """RMSF of `select` over the frames (no superposition), as MDAnalysis' RMSF."""
    return ParallelRMSF(universe.select_atoms(select))


def pca(universe, select="backbone", align=False, n_components=None):
    """PCA of `select`'s positions (aligned onto the first frame when `align`), as
    MDAnalysis' PCA, with its defaults (align False)."""
    return ParallelPCA(universe, select=select, align=align, n_components=n_components)
