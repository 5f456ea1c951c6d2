"""trajflow: parallel analysis of MD trajectories on HPC clusters.

A RADICAL-EnTK pipeline (split -> analyze -> reduce) on a RADICAL-Pilot pilot,
MPI ranks or single-core tasks, any trajectory MDAnalysis reads, every rank
profiled. This is the whole public API; the `trajflow` command is a thin layer
over it.

    >>> import trajflow
    >>> from MDAnalysisTests.datafiles import PSF, DCD
    >>> run = trajflow.run(PSF, DCD, "rmsd", blocks=2)
    >>> run.results.rmsd[:3]
    >>> run.profile.stragglers

    >>> with trajflow.Pilot("local.localhost", cpus=2) as pilot:
    ...     a = pilot.submit(PSF, DCD, "rmsd")
    ...     b = pilot.submit(PSF, DCD, "dihedrals")
    ...     a.result().results.rmsd, b.result().results.features

Names are imported when first used, so the analysis tasks, which import
`trajflow.tasks`, do not pay for the workstation's imports (EnTK,
RADICAL-Pilot) at start-up. (This file is installed as trajflow/__init__.py.)
"""
import importlib
import logging

# a library says nothing unless asked: a script configures logging, or Progress shows
# trajflow's own lines on stderr where nobody did (trajflow.workflows.run.progress)

logging.getLogger(__name__).addHandler(logging.NullHandler())

# public name -> the module that defines it
_WHERE = {
    "run": "trajflow.workflows.run.api",
    "resume": "trajflow.workflows.run.api",
    "Pilot": "trajflow.workflows.run.pilot",
    "RunFuture": "trajflow.workflows.run.pilot",
    "HeldPilot": "trajflow.workflows.run.held_client",
    "Run": "trajflow.workflows.run.runs",
    "Profile": "trajflow.workflows.run.runs",
    "open_run": "trajflow.workflows.run.runs",
    "open_result": "trajflow.tasks.results",
    "Backend": "trajflow.workflows.run.backend",
    "submit_remote": "trajflow.workflows.remote.client",
    "RemoteRun": "trajflow.workflows.remote.client",
    "Campaign": "trajflow.workflows.campaign.run",
    "CampaignResult": "trajflow.workflows.campaign.run",
    "InputError": "trajflow.workflows.errors",
    "RunFailed": "trajflow.workflows.errors",
    "Interrupted": "trajflow.workflows.errors",
}
__all__ = ["__version__"] + list(_WHERE)


def _installed_version():
    """The installed distribution's version, looked up when first asked: importlib.metadata
    costs ~30 ms, which every task process (they import trajflow.tasks) paid for nothing."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("trajflow")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def __getattr__(name):
    if name == "__version__":
        globals()[name] = _installed_version()
        return globals()[name]
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trajflow' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
