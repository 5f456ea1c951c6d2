"""Runs driven from a workstation over SSH (`trajflow run --remote`), for real.

tests/ssh/cluster.sh starts Debian's OpenSSH server on a loopback port with a
"cluster" account (its home, mode 700, holds the trajectory) and a
"workstation" account that has a key for it and cannot read that home; both
run trajflow from a virtualenv installed (not editable) like a cluster's.
Every command below runs as the workstation account. Skipped, with the
reason, where this is not root or sshd cannot start.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

import trajflow
from ssh_cluster import CLUSTER, DATA, PORT, TARGET, VENV, WORK, WORKSTATION, workstation

pytestmark = pytest.mark.entk


def run_args(cluster, name, *extra, analysis="rmsd"):
    return ["run", "--remote", TARGET, "--remote-python", f"{VENV}/bin/python",
            "--topology", cluster["top"], "--trajectory", cluster["traj"], "--analysis", analysis,
            "--blocks", "2", "--cpus", "2", "--out", f"/home/{CLUSTER}/runs/{name} $HOME 'q'",
            "--local", os.path.join(WORKSTATION, name), *extra]


def expected_rmsd(adk):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    return rms.RMSD(mda.Universe(*adk), select="name CA").run().results.rmsd


def user_processes(user):
    """The user's live processes (zombies are dead: this container's init leaves them)."""
    out = subprocess.run(["ps", "-u", user, "-o", "pid=,stat=,args="], capture_output=True,
                         text=True)
    return [line for line in out.stdout.splitlines() if line.split()[1:2] != ["Z"]
            and not line.split()[1].startswith("Z")]


def assert_workstation_side_gone(timeout=10):
    t0 = time.time()
    while user_processes(WORK) and time.time() - t0 < timeout:
        time.sleep(0.2)
    assert not user_processes(WORK)


def assert_nothing_left_of_the_run(timeout=60):
    """No process of the cluster account but sshd's sessions (none of the workstation)."""
    t0 = time.time()
    while True:
        left = [p for p in user_processes(CLUSTER) if "sshd" not in p]
        if not left or time.time() - t0 > timeout:
            break
        time.sleep(1)
    assert not left, left


def assert_fetched_run(local, adk):
    names = set(os.listdir(local))
    assert {"result.h5", "plan.json", "outcome.json", "profile", "radical", "report.html",
            "remote.json", "client.log"} <= names, names
    assert not names & {"split", "parts", "progress"}, names
    with h5py.File(os.path.join(local, "result.h5")) as f:
        np.testing.assert_allclose(f["rmsd"][()], expected_rmsd(adk), atol=1e-4)
    reopened = trajflow.open_run(local)  # the fetched folder alone
    assert reopened.ok
    np.testing.assert_allclose(reopened.results.rmsd, expected_rmsd(adk), atol=1e-4)


def test_cluster_data_is_not_readable_from_the_workstation(cluster):
    proc = subprocess.run(["runuser", "-u", WORK, "--", "cat", cluster["traj"]],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Permission denied" in proc.stderr


def test_remote_run_is_followed_through_a_dropped_connection_and_fetched(cluster, adk):
    """A run followed to its end; its SSH master killed midway: said, and reconnected."""
    local = os.path.join(WORKSTATION, "followed")
    proc = workstation(*run_args(cluster, "followed"), popen=True)
    master = None
    t0 = time.time()
    while master is None and time.time() - t0 < 120 and proc.poll() is None:
        check = subprocess.run(["runuser", "-u", WORK, "--", "ssh", "-o",
                                f"ControlPath=/tmp/trajflow-ssh-{_uid(WORK)}/%C", "-p", PORT,
                                "-O", "check", f"{CLUSTER}@127.0.0.1"],
                               capture_output=True, text=True)
        if os.path.exists(os.path.join(local, "remote.json")) and "pid=" in check.stderr:
            master = int(check.stderr.split("pid=")[1].split(")")[0])
        time.sleep(0.5)
    assert master, "the run did not start following"
    time.sleep(3)
    os.kill(master, signal.SIGTERM)  # the connection drops while the run goes on there
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert f"the SSH connection to {TARGET} was lost" in err
    assert "followed $HOME 'q': done -> " in err  # the cluster's own progress lines came here
    assert_fetched_run(local, adk)
    fetched = int(out.split("fetched ")[1].split(" bytes")[0].replace(",", ""))
    assert 0 < fetched < os.path.getsize(adk[1])  # never the trajectory
    where = json.load(open(os.path.join(local, "remote.json")))
    assert where["remote_dir"].endswith("followed $HOME 'q'")
    inspected = workstation("inspect", local)
    assert inspected.returncode == 0 and "stragglers" in inspected.stdout, inspected.stderr
    assert_nothing_left_of_the_run()
    assert_workstation_side_gone()  # its ControlMaster ended with the command


def test_detached_remote_run_then_status_until_done_and_fetch(cluster, adk):
    local = os.path.join(WORKSTATION, "detached")
    started = workstation(*run_args(cluster, "detached", "--detach", "--mode", "tasks"))
    assert started.returncode == 0, started.stderr
    assert "trajflow follow" in started.stdout
    assert_workstation_side_gone()
    states = []
    t0 = time.time()
    while time.time() - t0 < 400:
        status = workstation("status", local)
        assert status.returncode == 0, status.stderr
        states.append(status.stdout.split(": ")[1].split(" on ")[0])
        if states[-1] in ("done", "failed"):
            break
        time.sleep(2)
    assert states[-1] == "done", states
    assert set(states[:-1]) <= {"queued", "running"}, states
    assert "98/98 frames analysed" in status.stdout
    fetched = workstation("fetch", local)
    assert fetched.returncode == 0, fetched.stderr
    assert_fetched_run(local, adk)
    assert_nothing_left_of_the_run()


def test_bad_input_on_the_cluster_side_exits_2_with_its_message(cluster):
    args = run_args(cluster, "bad")
    args[args.index(cluster["traj"])] = os.path.join(DATA, "missing.dcd")
    proc = workstation(*args)
    assert proc.returncode == 2
    assert f"on {TARGET}:" in proc.stderr and "missing.dcd' does not exist" in proc.stderr
    assert not os.path.exists(os.path.join(WORKSTATION, "bad"))
    wrong_python = run_args(cluster, "bad")
    wrong_python[wrong_python.index("--remote-python") + 1] = "/opt/no such/python"
    proc = workstation(*wrong_python)
    assert proc.returncode == 2 and "no such Python" in proc.stderr, proc.stderr
    from_python = subprocess.run(
        ["runuser", "-u", WORK, "--", f"{VENV}/bin/python", "-c",
         "import sys, trajflow\ntry:\n    trajflow.submit_remote(sys.argv[1], sys.argv[2], "
         "sys.argv[3], 'rmsd', out=sys.argv[4], remote_python=sys.argv[5])\n"
         "except trajflow.InputError as exc:\n    print('InputError:', exc)",
         TARGET, cluster["top"], os.path.join(DATA, "missing.dcd"), f"/home/{CLUSTER}/runs/py",
         f"{VENV}/bin/python"], cwd=WORKSTATION, capture_output=True, text=True, timeout=120)
    assert "InputError: on " in from_python.stdout and "does not exist" in from_python.stdout, \
        from_python.stdout + from_python.stderr
    not_a_host = workstation("status", os.path.join(WORKSTATION, "nowhere"))
    assert not_a_host.returncode == 2 and "is not a remote run" in not_a_host.stderr
    no_batch = workstation(*run_args(cluster, "nobatch", "--remote-batch"))  # local.localhost
    assert no_batch.returncode == 2 and "has no 'batch' access schema" in no_batch.stderr, \
        no_batch.stderr
    assert not os.path.exists(f"/home/{CLUSTER}/runs/nobatch $HOME 'q'")  # refused before planning
    assert_workstation_side_gone()  # no SSH connection outlives a refusal


def test_a_pilot_held_on_the_cluster_serves_remote_runs_then_stops(cluster, adk):
    """`trajflow pilot start --remote`: the pilot is held on the cluster (its holder
    outlives the SSH command); `run --remote --pilot` runs there on it, without a pilot of
    its own, and comes back equal to MDAnalysis; a name not held there is refused, exit 2;
    `pilot stop --remote` ends it, nothing left running."""
    where = ["--remote", TARGET, "--remote-python", f"{VENV}/bin/python"]
    # the held pilot's own folder (its session's records), made in the cluster's home
    pilot_folders = f"/home/{CLUSTER}/trajflow-pilot-far-*"
    before = set(glob.glob(pilot_folders))
    started = workstation("pilot", "start", "--name", "far", "--cpus", "2", "--walltime", "20",
                          "--idle-timeout", "10", *where)
    assert started.returncode == 0, started.stderr
    assert "pilot far held (2 cores" in started.stderr, started.stderr
    assert f"trajflow run --remote {TARGET} --pilot far" in started.stderr, started.stderr
    assert_workstation_side_gone()  # the SSH command has ended, the holder lives there
    local = os.path.join(WORKSTATION, "onheld")
    run = ["run", *where, "--topology", cluster["top"], "--trajectory", cluster["traj"],
           "--analysis", "rmsd", "--blocks", "2", "--out", f"/home/{CLUSTER}/runs/onheld"]
    try:
        status = workstation("pilot", "status", "far", *where)
        assert status.returncode == 0 and "far: active on local.localhost" in status.stdout, \
            status.stdout + status.stderr
        ran = workstation(*run, "--pilot", "far", "--local", local)
        assert ran.returncode == 0, ran.stderr
        assert_fetched_run(local, adk)
        client_log = open(os.path.join(local, "client.log")).read()
        assert "pilot requested" not in client_log, client_log  # none of its own
        missing = workstation(*run, "--pilot", "nope", "--local", local + "-nope")
        assert missing.returncode == 2, missing.stderr
        assert f"on {TARGET}:" in missing.stderr and "no pilot named 'nope'" in missing.stderr, \
            missing.stderr
        assert not os.path.exists(local + "-nope")
        # a campaign resource held there: the campaign on the cluster runs on it
        path = os.path.join(WORKSTATION, "held-campaign.toml")
        with open(path, "w") as fh:
            fh.write(REMOTE_CAMPAIGN.format(top=cluster["top"], traj=cluster["traj"], target=TARGET,
                                            python=f"{VENV}/bin/python", cluster=CLUSTER)
                     .replace("walltime = 20", 'pilot = "far"\ncpus = 2')
                     .replace("runs/campaign $HOME", "runs/held-campaign"))
        shutil.chown(path, WORK)
        cdir = os.path.join(WORKSTATION, "held-campaign")
        campaign = workstation("campaign", path, "--out", cdir)
        assert campaign.returncode == 0, campaign.stdout[-2000:] + campaign.stderr[-3000:]
        for n in (1, 2):
            with h5py.File(os.path.join(cdir, "runs", "local.localhost",
                                        f"n{n}-shared-mpi-gatherv-k1-r1", "result.h5")) as f:
                np.testing.assert_allclose(f["rmsd"][()], expected_rmsd(adk), atol=1e-4)
        there = open(f"/home/{CLUSTER}/runs/held-campaign/logs/local.localhost.log").read()
        assert "sent to held pilot far" in there and "pilot requested" not in there, there[-2000:]
    finally:
        try:
            stopped = workstation("pilot", "stop", "far", *where)
        finally:
            made = set(glob.glob(pilot_folders)) - before
            for folder in made:  # kept by trajflow for its user; this machine's, removed
                shutil.rmtree(folder, ignore_errors=True)
    assert len(made) == 1, made
    assert stopped.returncode == 0 and "pilot far stopped" in stopped.stdout, stopped.stderr
    listed = workstation("pilot", "list", *where)
    assert listed.returncode == 0 and "no held pilot" in listed.stdout, listed.stdout
    assert_workstation_side_gone()
    assert_nothing_left_of_the_run()


def test_remote_run_on_slurm_fetched_then_one_cancelled(cluster, adk, slurm):
    """Through the cluster's SLURM: one run to its end, fetched and equal to
    MDAnalysis; a second cancelled while it runs leaves no process and no job."""
    done = workstation(*run_args(cluster, "slurm", "--resource", "local.slurm"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert_fetched_run(os.path.join(WORKSTATION, "slurm"), adk)
    local = os.path.join(WORKSTATION, "cancelled")
    started = workstation(*run_args(cluster, "cancelled", "--detach", "--resource", "local.slurm"))
    assert started.returncode == 0, started.stderr
    t0 = time.time()
    while not _squeue(CLUSTER) and time.time() - t0 < 120:
        time.sleep(1)
    assert _squeue(CLUSTER), "the pilot's batch job never appeared"
    cancelled = workstation("cancel", local)
    assert cancelled.returncode == 0 and "cancelled on" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr
    t0 = time.time()
    while _squeue(CLUSTER) and time.time() - t0 < 60:
        time.sleep(1)
    assert not _squeue(CLUSTER), "the pilot's batch job outlived the cancel"
    assert_nothing_left_of_the_run()
    status = workstation("status", local)
    assert ": failed on" in status.stdout, status.stdout


def test_remote_batch_run_has_its_client_in_a_slurm_job_then_one_cancelled(cluster, adk, slurm):
    """--remote-batch: the run's client goes into a SLURM job of its own and starts the
    pilot in that job's allocation (RADICAL's batch access schema; no second job); the
    run is followed, fetched and equal to MDAnalysis. A second one cancelled while it
    runs (scancel of its client's job) leaves no process and no job."""
    done = workstation(*run_args(cluster, "batch", "--remote-batch", "--resource", "local.slurm"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    local = os.path.join(WORKSTATION, "batch")
    assert_fetched_run(local, adk)
    job = json.load(open(os.path.join(local, "remote.json")))["batch_job"]
    assert f"its client in batch job {job}" in done.stderr
    assert f"the run's client in batch job {job} on" in open(os.path.join(local, "client.log")).read()
    accounting = subprocess.run(["sacct", "-n", "-X", "-u", CLUSTER, "-o", "JobID,JobName%60"],
                                capture_output=True, text=True).stdout
    if accounting.strip():  # where accounting is kept: the client's job was the only one
        assert [line.split()[0] for line in accounting.splitlines()
                if "trajflow-batch" in line] == [job], accounting
    assert not _squeue(CLUSTER)
    local = os.path.join(WORKSTATION, "batch-cancelled")
    started = workstation(*run_args(cluster, "batch-cancelled", "--detach", "--remote-batch",
                                    "--resource", "local.slurm"))
    assert started.returncode == 0, started.stderr
    job = json.load(open(os.path.join(local, "remote.json")))["batch_job"]
    t0 = time.time()  # its client started (the pilot inside takes ~15 s more): cancel now
    while _job_state(job) != "RUNNING" and time.time() - t0 < 180:
        time.sleep(0.5)
    assert _job_state(job) == "RUNNING", _job_state(job)
    cancelled = workstation("cancel", local)
    assert cancelled.returncode == 0 and "cancelled on" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr
    assert not _squeue(CLUSTER), "the client's batch job outlived the cancel"
    assert_nothing_left_of_the_run()
    assert ": failed on" in workstation("status", local).stdout


REMOTE_CAMPAIGN = """
[campaign]
name = "over-ssh"
analysis = "rmsd"
retries = 0

[input]
topology = "{top}"
trajectory = "{traj}"

[resources."local.localhost"]
walltime = 20
remote = "{target}"
remote_python = "{python}"
remote_out = "/home/{cluster}/runs/campaign $HOME"

[factors]
ranks = [1, 2]
"""


def test_a_campaign_resource_runs_on_the_cluster_and_comes_back(cluster, adk):
    """A campaign file whose resource is `remote`: the workstation cannot read the inputs
    (the cluster's home); the experiments are planned and run by a campaign there, and
    each comes back into the local campaign folder with its result (equal to
    MDAnalysis), profile and outcome, never its split/ or parts/; campaign.csv has them."""
    import csv
    path = os.path.join(WORKSTATION, "remote-campaign.toml")
    with open(path, "w") as fh:
        fh.write(REMOTE_CAMPAIGN.format(top=cluster["top"], traj=cluster["traj"], target=TARGET,
                                        python=f"{VENV}/bin/python", cluster=CLUSTER))
    shutil.chown(path, WORK)
    cdir = os.path.join(WORKSTATION, "campaign")
    proc = workstation("campaign", path, "--out", cdir)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(os.path.join(cdir, "campaign.csv"), newline="") as fh:
        rows = {row["experiment"]: row for row in csv.DictReader(fh)}
    assert set(rows) == {f"local.localhost/n{n}-shared-mpi-gatherv-k1-r1" for n in (1, 2)}
    for exp, row in rows.items():
        assert row["status"] == "done" and float(row["t_total"]) > 0, row
        local = os.path.join(cdir, "runs", *exp.split("/"))
        names = set(os.listdir(local))
        assert {"result.h5", "plan.json", "outcome.json", "profile"} <= names, names
        assert not names & {"split", "parts", "progress"}, names
        assert json.load(open(os.path.join(local, "plan.json")))["workdir"] == local
        with h5py.File(os.path.join(local, "result.h5")) as f:
            np.testing.assert_allclose(f["rmsd"][()], expected_rmsd(adk), atol=1e-4)
    log = open(os.path.join(cdir, "logs", "local.localhost.log")).read()
    assert f"a campaign on {TARGET}" in log and "ended with exit code 0" in log, log[-2000:]
    assert os.path.isdir(f"/home/{CLUSTER}/runs/campaign $HOME/runs/local.localhost")
    assert_workstation_side_gone()
    assert_nothing_left_of_the_run()


def test_the_client_job_keeps_every_path_as_it_is(tmp_path):
    """The batch job's options go on sbatch's command line, its command through bash
    exactly as given: spaces, quotes, $ and % in paths."""
    import shlex
    from trajflow.tasks.plan import RunPlan
    from trajflow.workflows.remote.client import run_request
    from trajflow.workflows.cli.remote_side import batch_job
    from trajflow.workflows.run.spec import PilotSpec, RunSpec
    rundir = str(tmp_path / "runs" / "a b $HOME 'q' 5%")
    plan = RunPlan(workdir=rundir, topology="t", trajectories=["x"], analysis="rmsd",
                   selection="name CA", io="shared", mode="mpi", gather="gatherv", n_frames=1,
                   n_atoms=1, blocks=[(0, 1)])
    pilot = PilotSpec(cpus=4, walltime=30, queue="debug")
    request = run_request(RunSpec(topology="/data/a b.psf", trajectory=["/data/$x 'y'.dcd"],
                                  analysis="rmsd", out=rundir), pilot)
    argv = [request]
    options, script = batch_job(plan, pilot, request, cores_per_node=None)
    assert options[:2] == ["--ntasks=4", "--time=35"]
    assert f"--output={rundir.replace('%', '%%')}/client.log" in options
    assert "--partition=debug" in options and not any(o.startswith("--account") for o in options)
    exec_line = script.splitlines()[-1]
    assert shlex.split(exec_line)[1:] == [sys.executable, "-m", "trajflow.workflows.cli.remote_side",
                                          "job", rundir, *argv]
    echoed = subprocess.run(["bash", "-c", exec_line.replace("exec ", "printf '%s\\n' ", 1)],
                            capture_output=True, text=True).stdout.splitlines()
    assert echoed[-len(argv) - 1:] == [rundir, *argv]
    assert batch_job(plan, pilot, request, cores_per_node=128)[0][:2] == ["--nodes=1",
                                                                           "--exclusive"]


def _job_state(job):
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def _squeue(user):
    out = subprocess.run(["squeue", "-h", "-u", user, "-o", "%i"], capture_output=True, text=True)
    return out.stdout.split()


def _uid(user):
    import pwd
    return pwd.getpwnam(user).pw_uid


def test_the_run_sent_to_the_cluster_is_its_specs_not_the_workstations_flags():
    from trajflow.workflows.cli.commands import specs_from_args
    from trajflow.workflows.cli.parser import build_parser
    from trajflow.workflows.remote.client import Connection, run_request
    from trajflow.workflows.cli.remote_side import read_request
    argv = ["run", "--remote", "me@host:2200", "--topology", "a b.psf", "--trajectory", "x.dcd",
            "--analysis", "rmsd", "--detach", "--remote-python=/opt/py", "--local", "here",
            "--out", "$HOME/x 'y'", "--io", "h5md", "--cpus", "4"]
    spec, pilot = specs_from_args(build_parser().parse_args(argv))
    request = run_request(spec, pilot)
    assert "remote" not in request and "/opt/py" not in request and "here" not in request
    assert read_request(request) == (spec, pilot, None, None)  # the cluster's side reads it back whole
    assert read_request(run_request(spec, pilot, held="far"))[3] == "far"  # ... and a held pilot's name
    assert spec.out == "$HOME/x 'y'" and spec.io == "h5md" and pilot.cpus == 4
    conn = Connection("me@host:2200", "/opt/py")
    assert (conn.destination, conn.port) == ("me@host", "2200")
    with pytest.raises(Exception, match=r"give \[user@\]host\[:port\]"):
        Connection("me@host:port", "/opt/py")


def test_the_remote_python_comes_from_the_host_or_the_resource_settings(tmp_path, monkeypatch):
    from trajflow.workflows.errors import InputError
    from trajflow.workflows.remote.client import default_python
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_python("me@login.hpc.org", "access.expanse") is None  # no settings file
    settings = tmp_path / ".config" / "trajflow" / "remote.toml"
    settings.parent.mkdir(parents=True)
    settings.write_text('[hosts."login.hpc.org"]\npython = "/home/me/venv/bin/python"\n'
                        '[resources."access.expanse"]\npython = "/expanse/venv/bin/python"\n')
    assert default_python("me@login.hpc.org:2222", "access.expanse") == "/home/me/venv/bin/python"
    assert default_python("me@login.expanse.org", "access.expanse") == "/expanse/venv/bin/python"
    assert default_python("me@elsewhere.org", "local.slurm") is None
    settings.write_text("[hosts\n")
    with pytest.raises(InputError, match="not TOML"):
        default_python("me@login.hpc.org")
