"""A campaign's remote resource: its experiments run by a campaign on that machine.

`[resources."<label>"] remote = "[user@]host[:port]"` in a campaign file: the
workstation's campaign process for that resource sends the campaign file over
SSH (remote.py's connection), where `trajflow campaign --only-resource LABEL`
checks and runs that resource's experiments into `remote_out` (default
trajflow-campaigns/<name> in the home there), detached from the connection.
It follows that campaign's log and brings each experiment's own files back into
this campaign's runs/<label>/ (never split/, parts/ or the shared H5MD copy),
so campaign.csv and `trajflow inspect` cover every resource. Ctrl-C cancels it there.
"""
import os
import signal
import sys
import time

from trajflow.tasks.rundir import read_outcome, record_outcome
from trajflow.workflows.campaign.folders import resource_log, resource_runs, rundir
from trajflow.workflows.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from trajflow.workflows.remote.client import connect, default_python, localise_plan

POLL_S = 5.0


def remote_out(campaign, label):
    spec = campaign.resources[label]
    return spec.remote_out or os.path.join("trajflow-campaigns", campaign.name)


def run_remote_resource(campaign, label, cdir, resume):
    """The resource's process (as campaign_run._run_resource): output to logs/<label>.log."""
    with resource_log(cdir, label):
        interrupted = []
        signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
        try:
            error = follow_remote_campaign(campaign, label, cdir, resume, interrupted)
        except Exception as exc:  # the connection failed for good: recorded, others go on
            error = f"{type(exc).__name__}: {exc}"
        for e in campaign.on(label):
            d = rundir(cdir, e)
            if read_outcome(d) is None:
                os.makedirs(d, exist_ok=True)
                record_outcome(d, "failed", error or "did not run on the remote machine")
        code = EXIT_INTERRUPTED if interrupted else EXIT_OK if not error else EXIT_FAILED
        print(f"{label}: ended with exit code {code}" + (f": {error}" if error else ""))
    os._exit(code)


def follow_remote_campaign(campaign, label, cdir, resume, interrupted):
    """Start the resource's campaign there, follow and fetch until it has ended;
    the error that kept it from running, or None."""
    spec = campaign.resources[label]
    target = spec.remote.remote
    conn = connect(target, spec.remote.remote_python or default_python(target, label))
    try:
        with open(campaign.path, encoding="utf-8") as fh:
            text = fh.read()
        proc = conn.remote_side("campaign-start", remote_out(campaign, label), label, text,
                                *(["--resume"] if resume else []), timeout=3600)
        if proc.returncode != 0:
            return f"on {target}: " + (proc.stderr.strip().splitlines() or ["failed"])[-1]
        started = _json(proc)
        print(f"{label}: a campaign on {target} ({started['host']}) runs these experiments "
              f"in {started['out']}", flush=True)
        offset, cancelled = 0, False
        local_runs = resource_runs(cdir, label)
        while True:
            if interrupted and not cancelled:
                print(f"{label}: interrupted; cancelling the campaign on {target}", flush=True)
                conn.remote_side("campaign-cancel", started["out"], timeout=600)
                cancelled = True
            state = _json(conn.remote_side("campaign-status", started["out"], label, str(offset),
                                           timeout=120))
            sys.stdout.write(state["log"])
            offset = state["log_offset"]
            if state["runs"]:
                fetch_runs(conn, resource_runs(started["out"], label), local_runs)
            if not state["alive"]:
                sys.stdout.write(state["ended"])
                return None
            time.sleep(POLL_S)
    finally:
        conn.close()


def fetch_runs(conn, remote_runs, local_runs):
    """Each experiment's own files (remote.py's FETCHED), with paths in plan.json made local."""
    os.makedirs(local_runs, exist_ok=True)
    conn.fetch(remote_runs, local_runs, depth=1)
    for name in os.listdir(local_runs):
        localise_plan(os.path.join(local_runs, name))


def _json(proc):
    import json
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the remote side failed: {proc.stderr.strip()[-500:]}")
    return json.loads(lines[-1])
