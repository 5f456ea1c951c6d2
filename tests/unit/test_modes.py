"""Execution modes as objects: each owns its stages' task specs, its parts, what a resume
still runs and its workers, and a plan finds its own (an MDAnalysis run() has its own)."""
import numpy as np
import pytest

from trajflow.tasks import parts
from trajflow.tasks.modes import (BACKEND, is_block_task, is_mpi_rank, mode_named, MODES,
                                  record_mode)
from trajflow.tasks.plan import balanced_blocks, RunPlan
from trajflow.tasks.stages import remaining_specs, stage_specs


def plan(tmp_path, mode="mpi", io="shared", n_blocks=3, **extra):
    return RunPlan(workdir=str(tmp_path), topology="/t.psf", trajectories=["/a.dcd"],
                   analysis="rmsd", selection="name CA", io=io, mode=mode, gather="gatherv",
                   n_frames=30, n_atoms=3, blocks=balanced_blocks(30, n_blocks), **extra)


def layout(specs):
    return {stage: [(s.name, s.module.rsplit(".", 1)[1], s.args[2:], s.ranks, s.mpi)
                    for s in tasks] for stage, tasks in specs.items()}


def test_a_plan_finds_its_mode_and_the_cli_offers_only_the_selectable_ones(tmp_path):
    assert plan(tmp_path, "mpi").execution is MODES["mpi"]
    assert plan(tmp_path, "tasks").execution is MODES["tasks"]
    assert plan(tmp_path, "tasks", backend=True).execution is BACKEND
    assert sorted(MODES) == ["mpi", "tasks"] and not BACKEND.selectable
    assert [m.collective for m in (MODES["mpi"], MODES["tasks"], BACKEND)] == [True, False, False]


@pytest.mark.parametrize("mode,io,expected", [
    # an MPI analyze's root publishes result.h5 itself: no reduce stage after it
    ("mpi", "shared", {"split": [], "analyze": [("analyze", "analyze", [], 3, True)],
                       "reduce": []}),
    ("mpi", "split", {"split": [("split", "split", ["--mpi"], 3, True)],
                      "analyze": [("analyze", "analyze", [], 3, True)],
                      "reduce": []}),
    ("tasks", "split", {"split": [(f"split.b{b:05d}", "split", ["--block", str(b)], 1, False)
                                  for b in range(3)],
                        "analyze": [(f"analyze.b{b:05d}", "analyze", ["--block", str(b)], 1, False)
                                    for b in range(3)],
                        "reduce": [("reduce", "reduce", [], 1, False)]}),
])
def test_each_mode_owns_its_stages(tmp_path, mode, io, expected):
    p = plan(tmp_path, mode, io)
    assert layout(stage_specs(p, p.path("plan.json"))) == expected
    assert p.n_workers == 3


def test_an_mdanalysis_run_has_no_split_and_collects_its_groups(tmp_path):
    p = plan(tmp_path, "tasks", backend=True)
    expected = {  # the part task that finds every part written collects them
        "analyze": [(f"analyze.b{b:05d}", "backend_part", ["--part", str(b)], 1, False)
                    for b in range(3)],
        "reduce": []}
    assert layout(stage_specs(p, p.path("plan.json"))) == expected
    assert layout(remaining_specs(p, p.path("plan.json"))) == expected
    assert layout({"reduce": p.execution.reduce_tasks(p, ["--plan", "x"], [])}) == {
        "reduce": [("reduce", "backend_part", ["--collect"], 1, False)]}  # only that left


def test_fewer_mpi_ranks_than_blocks_are_the_workers_and_the_cores(tmp_path):
    p = plan(tmp_path, "mpi", n_blocks=6, mpi_ranks=2)
    assert p.n_workers == 2 and p.execution.cores_for(p, local_cores=1) == 2
    assert stage_specs(p, "x")["analyze"][0].ranks == 2
    t = plan(tmp_path, "tasks", n_blocks=6)
    assert t.execution.cores_for(t, local_cores=None) == 6
    assert t.execution.cores_for(t, local_cores=2) == 2  # the rest of the tasks queue


def test_a_resume_runs_again_only_the_parts_not_whole(tmp_path):
    arrays, attrs = {"frame": np.arange(10, dtype=np.int64)}, {"analysis": "rmsd"}
    t = plan(tmp_path / "t", "tasks", io="shared")
    parts.write_part(t.block_part_path(1), arrays, attrs)
    with open(t.block_part_path(2), "wb") as fh:
        fh.write(b"half a part")  # damaged: analysed again
    assert [s.name for s in remaining_specs(t, "x")["analyze"]] == ["analyze.b00000",
                                                                    "analyze.b00002"]
    assert [s.name for s in remaining_specs(t, "x")["reduce"]] == ["reduce"]
    m = plan(tmp_path / "m", "mpi")
    left = remaining_specs(m, "x")
    assert len(left["analyze"]) == 1 and left["reduce"] == []  # the analyze task publishes
    parts.write_part(m.gathered_part_path(), arrays, attrs)
    left = remaining_specs(m, "x")  # the gathered part whole: only the reduce task is left
    assert left["analyze"] == [] and [s.module for s in left["reduce"]] == ["trajflow.tasks.reduce"]
    assert m.execution.part_paths(m) == [m.gathered_part_path()]
    assert t.execution.part_paths(t) == [t.block_part_path(b) for b in range(3)]


def test_a_records_mode_is_read_as_the_record_says():
    assert is_mpi_rank({"mode": "mpi"}) and not is_block_task({"mode": "mpi"})
    assert is_block_task({"mode": "tasks"}) and not is_mpi_rank({"mode": "tasks"})
    reduce_record = {"task": "reduce"}
    assert record_mode(reduce_record) is None
    assert not is_mpi_rank(reduce_record) and not is_block_task(reduce_record)
    assert mode_named(None) is MODES["mpi"]  # records before tasks mode were ranks'
    assert mode_named("other") is MODES["tasks"]
