"""trajflow as an MDAnalysis backend: change one argument of run() and it runs on a pilot.

    >>> import trajflow
    >>> from MDAnalysis.analysis.rdf import InterRDF
    >>> rdf = InterRDF(water, water, nbins=75)
    >>> rdf.run(backend=trajflow.Backend(resource="local.localhost", cpus=2),
    ...         n_workers=2, unsupported_backend=True)
    >>> rdf.results.rdf                       # merged and concluded by MDAnalysis itself

MDAnalysis' run() splits the frames into computation groups and hands the
backend its own `_compute` to apply to each. trajflow writes that function
(cloudpickle: the analysis and its Universe, which re-opens its files by
name, so they must be where the pilot's tasks can read them) and the groups
into a new RUNDIR, runs one single-core task per group on the pilot (each
timed per rank like every trajflow analyze task; the one that finds every part
written collects them), and gives MDAnalysis back the groups' frames, times and results; MDAnalysis
merges them with the class' aggregator and concludes. The RUNDIR stays:
`backend.last_run.profile` (or `trajflow inspect RUNDIR`) shows each part's
io and compute and the stragglers.
"""
import os
import time

import numpy as np
from MDAnalysis.analysis.backends import BackendBase

from trajflow.tasks import backend_part
from trajflow.tasks.modes import TasksMode
from trajflow.tasks.plan import RunPlan
from trajflow.tasks.rundir import has_plan, open_in_run
from trajflow.workflows.errors import InputError
from trajflow.workflows.run import user_code
from trajflow.workflows.run.api import run_plan
from trajflow.workflows.run.planning import default_out
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.spec import PilotSpec, RunSpec, split_options, takes_options


class Backend(BackendBase):
    """Run an MDAnalysis analysis' parts as tasks on a trajflow pilot.

    Parameters
    ----------
    pilot : Pilot or str, optional
        run on this pilot (kept for the next run()), or on the held pilot of
        this name (`trajflow pilot start --name NAME`); otherwise each run()
        starts a pilot of its own on `resource` and cancels it at the end.
    resource, cpus, walltime, queue, project, client_timeout, limits
        that pilot's (cpus default: one per part, at most this machine's
        cores on a local resource).
    n_workers : int, optional
        the number of parts, if run() is not given n_workers (MDAnalysis
        refuses it in both places).
    out : str, optional
        the folder for each run's RUNDIR (default: the current folder).
    retries : int
        a failed part runs again this often before run() raises RunFailed.
    progress : bool
        print the pilot's and the stages' progress on stderr.

    Attributes
    ----------
    runs : list of Run
        every run made through this backend, ``last_run`` the latest.

    Examples
    --------
    >>> backend = trajflow.Backend(cpus=2)
    >>> RMSD(u, select="backbone").run(backend=backend, n_workers=2, unsupported_backend=True)
    >>> backend.last_run.profile.records
    """

    @takes_options(PilotSpec)
    def __init__(self, pilot=None, *, n_workers=None, out=None, retries=1, progress=True,
                 **options):
        self.pilot = pilot
        self.pilot_spec = PilotSpec(**split_options(options, PilotSpec)[0])
        self.spec = RunSpec(retries=retries, progress=progress)
        self.out = os.path.abspath(out or os.getcwd())
        self.runs = []
        if n_workers is not None:  # else run(n_workers=...) says (MDAnalysis refuses both)
            super().__init__(n_workers)

    @property
    def last_run(self):
        return self.runs[-1] if self.runs else None

    def apply(self, func, computations):
        """What MDAnalysis' run() calls: `func` (its bound `_compute`) on each group."""
        analysis = getattr(getattr(func, "func", None), "__self__", None)
        if analysis is None:
            raise InputError("trajflow.Backend runs MDAnalysis analyses' run(); it was handed "
                             f"{func!r}")
        plan = backend_plan(analysis, func, computations,
                            default_out(type(analysis).__name__, parent=self.out))
        try:
            run_plan(plan, self.spec, self.pilot_spec, self.pilot)
        finally:  # failed or not, the run is there to inspect
            if has_plan(plan.workdir):
                self.runs.append(Run(plan.workdir, trust=True))
        return backend_part.read_pieces(plan.result_path())


def backend_plan(analysis, func, computations, out):
    """The plan of one MDAnalysis run() (written when it is submitted), with the
    pickled `_compute` and the groups (n x 2 arrays: iteration index, frame
    number) already in RUNDIR/backend/."""
    u = analysis._trajectory
    filenames = getattr(u, "filenames", None) or [getattr(u, "filename", None) or "(in memory)"]
    groups = [np.asarray(g) for g in computations]
    blocks = [(int(g[0, 1]), int(g[-1, 1]) + 1) if len(g) else (0, 0) for g in groups]
    universe = getattr(getattr(analysis, "_universe", None), "filename", None)
    plan = RunPlan(workdir=out, topology=str(universe or ""),
                   trajectories=[str(f) for f in filenames],
                   analysis=f"mdanalysis:{type(analysis).__module__}.{type(analysis).__name__}",
                   selection="", io="shared", mode=TasksMode.name, gather="gatherv",
                   n_frames=int(sum(len(g) for g in groups)), n_atoms=int(u.n_atoms),
                   blocks=blocks, backend=True)
    plan.asked_at = time.time()  # the run's wall time counts from here, as any run's
    plan.selected = {}
    try:
        pickled = user_code.pickle_callable(func)  # the user's own classes by value
    except Exception as exc:
        raise InputError(f"trajflow.Backend cannot send {type(analysis).__name__} to the tasks "
                         f"({type(exc).__name__}: {exc})")
    os.makedirs(plan.path("backend"), exist_ok=True)
    with open_in_run(backend_part.function_path(plan), "wb") as fh:
        fh.write(pickled)
    for part, group in enumerate(groups):
        np.save(backend_part.group_path(plan, part), group)
    return plan
