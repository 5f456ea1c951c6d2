"""Plans as the tests write them: a RunSpec's options, planned for a pilot of `cpus`."""
from trajflow.workflows.run.planning import make_plan as plan_spec
from trajflow.workflows.run.spec import RunSpec


def make_plan(topology, trajectories, analysis, out=None, cpus=2, new_out=True, inputs=None,
              **options):
    spec = RunSpec(topology=topology, trajectory=trajectories, analysis=analysis, out=out,
                   **options)
    return plan_spec(spec, cpus, new_out=new_out, inputs=inputs)
