"""The cluster's half of a remote run: what the workstation asks over SSH.

    python -m trajflow.workflows.remote_side version
    python -m trajflow.workflows.remote_side start RUN-ARGS...   (trajflow run's options)
    python -m trajflow.workflows.remote_side status RUNDIR [LOG_OFFSET]
    python -m trajflow.workflows.remote_side cancel RUNDIR

Every answer is one JSON line on stdout. `start` plans here (bad input is
refused here, exit 2, the message on stderr, before any pilot), then forks the
run's client into its own session with its output in RUNDIR/client.log, so it
outlives the SSH connection and the workstation; the client keeps the pilot
guard (it, not the workstation, is the pilot's client). RUNDIR/client.json
names it by pid and start time, which `status` and `cancel` check.
"""
import json
import os
import signal
import socket
import sys
import time

CLIENT_FILE, CLIENT_LOG = "client.json", "client.log"


def _answer(value):
    print(json.dumps(value), flush=True)


def version():
    import trajflow
    _answer({"trajflow": trajflow.__version__, "python": sys.executable,
             "host": socket.gethostname()})
    return 0


def start(run_argv):
    """Plan as `trajflow run` does, then leave the run's client running, detached."""
    from . import cli
    args = cli.build_parser().parse_args(["run"] + run_argv)
    try:
        plan = cli.plan_from_args(args)
    except cli.InputError as exc:
        print(f"trajflow: error: {exc}", file=sys.stderr)
        return cli.EXIT_INPUT
    rundir = plan.workdir
    sys.stdout.flush()
    sys.stderr.flush()
    from trajflow.tasks.client_guard import _record, start_time
    pid = os.fork()
    if pid:  # the SSH command: name the client, answer and go; the RUNDIR lock stays with it
        # written here, before the answer: a status asked at once must find it (it once
        # did not, written by the child a moment later, and the run looked failed)
        _record(os.path.join(rundir, CLIENT_FILE), pid=pid, start_time=start_time(pid),
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
    code = cli.run_guarded(lambda a: cli.run_planned(plan, a), args)
    _record(os.path.join(rundir, "client_exit.json"), code=code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def client_alive(rundir):
    """Whether the run's client (client.json) still runs: same pid, same start time."""
    from trajflow.tasks.client_guard import _alive
    client = _read_json(os.path.join(rundir, CLIENT_FILE))
    return bool(client) and _alive(client["pid"], client["start_time"])


def run_state(rundir):
    """queued (no task has started), running, done or failed. A run whose outcome
    is written is running until its client has ended too: it still writes the
    report and ends the pilot (a fetch at "done" once came before report.html)."""
    from .execute import read_outcome
    outcome = read_outcome(rundir)
    alive = client_alive(rundir)
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
    from trajflow.tasks.plan import RunPlan
    from .progress import frames_done
    state, outcome = run_state(rundir)
    plan = RunPlan.load(os.path.join(rundir, "plan.json"))
    log = ""
    try:
        with open(os.path.join(rundir, CLIENT_LOG), "rb") as fh:
            fh.seek(log_offset)
            data = fh.read(1 << 20)
            log, log_offset = data.decode("utf-8", "replace"), log_offset + len(data)
    except OSError:
        pass
    _answer({"state": state, "outcome": outcome, "client_alive": client_alive(rundir),
             "frames_done": frames_done(plan),
             "frames_total": plan.n_frames, "log": log, "log_offset": log_offset})
    return 0


def cancel(rundir, wait_s=300):
    """SIGTERM to the run's client, as a local run's SIGTERM: it cancels the pilot
    (and its batch job) and records the outcome; then wait for it to end."""
    if not client_alive(rundir):
        state, _ = run_state(rundir)
        _answer({"cancelled": False, "state": state, "why": "its client is not running"})
        return 0
    client = _read_json(os.path.join(rundir, CLIENT_FILE))
    os.kill(client["pid"], signal.SIGTERM)
    t0 = time.time()
    while client_alive(rundir) and time.time() - t0 < wait_s:
        time.sleep(0.5)
    alive = client_alive(rundir)
    _answer({"cancelled": not alive, "state": run_state(rundir)[0],
             "why": f"the client did not end within {wait_s} s" if alive else ""})
    return 0 if not alive else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    if command == "version":
        return version()
    if command == "start":
        return start(rest)
    if command == "status" and rest:
        return status(rest[0], int(rest[1]) if len(rest) > 1 else 0)
    if command == "cancel" and rest:
        return cancel(rest[0])
    print(f"usage: python -m trajflow.workflows.remote_side version|start ARGS|status RUNDIR|"
          f"cancel RUNDIR (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
