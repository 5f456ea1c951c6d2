"""The analyses, as a small base class in the shape of MDAnalysis' AnalysisBase.

A `BlockAnalysis` resolves its atoms once, on the workstation (`select`:
which atoms, and for dihedrals which quadruplets), so that no analyze rank
parses the topology; in the task it is `_prepare`d with frame 0, turns each
chunk of frames into result rows with `_process_chunk` (a kernel call), and
says what it is in `_conclude`. The block loop in `run_block` is the one
place where I/O and compute are timed.
"""
import warnings

import numpy as np

from . import kernels
from .combine import FRAME_AXES, FRAME_ROWS
from .readers import BlockReader


class BlockAnalysis:
    name = ""
    help = ""                # one line for `trajflow run --help` and help(trajflow.run)
    default_selection = ""
    need_boxes = False
    combine = FRAME_AXES  # result -> its Combine rule
    units = {}               # result dataset -> unit, written into result.h5
    columns = {}             # result dataset -> what its columns are, written into result.h5

    def __init__(self, selected: dict, selection: str = "", repeat: int = 1):
        """`selected`: the arrays `select` returned (as saved in the run's selection file)."""
        self.selected = selected
        self.selection = selection
        self.repeat = max(1, int(repeat))
        self.atom_indices = np.asarray(selected["atom_indices"], dtype=np.intp)

    @classmethod
    def select(cls, universe, selection) -> dict:
        """Resolve the selection on a Universe: arrays the tasks need, at least
        `atom_indices` (sorted). ValueError with the reason if it cannot be used."""
        raise NotImplementedError

    @classmethod
    def bytes_per_frame(cls, selected) -> int:
        """The size of one frame's result row (8-byte floats), for the disk check."""
        return 8

    # --- the hooks a concrete analysis fills in ------------------------------
    def _prepare(self, first_chunk):
        """Take what is needed from frame 0 (a chunk holding it)."""

    def _process_chunk(self, chunk) -> dict:
        """Result arrays for the frames of one chunk, keyed by dataset name."""
        raise NotImplementedError

    def _conclude(self) -> dict:
        """Attributes describing the result."""
        return {}

    @classmethod
    def datasets(cls, joined) -> dict:
        """result.h5's datasets from the blocks' joined arrays (in frame order), in the
        layout MDAnalysis' own analysis gives them; as they are by default."""
        return {k: v for k, v in joined.items() if k not in ("frame", "time")}

    # --- the block loop -------------------------------------------------------
    def prepare(self, reference_source: BlockReader):
        first = next(iter(reference_source.chunks(0, 1, 1)))
        self._prepare(first)

    def run_block(self, source: BlockReader, start, stop, chunk_frames, timer):
        """Read [start, stop) chunk by chunk, compute, and return the block's arrays."""
        out = {"frame": [], "time": []}
        chunks = source.chunks(start, stop, chunk_frames)
        n_bytes = 0
        while True:
            with timer.phase("io"):
                chunk = next(chunks, None)
            if chunk is None:
                break
            n_bytes += chunk.nbytes
            with timer.phase("compute"):
                for _ in range(self.repeat):  # the papers' workload multiplier
                    rows = self._process_chunk(chunk)
            timer.progress(len(chunk.frames))
            out["frame"].append(chunk.frames)
            out["time"].append(chunk.times)
            for key, value in rows.items():
                out.setdefault(key, []).append(value)
        timer.count(frames=stop - start, bytes_read=n_bytes)
        return {k: np.concatenate(v) if v else np.empty(0) for k, v in out.items()}

    def attrs(self) -> dict:
        return {"analysis": self.name, "selection": self.selection,
                "n_selected_atoms": int(len(self.atom_indices)),
                "repeat": self.repeat, **self._conclude()}


class RMSD(BlockAnalysis):
    """RMSD of the selection after optimal superposition onto its frame-0 structure."""
    name = "rmsd"
    help = "RMSD after optimal superposition onto frame 0"
    default_selection = "name CA"
    combine = {**BlockAnalysis.combine, "rmsd": FRAME_ROWS}
    units = {"rmsd": "Angstrom"}
    columns = {"rmsd": "frame, time (ps), rmsd (Angstrom)"}

    @classmethod
    def select(cls, universe, selection):
        ag = universe.select_atoms(selection)
        if len(ag) < 3:  # fewer points have no unique superposition (MDAnalysis gives NaN)
            raise ValueError(f"selection {selection!r} matches {len(ag)} atom(s); RMSD after "
                             "superposition needs at least 3")
        return {"atom_indices": ag.indices}

    def _prepare(self, first_chunk):
        self.reference = kernels.prepare_reference(first_chunk.coords[0])

    def _process_chunk(self, chunk):
        return {"rmsd": kernels.qcp_rmsd(chunk.coords, self.reference)}

    @classmethod
    def datasets(cls, joined):
        """(n_frames, 3): frame, time, rmsd, as MDAnalysis' RMSD.results.rmsd."""
        return {"rmsd": np.column_stack([joined["frame"], joined["time"], joined["rmsd"]])}


class Dihedrals(BlockAnalysis):
    """Backbone φ/ψ of every non-terminal residue of the selection, as (cos, sin)."""
    name = "dihedrals"
    help = "(cos, sin) of backbone phi/psi"
    default_selection = "protein"
    need_boxes = True
    combine = {**BlockAnalysis.combine, "features": FRAME_ROWS}

    @classmethod
    def bytes_per_frame(cls, selected):
        return 8 * 4 * len(selected.get("resids", ()))

    @classmethod
    def select(cls, universe, selection):
        from MDAnalysis.analysis.dihedrals import Ramachandran
        ag = universe.select_atoms(selection)
        if len(ag) == 0:
            raise ValueError(f"selection {selection!r} matches no atoms")
        no_angles = (f"selection {selection!r} has no residue with both phi and psi "
                     "(it needs protein residues that are not chain termini, with backbone "
                     "atoms C, N and CA)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # MDAnalysis' own residue logic, so the angles are exactly its Ramachandran's
            try:
                rama = Ramachandran(ag)
            except (TypeError, ValueError) as exc:  # it fails outright when none is left
                raise ValueError(f"{no_angles}: {exc}") from None
        groups = [rama.ag1, rama.ag2, rama.ag3, rama.ag4, rama.ag5]
        if len(rama.ag2) == 0:
            raise ValueError(no_angles)
        indices = np.unique(np.concatenate([g.indices for g in groups]))
        # per residue: C(i-1), N, CA, C, N(i+1) as indices into the atoms read
        chain = np.stack([np.searchsorted(indices, g.indices) for g in groups], axis=1)
        return {"atom_indices": indices, "chain": chain, "resids": rama.ag3.resids}

    def _process_chunk(self, chunk):
        return {"features": kernels.backbone_features(chunk.coords, self.selected["chain"],
                                                      chunk.boxes)}

    def _conclude(self):
        return {"n_residues": int(len(self.selected["resids"])),
                "feature_layout": "cos phi, sin phi, cos psi, sin psi per residue",
                "resids": np.asarray(self.selected["resids"], dtype=np.int64)}


ANALYSIS_CLASSES = {cls.name: cls for cls in (RMSD, Dihedrals)}
ANALYSES = tuple(ANALYSIS_CLASSES)  # the built-in analyses' names, in the order to show them

# built-in names of MDAnalysis analyses that trajflow merges over blocks itself (MDAnalysis
# runs them serially only): factories NAME(universe, select=..., ...) in MERGED_MODULE
MERGED_MODULE = "trajflow.tasks.parallel_analyses"
MERGED_ANALYSES = {
    "rmsf": "MDAnalysis' RMSF of --select (default name CA; no superposition: align the "
            "trajectory first), merged over blocks",
    "pca": "MDAnalysis' PCA of --select (default backbone; not aligned, as MDAnalysis' "
           "default: --analysis-args '{\"align\": true}' aligns onto the first frame), merged "
           "over blocks"}
