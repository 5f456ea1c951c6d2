"""Runs from Python: `trajflow.run` (a pilot of its own, or a Pilot given) and
`trajflow.resume`; `plan_of`, the plan a RunSpec asks for, shared with the
command line and the cluster's side of a remote run."""
import dataclasses

from trajflow.tasks.rundir import has_plan
from trajflow.workflows.errors import InputError
from trajflow.workflows.run.held_client import pilot_given
from trajflow.workflows.run.pilot import Pilot
from trajflow.workflows.run.planning import own_pilot, plan_for_resume, resolve
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.spec import PilotSpec, RunSpec, split_options, takes_options


@takes_options(RunSpec, PilotSpec, skip=("retries", "env", "progress") + tuple(
    f.name for f in dataclasses.fields(RunSpec)))
def resume(rundir, *, pilot=None, retries=1, env=None, progress=True, **options) -> Run:
    """Run again only what an interrupted or failed run is missing (`trajflow run --resume`).

    The run's own options are its plan's; `retries`, `env`, `progress` and the
    pilot's options (below) are this attempt's. InputError if its inputs or its
    analysis code changed since it was planned, or if it is complete already.

    Examples
    --------
    >>> try:
    ...     run = trajflow.run(PSF, DCD, "rmsd", out="runs/adk")
    ... except trajflow.RunFailed:
    ...     run = trajflow.resume("runs/adk")     # only the missing blocks, then reduce
    """
    spec = RunSpec(retries=retries, env=env, progress=progress)
    pilot_spec = PilotSpec(**split_options(options, PilotSpec)[0])
    return run_plan(plan_for_resume(rundir), spec, pilot_spec, pilot, resume=True)


def run_plan(plan, spec, pilot_spec, pilot=None, resume=False) -> Run:
    """A planned run on `pilot`, or on a pilot of its own sized for it (its RADICAL
    session in RUNDIR), started and cancelled around it; the Run, or RunFailed."""
    if pilot is not None:
        with pilot_given(pilot, spec.progress) as chosen:
            return chosen.submit_plan(plan, spec, resume=resume).result()
    own_spec = own_pilot([plan], pilot_spec, plan.workdir)
    try:
        with Pilot(progress=spec.progress, **dataclasses.asdict(own_spec)) as own:
            return own.submit_plan(plan, spec, resume=resume).result()
    finally:  # the report again, now with its pilot's whole row
        if has_plan(plan.workdir):
            Run(plan.workdir).write_report()


@takes_options(RunSpec, PilotSpec)
def run(topology, trajectory, analysis, *, pilot=None, **options) -> Run:
    """Analyse a trajectory on a pilot and return the finished Run.

    `topology` a topology MDAnalysis reads; `trajectory` one file or a list
    (one trajectory, in order); `analysis` a built-in name, "FILE.py:NAME" /
    "module:NAME" (a function NAME(universe, **args) returning a parallelisable
    MDAnalysis analysis) or such a function itself (sent by value with
    cloudpickle). `pilot`: run on this Pilot; otherwise a pilot of its own is
    started with the pilot's options below and cancelled at the end; a held pilot's name
    (`trajflow pilot start --name NAME`): run there, with no pilot start. Every
    other option is RunSpec's or PilotSpec's, listed below with its default
    (the same as `trajflow run --help`).

    Returns
    -------
    Run
        ``run.results`` (arrays), ``run.profile``, ``run.path``, ...

    Raises
    ------
    InputError
        bad input, found before anything is written or started.
    RunFailed
        a task failed for good; ``exc.failed_tasks``, ``exc.run``.
    Interrupted
        Ctrl-C; the pilot was cancelled and its tasks ended.

    Examples
    --------
    >>> from MDAnalysis.analysis.rdf import InterRDF
    >>> rdf = trajflow.run(GRO, XTC, lambda u: InterRDF(u.select_atoms("name OW"),
    ...                                                u.select_atoms("name OW"), nbins=75),
    ...                    io="h5md", blocks=2)
    >>> rdf.results.rdf
    """
    run_options, pilot_options = split_options(options, RunSpec, PilotSpec)
    spec = RunSpec(topology=topology, trajectory=trajectory, analysis=analysis, **run_options)
    if pilot is not None:
        if pilot_options:
            raise InputError(f"{', '.join(pilot_options)}: options of the pilot, which is given "
                             "(pilot=): set them when you make the Pilot")
        with pilot_given(pilot, spec.progress) as chosen:
            return chosen.submit(topology, trajectory, analysis, **run_options).result()
    pilot_spec = PilotSpec(**pilot_options)
    return run_plan(plan_of(spec, pilot_spec), spec, pilot_spec)


def plan_of(spec, pilot_spec, resume=None, cpus=None):
    """The checked plan of a run for a pilot of `pilot_spec` (nothing written), or with
    `resume` the plan of that interrupted run; InputError naming the problem. `cpus`: a
    held pilot's cores, which are all its plan needs (then `pilot_spec` may be None)."""
    return resolve(spec, pilot_spec, cores=cpus, resume=resume)
