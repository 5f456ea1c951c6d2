"""Resume: after a failure only the missing blocks run again, and the result is the uninterrupted one."""
import os
import shutil
import sys

import h5py
import numpy as np
import pytest

from run_stages import run_spec, run_stages
from trajflow.tasks.stages import remaining_specs, stage_specs
from plans import make_plan
from trajflow.workflows.run.planning import InputError, plan_for_resume, write_plan


@pytest.mark.parametrize("io", ["shared", "split"])
def test_resume_runs_only_what_is_missing(tmp_path, adk, io):
    plan = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "run"), io=io, mode="tasks",
                     blocks=3, cpus=3)
    path = write_plan(plan)
    specs = stage_specs(plan, path)
    assert len(specs["split"]) == (3 if io == "split" else 0)  # shared: no split stage
    for spec in specs["split"]:
        assert run_spec(spec).returncode == 0
    codes = [run_spec(s, {"TRAJFLOW_TEST_FAIL": "1:1"}).returncode for s in specs["analyze"]]
    assert codes == [0, 3, 0]
    assert not os.path.exists(plan.result_path())

    resumed = plan_for_resume(plan.workdir)
    todo = remaining_specs(resumed, path)
    assert todo["split"] == [] and [s.name for s in todo["analyze"]] == ["analyze.b00001"]
    assert [s.name for s in todo["reduce"]] == ["reduce"]
    for stage in ("analyze", "reduce"):
        for spec in todo[stage]:
            assert run_spec(spec).returncode == 0

    whole = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "whole"), io=io, mode="tasks",
                      blocks=3, cpus=3)
    run_stages(whole, write_plan(whole))
    with h5py.File(plan.result_path()) as a, h5py.File(whole.result_path()) as b:
        for key in ("frame", "time", "rmsd"):
            np.testing.assert_array_equal(a[key][()], b[key][()])


def test_resume_refuses_changed_inputs_and_complete_runs(tmp_path, adk):
    traj = tmp_path / "copy.dcd"
    shutil.copy(adk[1], traj)
    plan = make_plan(adk[0], [str(traj)], "rmsd", str(tmp_path / "run"), mode="tasks", blocks=2, cpus=2)
    write_plan(plan)
    with open(traj, "r+b") as fh:  # the trajectory is rewritten after the run was planned
        fh.seek(-8, os.SEEK_END)
        fh.write(b"\0" * 8)
    with pytest.raises(InputError, match="inputs .* changed"):
        plan_for_resume(plan.workdir)
    with pytest.raises(InputError, match="not a trajflow run"):
        plan_for_resume(str(tmp_path))
    other = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "done"), mode="tasks", blocks=2, cpus=2)
    run_stages(other, write_plan(other))
    with pytest.raises(InputError, match="complete"):
        plan_for_resume(other.workdir)


def test_a_5000_block_expansion_is_cheap_for_the_client(tmp_path, adk):
    """Building (not running) a tasks-mode pipeline of 5,000 blocks: client memory bounded."""
    import tracemalloc
    from trajflow.workflows.datasets import adk_concatenated
    from trajflow.workflows.run.pipeline import RunPipeline
    top, traj = adk_concatenated(60, "DCD", folder=str(tmp_path))  # 5,880 frames
    plan = make_plan(top, [traj], "rmsd", str(tmp_path / "run"), mode="tasks", blocks=5000, cpus=2)
    path = write_plan(plan)
    tracemalloc.start()
    specs = stage_specs(plan, path)
    run = RunPipeline(plan, path, sys.executable, "big", retries=1)
    assert len(run.pipeline.stages) == 1  # stages are added as the run goes, not all at once
    run._add_stage("analyze", specs["analyze"])  # what split's post_exec adds: 5,000 EnTK tasks
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(run.pipeline.stages[-1].tasks) == 5000
    print(f"5,000-block expansion: peak {peak / 2**20:.1f} MiB traced in the client")
    assert peak < 200 * 2**20


@pytest.mark.parametrize("damage", ["truncated", "value overwritten"])
def test_a_damaged_part_is_named_by_reduce_and_analysed_again_on_resume(tmp_path, adk, damage):
    from trajflow.tasks.results import open_result
    plan = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "run"), mode="tasks", blocks=3,
                     cpus=3)
    path = write_plan(plan)
    specs = stage_specs(plan, path)
    for stage in ("split", "analyze"):
        for spec in specs[stage]:
            assert run_spec(spec).returncode == 0
    part = plan.block_part_path(1)
    if damage == "truncated":
        with open(part, "r+b") as fh:
            fh.truncate(os.path.getsize(part) // 2)
    else:
        with h5py.File(part, "r+") as f:
            f["rmsd"][5] = 0.0  # HDF5 itself is content; only our checksum tells
    proc = run_spec(specs["reduce"][0])
    assert proc.returncode != 0 and part in proc.stderr and "--resume" in proc.stderr, proc.stderr
    assert not os.path.exists(plan.result_path())
    todo = remaining_specs(plan_for_resume(plan.workdir), path)
    assert [s.name for s in todo["analyze"]] == ["analyze.b00001"]
    for stage in ("analyze", "reduce"):
        for spec in todo[stage]:
            assert run_spec(spec).returncode == 0
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    ref = rms.RMSD(mda.Universe(*adk), select="name CA").run().results.rmsd
    np.testing.assert_allclose(open_result(plan.workdir)["rmsd"], ref, atol=1e-4)


def test_an_mpi_analyze_publishes_its_result_and_a_resume_after_its_publish_reduces_alone(
        tmp_path, adk):
    """An MPI run has no reduce task: its analyze task's gather root publishes result.h5.
    Where that publish failed, the gathered part is kept whole, and a resume runs the
    reduce task alone; the analyze task launched again (EnTK's retry, a benchmark's next
    launch) analyses again and publishes the same result."""
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    from trajflow.tasks.results import open_result
    reference = rms.RMSD(mda.Universe(*adk), select="name CA").run().results.rmsd
    plan = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "run"), mode="mpi", blocks=2,
                     cpus=2)
    path = write_plan(plan)
    specs = stage_specs(plan, path)
    assert specs["reduce"] == [] and len(specs["analyze"]) == 1
    os.makedirs(plan.result_path())  # the publish cannot rename onto a folder: it fails
    failed = run_spec(specs["analyze"][0])
    assert failed.returncode != 0 and os.path.isdir(plan.result_path())
    assert os.path.exists(plan.gathered_part_path())  # whole, kept for the resume
    os.rmdir(plan.result_path())
    plan.lock.release()
    todo = remaining_specs(plan_for_resume(plan.workdir), path)
    assert todo["analyze"] == [] and [s.module for s in todo["reduce"]] == ["trajflow.tasks.reduce"]
    assert run_spec(todo["reduce"][0]).returncode == 0
    np.testing.assert_allclose(open_result(plan.workdir)["rmsd"], reference, atol=1e-4)
    assert not os.path.exists(plan.gathered_part_path())  # the result is its one copy
    again = run_spec(specs["analyze"][0])
    assert again.returncode == 0, again.stdout[-1500:] + again.stderr[-3000:]
    np.testing.assert_allclose(open_result(plan.workdir)["rmsd"], reference, atol=1e-4)
    assert not os.path.exists(plan.gathered_part_path())


def test_an_analyze_stage_that_should_have_published_and_did_not_is_followed_by_reduce(
        tmp_path, adk):
    """An MPI root and a Backend's last part publish the result in the analyze stage;
    where that stage ended whole without it (a part seen late through a file server's
    cache), the reduce task publishes it; where it is there, nothing follows; a cancelled
    run adds nothing."""
    import types
    from trajflow.workflows.run.pipeline import RunPipeline
    plan = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "run"), mode="mpi", blocks=2,
                     cpus=2)
    path = write_plan(plan)
    whole = types.SimpleNamespace(tasks=[types.SimpleNamespace(state="DONE", name="analyze")])

    def after_analyze(cancelled=None):
        events = []
        run = RunPipeline(plan, path, sys.executable, "r",
                          on_event=lambda stage, kind, text: events.append(text))
        run.cancelled = cancelled
        run._after("analyze", whole, {})
        return [stage.name for stage in run.pipeline.stages], run, events

    stages, run, events = after_analyze()
    assert stages == ["analyze.attempt1", "reduce.attempt1"], stages
    [task] = run.pipeline.stages[-1].tasks
    assert task.arguments[:2] == ["-m", "trajflow.tasks.reduce"]
    assert events[-2:] == ["analyze done", "reduce submitted: 1 task(s)"]
    assert after_analyze("stopped by the user")[0] == ["analyze.attempt1"]
    with open(plan.result_path(), "wb"):
        pass  # published
    stages, _, events = after_analyze()
    assert stages == ["analyze.attempt1"]
    assert events[-1] == "analyze done (and reduce: its gather's root published result.h5)"
    plan.lock.release()
