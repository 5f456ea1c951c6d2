"""One campaign over two clusters: the virtual three-node SLURM cluster
(tests/cluster/virtual.sh, resource local.vcluster) from this workstation, and the
single-node SLURM reached over the real sshd of the remote-run tests (resource
local.slurm, `remote = tfcluster@127.0.0.1:2222`: a campaign there runs its
experiments and they come back). The same strategy at the same N runs on both; the
campaign table compares them side by side. Every result is MDAnalysis' RMSD.
Runs as the workstation account of tests/ssh/cluster.sh, as test_remote.py does.
"""
import csv
import os
import shutil

import h5py
import numpy as np
from MDAnalysis import Universe
from MDAnalysis.analysis import rms

from trajflow import open_run
from ssh_cluster import CLUSTER, TARGET, VENV, WORK, WORKSTATION, workstation
from trajflow.workflows.datasets import adk_concatenated

CAMPAIGN = """
[campaign]
name = "two-clusters"
analysis = "rmsd"
retries = 0

[input]
dataset = "adk"
copies = 2

[resources."local.vcluster"]
walltime = 20

[resources."local.slurm"]
walltime = 20
remote = "{target}"
remote_python = "{python}"
remote_out = "/home/{cluster}/runs/two-clusters"

[factors]
ranks = [2]
io = ["shared"]
"""


def test_one_campaign_over_a_local_and_an_ssh_cluster_compares_them(virtual_cluster, cluster,
                                                                    slurm):
    path = os.path.join(WORKSTATION, "two-clusters.toml")
    with open(path, "w") as fh:
        fh.write(CAMPAIGN.format(target=TARGET, python=f"{VENV}/bin/python", cluster=CLUSTER))
    shutil.chown(path, WORK)
    cdir = os.path.join(WORKSTATION, "two-clusters")
    shutil.rmtree(cdir, ignore_errors=True)
    # the workstation account's environment names the virtual cluster (virtual_cluster set
    # SLURM_CONF and RADICAL_DEFAULT_IFACE here; runuser passes them on); the SSH side
    # uses that machine's own SLURM
    proc = workstation("campaign", path, "--out", cdir, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(cdir, "campaign.csv"), newline="") as fh:
        rows = {row["resource"]: row for row in csv.DictReader(fh)}
    assert set(rows) == {"local.vcluster", "local.slurm"}
    ref = rms.RMSD(Universe(*adk_concatenated(2)), select="name CA").run().results.rmsd
    for resource, row in rows.items():
        assert row["status"] == "done" and row["ranks"] == "2", row
        run = os.path.join(cdir, "runs", *row["experiment"].split("/"))
        with h5py.File(os.path.join(run, "result.h5")) as f:
            np.testing.assert_allclose(f["rmsd"][()], ref, atol=1e-4)
    run = open_run(os.path.join(cdir, "runs", *rows["local.vcluster"]["experiment"].split("/")))
    hosts = {r["host"] for r in run.profile.records if r["task"] == "analyze"}
    assert hosts <= set(virtual_cluster.nodes) and hosts, hosts  # its nodes ran it
    out = proc.stdout
    assert "resources side by side" in out, out[-3000:]
    line = next(line for line in out.splitlines() if "at N = 2" in line and "local.vcluster" in
                line)
    assert "local.slurm" in line and "(fastest)" in line, line
    virtual_cluster.assert_nothing_left()
