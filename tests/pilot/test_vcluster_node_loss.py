"""A node of the virtual SLURM cluster (tests/cluster/virtual.sh) lost during a run:
every process of it killed while the analyze task runs, as a node crash. SLURM
declares it down and ends the pilot's job (a pilot job is never requeued: a requeued
one comes back as a job nobody listens to); the run fails within two minutes with a
message naming the node, and --resume finishes it on a new pilot on the two nodes
left, with fewer MPI ranks (4) than blocks (6): the dynamic schedule shares them.
The result equals MDAnalysis; nothing is left running on any node.
Before it, `trajflow bench --width` starts a pilot of 1 and of 2 nodes and says how
their start-up grows. (Its own module: its own cluster, and no other pilot holding
the nodes.)
"""
import json
import os
import subprocess
import sys
import threading
import time

import MDAnalysis as mda
import numpy as np
import pytest
from MDAnalysis.analysis.dihedrals import Ramachandran

import trajflow
from processes import analyze_tasks
from trajflow.workflows.datasets import adk_concatenated


def test_bench_width_starts_a_pilot_per_width_and_says_how_start_up_grows(virtual_cluster,
                                                                          tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "bench",
                           "--width", "--nodes", "1", "2", "--json", str(tmp_path / "w.json")],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    width = json.load(open(tmp_path / "w.json"))["width"]
    assert [(r["nodes"], r["cpus"], len(r["hosts"])) for r in width["rows"]] == [(1, 2, 1), (2, 4, 2)]
    for r in width["rows"]:
        assert 0 < r["analyze_launch_s"] < r["tasks_s"] < r["wall_s"]
        assert 0 < r["pilot_s"] < r["wall_s"]
    assert "per added node: pilot" in proc.stdout and "at 100 nodes" in proc.stdout
    virtual_cluster.assert_nothing_left()


def test_a_lost_node_fails_the_run_by_its_name_and_resume_finishes_on_the_rest(
        virtual_cluster, tmp_path):
    longer = adk_concatenated(20)
    out = str(tmp_path / "lost")
    killed_at = {}

    def kill_when_analyzing():
        for _ in range(600):
            if os.path.isdir(os.path.join(out, "progress")) and os.listdir(
                    os.path.join(out, "progress")):
                break
            time.sleep(0.2)
        virtual_cluster.do("kill", "tfvc3")
        killed_at["killed"] = time.time()

    killer = threading.Thread(target=kill_when_analyzing, daemon=True)
    killer.start()
    with pytest.raises(trajflow.RunFailed) as failed:
        trajflow.run(*longer, "dihedrals", repeat=40, schedule="static", blocks=6, out=out,
                     resource="local.vcluster", cpus=6, walltime=20, progress=False)
    killer.join(5)
    assert "killed" in killed_at
    assert "tfvc3" in str(failed.value) and "lost" in str(failed.value), failed.value
    assert time.time() - killed_at["killed"] < 120
    assert not os.path.exists(os.path.join(out, "result.h5"))
    # the two nodes left carry the run to its end: 4 cores for 6 blocks
    run = trajflow.resume(out, resource="local.vcluster", cpus=4, walltime=20, progress=False)
    assert run.ok
    assert run.plan.mpi_ranks == 4 and run.plan.schedule == "dynamic"
    assert {r["host"] for r in run.profile.records if r["task"] == "analyze"} == {"tfvc1", "tfvc2"}
    # the run's story keeps the lost node: how the first attempt ended
    assert "resumed after it failed" in run.summary() and "tfvc3" in run.summary(), run.summary()
    assert "tfvc3" in run.outcome["earlier"][0]["error"]
    u = mda.Universe(*longer)
    rama = np.deg2rad(Ramachandran(u.select_atoms("protein")).run().results.angles)
    feats = np.stack([np.cos(rama[..., 0]), np.sin(rama[..., 0]), np.cos(rama[..., 1]),
                      np.sin(rama[..., 1])], axis=2).reshape(len(rama), -1)
    assert np.abs(run.results.features - feats).max() < 1e-6
    virtual_cluster.assert_nothing_left()
    assert analyze_tasks(out) == []
