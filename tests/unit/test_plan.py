"""Balanced blocks, the plan file, and arguments that survive RADICAL's shell quoting."""
import subprocess

import pytest

from trajflow.tasks.plan import RunPlan, balanced_blocks, decode_path_arg, encode_path_arg


@pytest.mark.parametrize("n,N", [(98, 1), (98, 3), (98, 98), (9800, 7), (10, 4), (5, 2)])
def test_blocks_are_balanced_contiguous_and_complete(n, N):
    blocks = balanced_blocks(n, N)
    assert len(blocks) == N
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
    sizes = [b - a for a, b in blocks]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the larger blocks come first


def test_blocks_reject_impossible_splits():
    with pytest.raises(ValueError, match="at most 5 blocks"):
        balanced_blocks(5, 6)
    with pytest.raises(ValueError, match="at least 1"):
        balanced_blocks(5, 0)


def test_plan_round_trip(tmp_path):
    plan = RunPlan(workdir=str(tmp_path), topology="/t.psf", trajectories=["/a.dcd"],
                   analysis="rmsd", selection="name CA", io="split", mode="tasks",
                   gather="gatherv", n_frames=10, n_atoms=3, blocks=balanced_blocks(10, 3))
    path = plan.save()
    assert RunPlan.load(path) == plan
    assert plan.segment_path(2).endswith("split/block_00002.h5md")


@pytest.mark.parametrize("path", ["/plain/path.json", "/with space/p.json", "/dollar$HOME/p`x`.json",
                                  '/quote"d/ü p.json', "/semi;colon/p.json"])
def test_path_arguments_survive_double_quoting(path):
    """RADICAL-Pilot writes arguments as "arg" into a shell script: check that round trip."""
    arg = encode_path_arg(path)
    quoted = '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'  # radical.utils.sh_quote
    echoed = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, text=True).stdout
    assert decode_path_arg(echoed) == path


@pytest.mark.parametrize("stats,ok", [([], True), ([[10, 1], [20, 2]], True),
                                      ([[10, 1]], False), ([[10, 1], [20, 2], [3, 3]], False),
                                      ([[10, 1], [20, True]], False), ([[10, 1], [20]], False)])
def test_a_plans_input_stats_are_one_pair_of_whole_numbers_per_input(tmp_path, stats, ok):
    """Each input's [size, mtime_ns] (topology, then each trajectory), or none (a plan from
    before they were recorded): the analyze tasks compare them one by one."""
    from trajflow.tasks.plan import check_plan_dict, PlanError
    plan = RunPlan(workdir=str(tmp_path), topology="/t.psf", trajectories=["/a.dcd"],
                   analysis="rmsd", selection="name CA", io="shared", mode="mpi",
                   gather="gatherv", n_frames=10, n_atoms=3, blocks=balanced_blocks(10, 2))
    d = dict(plan.to_dict(), input_stats=stats)
    if ok:
        check_plan_dict(d)
    else:
        with pytest.raises(PlanError, match="input_stats"):
            check_plan_dict(d)
