"""Runs across the nodes of a real (virtual) SLURM cluster: tests/cluster/virtual.sh
makes three nodes (network and UTS namespaces, a slurmd each) and the pilot is an
sbatch job of resource local.vcluster whose agent sits on the first node.

One pilot carries the runs across nodes: MPI ranks on every node (Gatherv and RMA,
static and dynamic schedules, so the cross-node claim counter), tasks spread over
the nodes, split and H5MD on the shared file system, each result against
MDAnalysis and each rank's record with its real host; then one node throttled by a
cgroup CPU quota, which the report flags as a host, and a clean run flagging
nothing. A second pilot loses a node (every process of it killed) during analyze:
the run fails within a minute naming the node, and --resume finishes it on the
two nodes left, with fewer MPI ranks than blocks.
"""
import os
import time

import numpy as np
import pytest

import trajflow
from processes import processes_mentioning
from trajflow.workflows.datasets import adk_concatenated

NODES = ["tfvc1", "tfvc2", "tfvc3"]


def analyze_hosts(run):
    return [r["host"] for r in run.profile.records if r["task"] == "analyze"]


def nothing_left_on_the_nodes(cluster):
    for _ in range(30):  # the pilot's job ends a few seconds after its cancel
        left = {node: cluster.processes(node) for node in cluster.nodes}
        if not any(left.values()):
            return
        time.sleep(1)
    raise AssertionError(f"processes left on the nodes: {left}")


@pytest.fixture(scope="module")
def pilot(virtual_cluster, tmp_path_factory):
    path = tmp_path_factory.mktemp("vcluster")
    with trajflow.Pilot("local.vcluster", cpus=6, walltime=20, path=str(path / "pilot"),
                        progress=False) as p:
        yield p, path
    nothing_left_on_the_nodes(virtual_cluster)


CASES = [("rmsd", "shared", "mpi", "gatherv", "auto"), ("dihedrals", "split", "mpi", "rma", "static"),
         ("rmsd", "h5md", "tasks", "gatherv", "static"), ("dihedrals", "shared", "mpi", "rma", "dynamic")]


@pytest.mark.parametrize("analysis,io,mode,gather,schedule", CASES)
def test_a_run_across_three_nodes_equals_mdanalysis(pilot, adk, reference_results, analysis, io,
                                                    mode, gather, schedule):
    p, path = pilot
    run = p.run(adk[0], adk[1], analysis, io=io, mode=mode, gather=gather, schedule=schedule,
                blocks=6, out=str(path / f"{analysis}-{io}-{mode}-{gather}-{schedule}"))
    assert run.ok
    ref = reference_results(adk[0], [adk[1]], analysis)
    key = "rmsd" if analysis == "rmsd" else "features"
    got = run.results.rmsd if analysis == "rmsd" else run.results.features
    assert np.abs(got - ref[key]).max() < (1e-4 if analysis == "rmsd" else 1e-6)
    hosts = analyze_hosts(run)
    if mode == "mpi":  # two ranks on each node, each record with its own node's name
        assert sorted(hosts) == sorted(NODES * 2), hosts
    else:  # six one-core tasks on six cores: the pilot's three nodes
        assert set(hosts) == set(NODES), hosts
    report = open(os.path.join(run.path, "report.html"), encoding="utf-8").read()
    assert all(node in report for node in NODES)


@pytest.fixture(scope="module")
def longer(virtual_cluster):
    return adk_concatenated(20)  # 1,960 frames of AdK (DCD)


def test_a_slow_node_is_flagged_as_a_host_and_a_clean_run_flags_nothing(pilot, virtual_cluster,
                                                                         longer):
    p, path = pilot
    virtual_cluster.do("throttle", "tfvc2", "0.2")
    try:
        slow = p.run(*longer, "dihedrals", repeat=400, schedule="static", blocks=6,
                     out=str(path / "slow-node"))
    finally:
        virtual_cluster.do("throttle", "tfvc2", "off")
    assert slow.ok
    flags = [f for f in slow.profile.stragglers if f["task"] == "analyze"]
    assert [(f["kind"], f["host"]) for f in flags] == [("host", "tfvc2")], flags
    assert flags[0]["cause"] == "compute"
    text = "\n".join(slow.profile.summary_lines())
    assert "host tfvc2" in text and "SBATCH_EXCLUDE=tfvc2" in text, text
    clean = p.run(*longer, "dihedrals", repeat=400, schedule="static", blocks=6,
                  out=str(path / "clean"))
    assert clean.ok
    assert [f for f in clean.profile.stragglers if f["task"] == "analyze"] == []
    assert "SBATCH_EXCLUDE" not in "\n".join(clean.profile.summary_lines())


def test_a_lost_node_fails_the_run_by_its_name_and_resume_finishes_on_the_rest(
        virtual_cluster, pilot, longer, tmp_path):
    # (after the module's pilot, whose fixture is torn down at the module's end:
    # this test's own pilot must not compete with it, so it asks for that one first)
    import MDAnalysis as mda
    from MDAnalysis.analysis.dihedrals import Ramachandran
    out = str(tmp_path / "lost")
    future_holder = {}

    def kill_when_analyzing():
        for _ in range(600):
            if os.path.isdir(os.path.join(out, "progress")) and os.listdir(
                    os.path.join(out, "progress")):
                break
            time.sleep(0.2)
        virtual_cluster.do("kill", "tfvc3")
        future_holder["killed"] = time.time()

    import threading
    killer = threading.Thread(target=kill_when_analyzing, daemon=True)
    killer.start()
    with pytest.raises(trajflow.RunFailed) as failed:
        trajflow.run(*longer, "dihedrals", repeat=40, schedule="static", blocks=6, out=out,
                     resource="local.vcluster", cpus=6, walltime=20, progress=False)
    killer.join(5)
    assert "killed" in future_holder
    assert "tfvc3" in str(failed.value) and "lost" in str(failed.value), failed.value
    assert time.time() - future_holder["killed"] < 120
    assert not os.path.exists(os.path.join(out, "result.h5"))
    # the two nodes left carry the run to its end: 4 cores for 6 blocks
    run = trajflow.resume(out, resource="local.vcluster", cpus=4, walltime=20, progress=False)
    assert run.ok
    assert run.plan.mpi_ranks == 4 and run.plan.schedule == "dynamic"
    assert set(analyze_hosts(run)) == {"tfvc1", "tfvc2"}
    u = mda.Universe(*longer)
    rama = np.deg2rad(Ramachandran(u.select_atoms("protein")).run().results.angles)
    feats = np.stack([np.cos(rama[..., 0]), np.sin(rama[..., 0]), np.cos(rama[..., 1]),
                      np.sin(rama[..., 1])], axis=2).reshape(len(rama), -1)
    assert np.abs(run.results.features - feats).max() < 1e-6
    nothing_left_on_the_nodes(virtual_cluster)
    assert processes_mentioning("trajflow.tasks.analyze") == []
