"""One resolve(): a run's blocks, MPI ranks and schedule for a pilot of its own or a
running one of N cores, and the pilot of its own sized from the plan (AdK's 98 frames)."""
import pytest

from trajflow.workflows.errors import InputError
from trajflow.workflows.run.planning import own_pilot, resolve, write_plan
from trajflow.workflows.run.spec import PilotSpec, RunSpec


@pytest.fixture
def rmsd(adk, tmp_path):
    def spec(name, **options):
        return RunSpec(topology=adk[0], trajectory=[adk[1]], analysis="rmsd",
                       out=str(tmp_path / name), **options)
    return spec


def planned(spec, *args, **kwargs):
    plan = resolve(spec, *args, **kwargs)
    if plan.lock is not None:
        plan.lock.release(remove_dir=True)
    return plan


def test_the_blocks_default_to_the_cores_and_the_pilot_of_its_own_to_the_ranks(rmsd):
    plan = planned(rmsd("own"), PilotSpec(cpus=3))
    assert (plan.n_blocks, plan.mode, plan.mpi_ranks, plan.schedule) == (3, "mpi", 0, "dynamic")
    assert own_pilot([plan], PilotSpec()).cpus == 3  # a rank per block, nothing asked
    assert own_pilot([plan], PilotSpec(cpus=5), "/s").cpus == 5
    assert own_pilot([plan], PilotSpec(), "/s").path == "/s"
    kept = planned(rmsd("kept"), cores=2)
    assert kept.n_blocks == 2
    tasks = planned(rmsd("tasks", mode="tasks", blocks=6, schedule="static"), cores=2)
    assert (tasks.n_blocks, tasks.schedule) == (6, "static")  # tasks queue for the cores
    assert own_pilot([tasks], PilotSpec(resource="local.localhost")).cpus == min(
        6, PilotSpec().local_cores())


def test_more_ranks_than_cores_are_refused_and_a_resume_shares_its_blocks(rmsd):
    with pytest.raises(InputError, match="runs one rank per block: 4 ranks do not fit"):
        planned(rmsd("wide", blocks=4), cores=2)
    first = resolve(rmsd("resumed", blocks=4, schedule="static"), cores=4)
    write_plan(first)
    first.lock.release()
    again = resolve(None, cores=2, resume=first.workdir)  # on a pilot of 2 cores now
    assert (again.n_blocks, again.mpi_ranks, again.schedule) == (4, 2, "dynamic")
    assert resolve(None, cores=4, resume=first.workdir).mpi_ranks == 0


@pytest.mark.parametrize("fails", ["save_selection", "save"])
def test_a_plan_write_that_fails_half_way_leaves_no_half_written_folder(rmsd, monkeypatch,
                                                                        fails):
    """A full disk while the plan is written: what was written is taken back, the error
    raised, and the folder (the lock's) removed with the lock, as for a refused run."""
    import errno
    import os
    from trajflow.tasks.plan import RunPlan
    plan = resolve(rmsd("full"), cores=2)
    before = sorted(os.listdir(plan.workdir))

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(RunPlan, fails, full)
    with pytest.raises(OSError, match="No space left"):
        write_plan(plan)
    assert sorted(os.listdir(plan.workdir)) == before  # only the lock's file
    plan.lock.release(remove_dir=True)
    assert not os.path.exists(plan.workdir)
