"""Runs across the nodes of a real (virtual) SLURM cluster: tests/cluster/virtual.sh
makes three nodes (network and UTS namespaces, a slurmd each) and the pilot is an
sbatch job of resource local.vcluster whose agent sits on the first node.

One pilot carries the runs across nodes: MPI ranks on every node (Gatherv and RMA,
static and dynamic schedules, so the cross-node claim counter), tasks spread over
the nodes, split and H5MD on the shared file system, each result against
MDAnalysis and each rank's record with its real host; then one node throttled by a
cgroup CPU quota, which the report flags as a host, the dynamic schedule giving
that node's ranks fewer frames (claims across the network), and a clean run
flagging nothing. (A node lost during a run: test_vcluster_node_loss.py.)
"""
import os

import numpy as np
import pytest

import trajflow
from trajflow.workflows.bench import cpu_quota
from trajflow.workflows.datasets import adk_concatenated

NODES = ["tfvc1", "tfvc2", "tfvc3"]


def analyze_hosts(run):
    return [r["host"] for r in run.profile.records if r["task"] == "analyze"]


@pytest.fixture(scope="module")
def pilot(virtual_cluster, tmp_path_factory):
    path = tmp_path_factory.mktemp("vcluster")
    with trajflow.Pilot("local.vcluster", cpus=6, walltime=20, path=str(path / "pilot"),
                        progress=False) as p:
        yield p, path
    virtual_cluster.assert_nothing_left()


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


def flag_lines(run):
    """The analyze ranks' durations and the judge's flags, a line each (a failure shows them)."""
    ranks = [f"rank {r['rank']} on {r['host']}: {r['frames']} frames,"
             f" work {r.get('t_work', 0):.2f} s (compute {r.get('t_compute', 0):.2f},"
             f" wait {r.get('t_wait', 0):.2f})"
             for r in run.profile.records if r["task"] == "analyze"]
    flags = [f"{f['kind']} flag: rank {f['rank']} ranks {f.get('ranks')} on {f['host']},"
             f" {f['duration_s']:.2f} s against {f['baseline']} {f['baseline_s']:.2f} s"
             f" (threshold {f['threshold_s']:.2f}), cause {f['cause']}"
             for f in run.profile.stragglers if f["task"] == "analyze"]
    return "\n".join(ranks + flags)


@pytest.fixture(scope="module")
def longer():
    return adk_concatenated(20)  # 1,960 frames of AdK (DCD)


@pytest.mark.serial  # a clean run flags nothing only on a machine not shared meanwhile
@pytest.mark.skipif(cpu_quota.unavailable() is not None,
                    reason=f"no real slow node here: {cpu_quota.unavailable()}")
def test_a_slow_node_is_flagged_as_a_host_and_a_clean_run_flags_nothing(pilot, virtual_cluster,
                                                                         longer):
    p, path = pilot
    virtual_cluster.do("throttle", "tfvc2", "0.2")
    try:
        slow = p.run(*longer, "dihedrals", repeat=400, schedule="static", blocks=6,
                     out=str(path / "slow-node"))
        # the cure across nodes: ranks claim chunks from a counter on rank 0 over the network
        cured = p.run(*longer, "dihedrals", repeat=400, schedule="dynamic", blocks=6,
                      out=str(path / "slow-node-dynamic"))
    finally:
        virtual_cluster.do("throttle", "tfvc2", "off")
    frames = {}
    for r in cured.profile.records:
        if r["task"] == "analyze":
            frames.setdefault(r["host"], []).append(r["frames"])
    assert sum(map(sum, frames.values())) == 1960
    assert max(frames["tfvc2"]) < 0.6 * min(frames["tfvc1"] + frames["tfvc3"]), frames
    np.testing.assert_array_equal(cured.results.features, slow.results.features)
    assert slow.ok
    flags = [f for f in slow.profile.stragglers if f["task"] == "analyze"]
    hosts = [f for f in flags if f["kind"] == "host"]
    seen = flag_lines(slow)
    # the node as one flag (not its ranks one by one); on 2 shared cores another rank may
    # cross the line too, but no other node as a whole. The quota slows all the node's CPU
    # work alike: its ranks' imports (set-up) as much as their compute, so the cause is
    # compute or "mixed", and compute holds a good share of the excess. (The other ranks'
    # wait in MPI_Init for the slow ones is a wait, not their set-up: init_wait.py.)
    assert [f["host"] for f in hosts] == ["tfvc2"], seen
    assert hosts[0]["cause"] in ("compute", "mixed"), seen
    assert hosts[0]["excess_by_phase_s"]["compute"] > 0.25 * hosts[0]["excess_s"], seen
    assert hosts[0]["ratio"] > 2.5, seen  # the healthy ranks' set-up not as long as the slow's
    assert not [f for f in flags if f["kind"] == "rank" and f["host"] == "tfvc2"], seen
    text = "\n".join(slow.profile.summary_lines())
    assert "host tfvc2" in text and "SBATCH_EXCLUDE=tfvc2" in text, text
    clean = p.run(*longer, "dihedrals", repeat=400, schedule="static", blocks=6,
                  out=str(path / "clean"))
    assert clean.ok
    assert not [f for f in clean.profile.stragglers if f["task"] == "analyze" and
                f["kind"] == "host"], clean.profile.stragglers
    assert "SBATCH_EXCLUDE" not in "\n".join(clean.profile.summary_lines())
