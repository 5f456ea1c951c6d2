"""Plans as the tests write them: a RunSpec's options, planned for a pilot of `cpus`."""
from trajflow.workflows.run.planning import plan_from_options


def make_plan(topology, trajectories, analysis, out=None, cpus=2, **options):
    return plan_from_options(topology, trajectories, analysis, cpus, out=out, **options)
