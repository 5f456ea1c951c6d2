"""A real campaign over two resources at once: this workstation and a single-node SLURM.

`trajflow campaign` runs 2 experiments on local.localhost and 2 on
local.slurm (an sbatch job), each resource on its own pilot in its own
process. The 2-rank experiments are made to fail (block 1 exits 3, no
retries): they are recorded as failed and the 1-rank ones still complete.
`--resume` then keeps the completed experiments untouched and runs the failed
ones again. Every result is checked against MDAnalysis' own RMSD.

SLURM is started once for the session (conftest.py's `slurm` fixture); where
it cannot start, the test is skipped with the reason.
"""
import csv
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from trajflow import open_run

pytestmark = pytest.mark.entk

CAMPAIGN = """
[campaign]
name = "two-resources"
analysis = "rmsd"
retries = 0

[input]
dataset = "adk"
copies = 2

[resources."local.localhost"]
walltime = 20

[resources."local.slurm"]
walltime = 20

[factors]
ranks = [1, 2]
io = ["shared"]
"""


def trajflow(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", *args],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def table(cdir):
    with open(os.path.join(cdir, "campaign.csv"), newline="") as fh:
        return {row["experiment"]: row for row in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def campaign(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    path = root / "two.toml"
    path.write_text(CAMPAIGN)
    cdir = str(root / "out")
    first = trajflow("campaign", str(path), "--out", cdir, env={"TRAJFLOW_TEST_FAIL": "1:1"})
    first_table = table(cdir)
    outcomes = {e: json.load(open(os.path.join(cdir, "runs", *e.split("/"), "outcome.json")))
                for e in first_table}
    for e, o in outcomes.items():
        o["had_result"] = os.path.exists(os.path.join(cdir, "runs", *e.split("/"), "result.h5"))
    second = trajflow("campaign", str(path), "--out", cdir, "--resume")
    return cdir, first, first_table, outcomes, second


def test_a_failed_experiment_is_recorded_and_the_others_complete(campaign):
    cdir, first, rows, outcomes, _ = campaign
    assert first.returncode == 1, first.stdout + first.stderr
    assert set(rows) == {f"{r}/n{n}-shared-mpi-gatherv-k1-r1"
                         for r in ("local.localhost", "local.slurm") for n in (1, 2)}
    for exp, row in rows.items():
        if "/n1-" in exp:
            assert row["status"] == "done", row
            assert float(row["t_total"]) > 0 and float(row["t_IO"]) > 0
            assert row["S"] == ""  # only N = 1 is done: no scaling to show
        else:
            assert row["status"] == "failed" and "exit code 3" in row["error"], row
            assert not outcomes[exp]["had_result"]


def test_both_resources_ran_on_their_own_pilot(campaign):
    cdir = campaign[0]
    for resource in ("local.localhost", "local.slurm"):
        sessions = os.listdir(os.path.join(cdir, "sessions", resource))
        assert len([s for s in sessions if s.startswith("re.session")]) == 2  # first run + resume
    log = open(os.path.join(cdir, "logs", "local.slurm.log")).read()
    assert "local.slurm: ended with exit code 1" in log


def test_resume_keeps_completed_experiments_and_completes_the_rest(campaign, reference_results):
    cdir, _, _, outcomes, second = campaign
    assert second.returncode == 0, second.stdout + second.stderr
    assert "done, kept" in second.stderr  # the plan, printed as progress
    rows = table(cdir)
    assert all(row["status"] == "done" for row in rows.values()), rows
    for exp, row in rows.items():
        rundir = os.path.join(cdir, "runs", *exp.split("/"))
        after = json.load(open(os.path.join(rundir, "outcome.json")))
        if "/n1-" in exp:
            assert after["ended"] == outcomes[exp]["ended"]   # kept, not run again
        else:
            assert after["ended"] > outcomes[exp]["ended"]
            assert float(row["E"]) > 0
        plan = json.load(open(os.path.join(rundir, "plan.json")))
        ref = reference_results(plan["topology"], plan["trajectories"], "rmsd")
        with h5py.File(os.path.join(rundir, "result.h5")) as f:
            np.testing.assert_allclose(f["rmsd"][()], ref["rmsd"], atol=1e-4)
            np.testing.assert_allclose(f["time"][()], ref["time"], atol=1e-3)
        reopened = open_run(rundir)  # an experiment's folder is a run's
        assert reopened.ok and "done:" in reopened.summary()
        np.testing.assert_allclose(reopened.results.rmsd, ref["rmsd"], atol=1e-4)


def test_inspect_compares_the_resources(campaign, tmp_path):
    cdir = campaign[0]
    html = tmp_path / "campaign.html"
    proc = trajflow("inspect", cdir, "--html", str(html))
    assert proc.returncode == 0, proc.stderr
    assert "local.slurm" in proc.stdout and "local.localhost" in proc.stdout
    text = html.read_text()
    assert text.count("data:image/png;base64,") == 2
    assert "local.slurm/n2-shared-mpi-gatherv-k1-r1" in text
