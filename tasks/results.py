"""A finished run's result.h5 back as an MDAnalysis `Results`, as a serial run() gives it.

    >>> from trajflow import open_result
    >>> results = open_result("runs/rdf/result.h5")
    >>> results.rdf, results.bins          # InterRDF's own names
    >>> open_result("runs/adk-rmsd/result.h5").rmsd

For your own analysis the entries are those of `analysis.results` (arrays and
numbers as read from /results, nested Results as Results, other objects
unpickled where you trust the run's writer: open_result(..., trust=True)); for rmsd and dihedrals they are the datasets of result.h5. Both
also have `frame` and `time` (ps) of every frame analysed.
"""
import h5py

from .mda_analyses import read_results
from .rundir import RESULT


def open_result(path, trust=False):
    """The results of one run (its RUNDIR or its result.h5) as an MDAnalysis ``Results``.

    Results your analysis stored with pickle (objects that are not numbers, arrays or
    strings) are loaded only with ``trust=True``: unpickling runs whatever code the
    file's writer put there. Otherwise each is a placeholder saying so.

    Examples
    --------
    >>> results = trajflow.open_result("runs/adk-rmsd")
    >>> results.rmsd, results.frame, results.time
    """
    import os
    from MDAnalysis.analysis.results import Results
    if os.path.isdir(path):
        path = os.path.join(path, RESULT)
    with h5py.File(path, "r") as f:
        results = read_results(f["results"], trust) if "results" in f else Results()
        for key, item in f.items():
            if isinstance(item, h5py.Dataset):
                results[key] = item[()]
    return results
