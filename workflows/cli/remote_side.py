"""The cluster's half of a remote run: what the workstation asks over SSH.

    python -m trajflow.workflows.cli.remote_side version
    python -m trajflow.workflows.cli.remote_side start [--batch] REQUEST   (the run's specs, JSON)
    python -m trajflow.workflows.cli.remote_side job RUNDIR REQUEST   (inside the batch job)
    python -m trajflow.workflows.cli.remote_side campaign-start OUT LABEL TOML-TEXT [--resume]
    python -m trajflow.workflows.cli.remote_side campaign-status OUT LABEL [LOG_OFFSET]
    python -m trajflow.workflows.cli.remote_side campaign-cancel OUT
    python -m trajflow.workflows.cli.remote_side status RUNDIR [LOG_OFFSET]
    python -m trajflow.workflows.cli.remote_side cancel RUNDIR

Every answer is one JSON line on stdout. `start` plans here (bad input is
refused here, exit 2, the message on stderr, before any pilot), then forks the
run's client into its own session with its output in RUNDIR/client.log, so it
outlives the SSH connection and the workstation; the client keeps the pilot
guard (it, not the workstation, is the pilot's client). RUNDIR/client.json
names it by pid and start time, which `status` and `cancel` check.

With --batch the client is not left on the login node (sites kill long
processes there) but submitted as a batch job of its own (RUNDIR/client.sbatch,
SLURM) that runs `job`: the run's client inside the job, its pilot started in
that job's allocation through RADICAL's "batch" access schema. client.json
then names the job, which `status` and `cancel` ask its batch system (batch.py) about.
"""
import radical.utils  # noqa: F401  radical before logging, or fork() may deadlock (its own warning)
import argparse
import dataclasses
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

from trajflow.tasks.client_guard import alive, start_time
from trajflow.tasks.plan import RunPlan
from trajflow.tasks.rundir import (BATCH_SCRIPT, CLIENT, CLIENT_EXIT, CLIENT_LOG, lock_held,
                                   open_in_run, PLAN, read_outcome, read_record, REPORT,
                                   write_record)
from trajflow.workflows.campaign.folders import is_campaign_dir, resource_log_path, resource_runs
from trajflow.workflows.campaign.run import Campaign
from trajflow.workflows.cli.commands import run_planned, run_planned_on_held
from trajflow.workflows.cli.main import run_guarded
from trajflow.workflows.errors import EXIT_INPUT, InputError
from trajflow.workflows.remote.client import REMOTE_SIDE
from trajflow.workflows.run.batch import BATCH_SYSTEMS, BatchError
from trajflow.workflows.run import held_client, resources
from trajflow.workflows.run.api import plan_of
from trajflow.workflows.run.planning import own_pilot, write_plan
from trajflow.workflows.run.progress import frames_done
from trajflow.workflows.run.spec import check_no_control, command_line, PilotSpec, RunSpec
import trajflow

JOB_MARGIN_MIN = 5  # the client's job outlives its pilot by this: start-up, teardown, report

def _answer(value):
    print(json.dumps(value), flush=True)


def version():
    _answer({"trajflow": trajflow.__version__, "python": sys.executable,
             "host": socket.gethostname()})
    return 0


def read_request(text):
    """(RunSpec, PilotSpec, RUNDIR to resume or None, the held pilot's name or None) of a
    request (remote.client.run_request)."""
    request = json.loads(text)
    held = request.get("held")
    if held is not None and not isinstance(held, str):
        raise InputError("a run request's held pilot is a name")
    return (RunSpec.from_json(request["run"]), PilotSpec.from_json(request["pilot"]),
            request.get("resume"), held)


def start(request, batch=False):
    """Plan as `trajflow run` does, then leave the run's client running, detached
    (`batch`: submitted as a batch job of its own)."""
    try:
        with command_line():
            spec, pilot_spec, resume, held = read_request(request)
            if held is not None:
                if batch:
                    raise InputError(f"--remote-batch with --pilot {held}: the held pilot's "
                                     "allocation is its own; leave out one of them")
                plan = plan_of(spec, None, resume, cpus=held_client.held_status(held)["cpus"])
                client = functools.partial(run_planned_on_held, plan, spec, held, bool(resume))
            else:
                system = batch_system(pilot_spec, resume) if batch else None
                plan = plan_of(spec, pilot_spec, resume)
                if system is not None:
                    return submit_client_job(plan, pilot_spec, request, system)
                client = functools.partial(run_planned, plan, spec, pilot_spec, bool(resume))
    except InputError as exc:
        print(f"trajflow: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    rundir = plan.workdir
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:  # the SSH command: name the client, answer and go; the RUNDIR lock stays with it
        # written here, before the answer: a status asked at once must find it (it once
        # did not, written by the child a moment later, and the run looked failed)
        write_record(os.path.join(rundir, CLIENT), pid=pid, start_time=start_time(pid),
                host=socket.gethostname())
        _answer({"rundir": rundir, "pid": pid, "host": socket.gethostname()})
        os._exit(0)
    os.setsid()  # not in the SSH session's process group: its hang-up does not reach it
    log = os.open(os.path.join(rundir, CLIENT_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    code = run_client(rundir, client)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def batch_system(pilot_spec, resume=None):
    """The resource's batch system (batch.py), which will run the run's client in a job
    of its own; InputError where it has none trajflow knows, or for a resumed run."""
    if resume:
        raise InputError("--remote-batch starts new runs; resume one with --remote alone")
    try:
        resources.check_access_schema(pilot_spec.resource, "batch")
    except ValueError as exc:
        raise InputError(f"--remote-batch: {exc}")
    manager = resources.merged_config(pilot_spec.resource).get("resource_manager")
    if manager not in BATCH_SYSTEMS:
        raise InputError(f"--remote-batch submits the client as a batch job, and "
                         f"{pilot_spec.resource}'s batch system is {manager or 'none'}; trajflow "
                         f"submits to {', '.join(BATCH_SYSTEMS)}: use --remote alone")
    return BATCH_SYSTEMS[manager]


def batch_job(plan, pilot_spec, request, cores_per_node=None, system=BATCH_SYSTEMS["SLURM"]):
    """(job options, script) of the client's job: the pilot's cores, its walltime and
    JOB_MARGIN_MIN more; the script execs the client, every word quoted for bash."""
    options = system.job_options(
        cores=own_pilot([plan], pilot_spec).cpus, minutes=pilot_spec.walltime + JOB_MARGIN_MIN,
        log=os.path.join(plan.workdir, CLIENT_LOG), queue=pilot_spec.queue,
        project=pilot_spec.project, cores_per_node=cores_per_node,
        job_name=f"trajflow-{os.path.basename(plan.workdir)}")
    command = [sys.executable, "-m", REMOTE_SIDE, "job", plan.workdir, request]
    for word in options + command:  # a newline would end the comment line: a command of its own
        check_no_control("a word of the client's batch script", word)
    script = ["#!/bin/bash", f"# the run's client, submitted by trajflow to {system.name} with:",
              "#   " + shlex.join(options) + " " + BATCH_SCRIPT, "exec " + shlex.join(command)]
    return options, "\n".join(script) + "\n"


def submit_client_job(plan, pilot_spec, request, system):
    """Write the plan and RUNDIR/client.sbatch and submit it; client.json names the
    job, whose client resumes the planned run (nothing of it has run yet)."""
    cfg = resources.merged_config(pilot_spec.resource)
    write_plan(plan)
    options, script = batch_job(plan, pilot_spec, request, cfg.get("cores_per_node"), system)
    path = os.path.join(plan.workdir, BATCH_SCRIPT)
    with open_in_run(path, "w") as fh:
        fh.write(script)
    plan.lock.release()  # the job's client takes it
    try:
        job = system.submit(path, options)
    except BatchError as exc:
        shutil.rmtree(plan.workdir, ignore_errors=True)  # planned just now: nothing half-left
        raise InputError(f"{system.name} refused the run's client job: {exc}")
    write_record(os.path.join(plan.workdir, CLIENT), batch_job=job,
                 batch_system=system.name, host=socket.gethostname())
    _answer({"rundir": plan.workdir, "pid": None, "batch_job": job, "host": socket.gethostname()})
    return 0


def job(rundir, request):
    """Inside the batch job: the run's client, its pilot on this job's allocation."""
    spec, pilot_spec, _, _ = read_request(request)
    pilot_spec = dataclasses.replace(pilot_spec, access_schema="batch")
    print(f"trajflow: the run's client in batch job {os.environ.get('SLURM_JOB_ID')} on "
          f"{socket.gethostname()}", flush=True)
    return run_client(rundir, lambda: run_planned(plan_of(spec, pilot_spec, rundir), spec,
                                                  pilot_spec, resume=True))


def run_client(rundir, command, report_wait_s=300.0):
    """The run's client (`command()` with trajflow's signals and exit codes); its
    exit code recorded in RUNDIR/client_exit.json once RUNDIR is whole: a held pilot
    draws the run's report after its result, and keeps the folder locked till then (a
    fetch at "done" must find report.html)."""
    code = run_guarded(lambda _: command(), None)
    deadline = time.time() + report_wait_s
    while _report_coming(rundir) and time.time() < deadline:
        time.sleep(0.2)
    write_record(os.path.join(rundir, CLIENT_EXIT), code=code)
    return code


def _report_coming(rundir):
    """Whether a held pilot is still to write the ended run's report: it has said how the
    run ended, and keeps the folder locked until then (a run that never reached it, its
    lock perhaps still this process', has nothing coming)."""
    return (read_outcome(rundir) is not None and not os.path.exists(os.path.join(rundir, REPORT))
            and lock_held(rundir))


def client_state(record):
    """The client a record (client.json) names: its batch job's SLURM state (PENDING,
    RUNNING, ...), RUNNING for a live process (same pid, same start time), or None
    once it has ended."""
    client = read_record(record)
    if not client:
        return None
    if client.get("batch_job"):
        return _batch_system(client).status(client["batch_job"])
    return "RUNNING" if alive(client["pid"], client["start_time"]) else None


def _batch_system(client):
    return BATCH_SYSTEMS[client.get("batch_system", "SLURM")]  # records before it was named


def client_alive(record):
    return client_state(record) is not None


def wait_gone(record, wait_s):
    """Wait up to `wait_s` for the client to end; whether it still runs."""
    t0 = time.time()
    while client_alive(record) and time.time() - t0 < wait_s:
        time.sleep(0.5)
    return client_alive(record)


def read_log(path, offset):
    """(text, next offset) of a log from `offset`, at most 1 MiB; ("", offset) if absent."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(1 << 20)
    except OSError:
        return "", offset
    return data.decode("utf-8", "replace"), offset + len(data)


def run_state(rundir, alive=None):
    """queued (no task has started), running, done or failed. A run whose outcome
    is written is running until its client has ended too: it still writes the
    report and ends the pilot (a fetch at "done" once came before report.html)."""
    outcome = read_outcome(rundir)
    if alive is None:
        alive = client_alive(os.path.join(rundir, CLIENT))
    if outcome and not alive:
        return outcome["status"], outcome
    if outcome:
        return "running", None
    if not alive:
        return "failed", {"error": "the run's client on the cluster ended without an outcome "
                                   f"(see {os.path.join(rundir, CLIENT_LOG)})"}
    profiles = os.path.join(rundir, "profile")
    started = os.path.isdir(profiles) and any(not n.startswith(".") for n in os.listdir(profiles))
    return ("running" if started else "queued"), None


def status(rundir, log_offset=0):
    record = os.path.join(rundir, CLIENT)
    client = client_state(record)
    state, outcome = run_state(rundir, client is not None)
    plan = RunPlan.load(os.path.join(rundir, PLAN))
    log, log_offset = read_log(os.path.join(rundir, CLIENT_LOG), log_offset)
    pending = (read_record(record) or {}).get("batch_job") if client == "PENDING" else None
    _answer({"state": state, "outcome": outcome, "client_alive": client is not None,
             "batch_job_pending": pending, "frames_done": frames_done(plan),
             "frames_total": plan.n_frames, "log": log, "log_offset": log_offset})
    return 0


def cancel(rundir, wait_s=300):
    """SIGTERM to the run's client, as a local run's SIGTERM: it cancels the pilot
    (and its batch job) and records the outcome; then wait for it to end."""
    record = os.path.join(rundir, CLIENT)
    if not client_alive(record):
        state, _ = run_state(rundir, False)
        _answer({"cancelled": False, "state": state, "why": "its client is not running"})
        return 0
    client = read_record(record)
    if client.get("batch_job"):  # the job's client is signalled (it cancels its pilot) first
        _batch_system(client).cancel(client["batch_job"])
    else:
        os.kill(client["pid"], signal.SIGTERM)
    alive = wait_gone(record, wait_s)
    _answer({"cancelled": not alive, "state": run_state(rundir)[0],
             "why": f"the client did not end within {wait_s} s" if alive else ""})
    return 0 if not alive else 1


# --- a campaign resource run here for a campaign on the workstation -----------
def campaign_files(out):
    """The campaign file as sent, its client's record and log: beside OUT (which the
    campaign itself creates), so relative paths in the file resolve against OUT's parent."""
    out = os.path.abspath(out)
    stem = os.path.join(os.path.dirname(out), "." + os.path.basename(out))
    return out, stem + ".campaign.toml", stem + ".client.json", stem + ".client.log"


def campaign_start(out, label, text, resume=False):
    """Check the resource's experiments here (bad input: exit 2, nothing started), then
    run `trajflow campaign FILE --only-resource LABEL` detached from the SSH session."""
    out, path, record, log = campaign_files(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    resume = resume and is_campaign_dir(out)  # resumed here, or never started here
    try:
        campaign = Campaign.load(path, yes=True)  # its size was taken where it was started
        if label not in campaign.resources:
            raise InputError(f"the campaign file has no resource {label!r}")
        campaign.only(label).dry_run(out, resume)
    except InputError as exc:
        os.remove(path)  # refused: nothing of it left here
        print(f"trajflow: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    argv = [sys.executable, "-m", "trajflow.workflows.cli.main", "campaign", path, "--out", out,
            "--only-resource", label] + (["--resume"] if resume else [])
    with open(log, "ab") as fh:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                start_new_session=True)  # the SSH session's end does not reach it
    write_record(record, pid=proc.pid, start_time=start_time(proc.pid), host=socket.gethostname())
    _answer({"out": out, "pid": proc.pid, "host": socket.gethostname()})
    return 0


def campaign_status(out, label, log_offset=0):
    """Whether the resource's campaign still runs, and its log (logs/LABEL.log) from the offset."""
    out, _, record, client_log = campaign_files(out)
    alive = client_alive(record)
    log, log_offset = read_log(resource_log_path(out, label), log_offset)
    tail = ""
    if not alive:  # how it ended: the campaign's own summary or error
        size = os.path.getsize(client_log) if os.path.exists(client_log) else 0
        tail, _ = read_log(client_log, max(0, size - 3000))
    _answer({"alive": alive, "log": log, "log_offset": log_offset, "ended": tail,
             "runs": os.path.isdir(resource_runs(out, label))})
    return 0


def campaign_cancel(out, wait_s=300):
    """Ctrl-C to the resource's campaign: it cancels its pilot; wait for it to end."""
    _, _, record, _ = campaign_files(out)
    if client_alive(record):
        os.kill(read_record(record)["pid"], signal.SIGINT)
    _answer({"cancelled": not wait_gone(record, wait_s)})
    return 0


def pilot(text):
    """`trajflow pilot ...` as the workstation asked it (remote.client.cmd_pilot_remote):
    the pilot is held here. The request is data: a pilot command's own arguments only,
    as the workstation's parser made them (start and stop with their name)."""
    from trajflow.workflows.cli.commands import cmd_pilot, PILOT_REQUEST_KEYS
    try:
        request = json.loads(text)
    except ValueError:
        request = None
    if not isinstance(request, dict) or set(request) - PILOT_REQUEST_KEYS \
            or request.get("pilot_command") not in ("start", "status", "stop", "list") \
            or not isinstance(request.get("name"), (str, type(None))) \
            or (request["pilot_command"] in ("start", "stop") and not request.get("name")) \
            or (request["pilot_command"] == "start"
                and not isinstance(request.get("idle_timeout"), (int, float))):
        print("trajflow: error: not a pilot command of trajflow's", file=sys.stderr)
        return EXIT_INPUT
    return run_guarded(cmd_pilot, argparse.Namespace(**{"name": None, **request}))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "version":
        return version()
    if command == "start" and rest:
        batch = rest[0] == "--batch"
        return start(rest[-1], batch)
    if command == "pilot" and len(rest) == 1:
        return pilot(rest[0])
    if command == "job" and len(rest) == 2:
        return job(rest[0], rest[1])
    if command == "campaign-start" and len(rest) >= 3:
        return campaign_start(rest[0], rest[1], rest[2], rest[3:] == ["--resume"])
    if command == "campaign-status" and len(rest) >= 2:
        return campaign_status(rest[0], rest[1], int(rest[2]) if len(rest) > 2 else 0)
    if command == "campaign-cancel" and rest:
        return campaign_cancel(rest[0])
    if command == "status" and rest:
        return status(rest[0], int(rest[1]) if len(rest) > 1 else 0)
    if command == "cancel" and rest:
        return cancel(rest[0])
    print(f"usage: python -m trajflow.workflows.cli.remote_side version|start ARGS|status RUNDIR|"
          f"cancel RUNDIR (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
