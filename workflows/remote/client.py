"""Runs on a cluster driven from the workstation over SSH (`trajflow run --remote`).

Every path of such a run is a path on the cluster. The workstation checks
that the cluster has the same trajflow, asks it to plan and start the run
(remote_side.py: bad input is refused there, before any pilot), and follows
it; the run's client lives on the cluster, detached, so the run goes on
without the workstation. The local folder holds remote.json (where the run
lives) and, once fetched, what inspect and the user need: result.h5,
plan.json, outcome.json, profile/, radical/, report.html, client.log, never
split/ or parts/ and never the trajectory.

Transport is the system's OpenSSH client, one ControlMaster connection per
trajflow command (the user's ~/.ssh/config, ProxyJump, keys and agents
apply; a two-factor login is asked once), and rsync over it. trajflow never
sees a password; remote command lines are built with shlex from separate
arguments, so paths with spaces, quotes or `$` arrive as they are.
"""
import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
import time

from trajflow.tasks.client_guard import alive
from trajflow.tasks.plan import load_json_record, PlanError, RunPlan
from trajflow.tasks.rundir import FETCHED, owned_by_user, PLAN, REMOTE, write_text
from trajflow.workflows.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, InputError, RunFailed
from trajflow.workflows.run.runs import Run
from trajflow.workflows.run.spec import (check_no_control, PilotSpec, REMOTE_SETTINGS, RemoteSpec,
                                        RunSpec, spelled, split_options, takes_options)

import trajflow

ENDED = ("done", "failed")  # said once the run's client has ended too (its report written)


# the cluster's half of a remote run (workflows/cli/remote_side.py), as the client starts it
REMOTE_SIDE = "trajflow.workflows.cli.remote_side"


class ConnectionLost(RuntimeError):
    """ssh could not reach the cluster, or the connection dropped."""


class Connection:
    """SSH to one cluster account through one ControlMaster connection."""

    def __init__(self, target, python):
        self.target, self.python = target, python
        user, host, self.port = parse_destination(target)
        self.destination = f"{user}@{host}" if user else host
        self.control_path = os.path.join(control_folder(), "%C")  # a hash: short for a socket

    def ssh_command(self):
        """ssh and its options; the destination follows a `--` (see run)."""
        return ["ssh", "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                "-o", "ControlPersist=300", "-o", "ServerAliveInterval=15",
                "-o", "ServerAliveCountMax=4"] + (["-p", self.port] if self.port else [])

    def run(self, argv, timeout=None):
        """Run `argv` on the cluster (its words quoted for the remote shell)."""
        try:
            proc = subprocess.run(self.ssh_command() + ["--", self.destination, shlex.join(argv)],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ConnectionLost(f"no answer from {self.target} within {timeout} s")
        if proc.returncode == 255:  # ssh's own failure, not the command's
            raise ConnectionLost((proc.stderr.strip().splitlines() or ["ssh failed"])[-1])
        return proc

    def remote_side(self, *args, timeout=None):
        return self.run([self.python, "-m", REMOTE_SIDE, *args], timeout)

    def master_pid(self):
        proc = subprocess.run(self.ssh_command() + ["-O", "check", "--", self.destination],
                              capture_output=True, text=True)
        m = re.search(r"pid=(\d+)", proc.stderr)
        return int(m.group(1)) if proc.returncode == 0 and m else None

    def close(self):
        subprocess.run(self.ssh_command() + ["-O", "exit", "--", self.destination],
                       capture_output=True)

    def fetch(self, remote_dir, local_dir, depth=0):
        """rsync the run's own files (FETCHED) here; the bytes that came. `depth` 1: of
        every run folder in `remote_dir` (a campaign's runs of one resource)."""
        runs = "/*" * depth
        filters = [f"--include={runs}/"] if depth else []
        for item in FETCHED:
            filters += [f"--include={runs}/{item}***" if item.endswith("/")
                        else f"--include={runs}/{item}"]
        proc = subprocess.run(
            ["rsync", "-a", "--protect-args", "-e", shlex.join(self.ssh_command()),
             "--out-format=%i %l", *filters, "--exclude=*",
             f"{self.destination}:{remote_dir.rstrip('/')}/", local_dir.rstrip("/") + "/"],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode == 255 or "connection unexpectedly closed" in proc.stderr:
            raise ConnectionLost(proc.stderr.strip()[-300:])
        if proc.returncode != 0:
            raise RunFailed(f"fetching {remote_dir} from {self.target} failed: "
                            f"{proc.stderr.strip()[-500:]}")
        return sum(int(line.split()[1]) for line in proc.stdout.splitlines()
                   if line.startswith(">f") and len(line.split()) > 1)


# [user@]host[:port]: names as ssh and DNS spell them; none may begin with "-", which
# ssh would take as an option (-oProxyCommand=... runs a command), wherever it came from
_DESTINATION = re.compile(r"(?:([A-Za-z0-9_.][A-Za-z0-9_.+-]*)@)?"
                          r"([A-Za-z0-9_.][A-Za-z0-9_.-]*|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?")


def parse_destination(target):
    """(user or None, host, port or None) of `target`; InputError for anything else."""
    m = _DESTINATION.fullmatch(target if isinstance(target, str) else "")
    if not m:
        raise InputError(f"remote {target!r}: give [user@]host[:port] (letters, digits, '.', "
                         "'_' and '-', not first): it is handed to ssh")
    return m.groups()


def control_folder():
    """The folder of ssh's ControlMaster sockets: this user's own, entered by no one else
    (a socket there is a logged-in connection to the cluster). Made 0700; refused when it
    is a link, another user's, or others may write to or enter it."""
    folder = os.path.join(tempfile.gettempdir(), f"trajflow-ssh-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise InputError(f"{folder} (trajflow's ssh connections) is "
                         f"{'not a folder' if not stat.S_ISDIR(st.st_mode) else 'not yours alone'}"
                         f" (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): someone "
                         "could reach the cluster through it; remove it (or chmod 700 it, if it "
                         "is yours) and run again")
    return folder


def _answer(proc):
    """The remote side's one JSON line."""
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def default_python(target, resource=None):
    """The cluster's Python for `target` from ~/.config/trajflow/remote.toml, or None:
    the host's entry ([hosts."user@host"] or [hosts."host"], python = "..."), else
    the resource's ([resources."site.machine"], python = "...")."""
    import tomllib
    path = os.path.expanduser(REMOTE_SETTINGS)
    try:
        with open(path, "rb") as fh:
            settings = tomllib.load(fh)
    except FileNotFoundError:
        return None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not TOML ({exc})")
    hosts = settings.get("hosts", {})
    host = target.split(":")[0]
    entry = (hosts.get(target) or hosts.get(host) or hosts.get(host.split("@")[-1])
             or settings.get("resources", {}).get(resource) or {})
    return entry.get("python")


def connect(target, python=None):
    """A checked connection: the cluster answers, and has this trajflow at `python`."""
    python = python or default_python(target)
    if not python:
        raise InputError(f"which Python runs trajflow on {target}? Give --remote-python PATH (the "
                         "python of the virtualenv where trajflow is installed there), or set it "
                         f"once in {REMOTE_SETTINGS}:\n  [hosts.\"{target}\"]\n  python = \"PATH\"")
    conn = Connection(target, python)
    try:
        return _checked(conn, target, python)
    except InputError:
        conn.close()  # its ControlMaster must not outlive the refusal
        raise


def _checked(conn, target, python):
    """`conn` once the cluster has answered with this trajflow, else InputError."""
    try:
        proc = conn.remote_side("version", timeout=120)
    except ConnectionLost as exc:
        raise InputError(f"cannot reach {target} over SSH ({exc}): check that `ssh {target}` "
                         "logs in (keys, agent, ~/.ssh/config)")
    if proc.returncode == 127 or "No such file" in proc.stderr:
        raise InputError(f"{python}: no such Python on {target} ({proc.stderr.strip()[-200:]}); "
                         "give --remote-python, the python of the virtualenv where trajflow is "
                         "installed there")
    if "No module named" in proc.stderr and "No module named 'trajflow'" not in proc.stderr:
        raise InputError(f"the trajflow at {python} on {target} is another version than this "
                         f"workstation's {trajflow.__version__} (it has no {REMOTE_SIDE}): "
                         "install the same version on both")
    if "No module named" in proc.stderr:
        raise InputError(f"trajflow is not installed for {python} on {target}: install "
                         f"trajflow {trajflow.__version__} into that virtualenv (pip install), "
                         "or give --remote-python the python of the one where it is")
    if proc.returncode != 0:
        raise InputError(f"{python} -m trajflow on {target} failed: {proc.stderr.strip()[-500:]}")
    there = _answer(proc).get("trajflow")
    if there != trajflow.__version__:
        raise InputError(f"{target} has trajflow {there} at {python}, this workstation "
                         f"{trajflow.__version__}: install the same version on both")
    return conn


# remote.json: each key, what it holds, and whether it must be there
REMOTE_FIELDS = {"target": (str, True), "python": (str, True), "remote_dir": (str, True),
                 "host": (str, False), "client_pid": (int, False), "batch_job": ((str, int), False),
                 "held": (str, False), "started": (float, False)}


def read_remote_record(path):
    """remote.json, checked: its target is a destination ssh cannot take for an option,
    its python and remote_dir absolute paths without a newline (both reach the cluster's
    shell); InputError with one line naming the file and the key otherwise."""
    record = load_json_record(path, InputError, 1 << 20)
    for key in record:
        if key not in REMOTE_FIELDS:
            raise InputError(f"{path}: unknown key {key!r}: not a record trajflow wrote")
    for key, (kind, needed) in REMOTE_FIELDS.items():
        value = record.get(key)
        if value is None:
            if needed:
                raise InputError(f"{path}: key {key!r} is missing: not a record trajflow wrote")
            continue
        kinds = (int, float) if kind is float else kind
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise InputError(f"{path}: key {key!r} has the wrong type: not a record "
                             "trajflow wrote")
    try:
        parse_destination(record["target"])
    except InputError as exc:
        raise InputError(f"{path}: key 'target': {exc}") from None
    for key in ("python", "remote_dir"):
        check_no_control(f"{path}: {key}", record[key])
    if not record["remote_dir"].startswith("/") or record["python"].startswith("-"):
        raise InputError(f"{path}: its remote_dir is not an absolute path, or its python "
                         "begins with '-': not a record trajflow wrote")
    return record


class RemoteRun:
    """A run living on a cluster, seen from its local folder (remote.json).

        >>> with trajflow.RemoteRun("rmsd1") as run:   # a folder `trajflow run --remote` made
        ...     run.status()["state"]                  # queued, running, done or failed
        ...     result, fetched = run.follow()         # progress, then fetch: a Run here
    """

    def __init__(self, local_dir, conn=None):
        self.local = os.path.abspath(local_dir)
        if not os.path.lexists(os.path.join(self.local, REMOTE)):
            raise InputError(f"{local_dir!r} is not a remote run (no {REMOTE}): give the "
                             "folder `trajflow run --remote` made (its --local)")
        self.where = read_remote_record(os.path.join(self.local, REMOTE))
        self.target, self.remote_dir = self.where["target"], self.where["remote_dir"]
        self._conn = conn

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """End this command's SSH connection (its ControlMaster); the run goes on."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def conn(self):
        if self._conn is None:
            self._conn = connect(self.target, self.where["python"])
        return self._conn

    @classmethod
    def start(cls, remote: RemoteSpec, resource, request, local_dir):
        """Plan and start a run on the cluster `remote` names (InputError with the cluster's
        message for bad input); its local folder records where it lives. With
        remote_batch its client runs in a batch job of its own, the pilot in that job's
        allocation."""
        local_dir = os.path.abspath(local_dir)
        if os.path.exists(os.path.join(local_dir, REMOTE)):
            raise InputError(f"{local_dir} already follows a remote run: give another "
                             f"{spelled('local')}")
        target = remote.remote
        python = remote.remote_python or default_python(target, resource)
        conn = connect(target, python)
        proc = conn.remote_side("start", *(["--batch"] if remote.remote_batch else []), request)
        if proc.returncode != 0:
            conn.close()
            message = proc.stderr.strip() or f"exit {proc.returncode}"
            raise InputError(f"on {target}: " + re.sub(r"^trajflow: error: ", "", message))
        started = _answer(proc)
        os.makedirs(local_dir, exist_ok=True)
        where = {"target": target, "python": python or conn.python, "remote_dir": started["rundir"],
                 "host": started["host"], "client_pid": started["pid"],
                 "batch_job": started.get("batch_job"), "held": json.loads(request).get("held"),
                 "started": time.time()}
        write_text(os.path.join(local_dir, REMOTE), json.dumps(where, indent=1))
        return cls(local_dir, conn)

    def status(self, log_offset=0):
        """The run's state there: state (queued, running, done, failed), frames, log."""
        proc = self.conn.remote_side("status", self.remote_dir, str(log_offset), timeout=120)
        if proc.returncode != 0:
            raise RunFailed(f"status of {self.remote_dir} on {self.target}: "
                            f"{proc.stderr.strip()[-500:]}")
        return _answer(proc)

    def follow(self, stream=None, poll_s=2.0, retries=5):
        """Print the run's progress (its client's own lines) until it has ended, then
        fetch it. A lost connection is said and made again; `retries` failures in a
        row raise ConnectionLost (`trajflow follow` resumes)."""
        stream = stream or sys.stderr
        offset, failures, master = 0, 0, None
        while True:
            if master and not alive(master):  # (a killed master may linger as a zombie)
                print(f"trajflow: the SSH connection to {self.target} was lost; reconnecting",
                      file=stream, flush=True)
                master = None
            try:
                state = self.status(offset)
                failures = 0
            except ConnectionLost as exc:
                failures += 1
                print(f"trajflow: the SSH connection to {self.target} was lost ({exc}); "
                      f"reconnecting ({failures}/{retries})", file=stream, flush=True)
                if failures >= retries:
                    raise ConnectionLost(f"{self.target} did not answer {retries} times; the run "
                                         f"goes on there: `trajflow follow {shlex.quote(self.local)}` "
                                         "resumes")
                time.sleep(min(30, 2 ** failures))
                continue
            now = self.conn.master_pid()
            if master and now != master:  # lost and made again within one call
                print(f"trajflow: the SSH connection to {self.target} was lost; reconnected",
                      file=stream, flush=True)
            master = now
            stream.write(state["log"])
            stream.flush()
            offset = state["log_offset"]
            if state["state"] in ENDED:
                return self.fetch()
            time.sleep(poll_s)

    def fetch(self):
        """Bring the run's own files here; the Run, and the bytes fetched."""
        fetched = self.conn.fetch(self.remote_dir, self.local)
        localise_plan(self.local)
        # the user's own run, fetched, where its record is theirs (it may be a folder of
        # someone else's remote run: then nothing pickled is loaded from it)
        return Run(self.local, trust=owned_by_user(os.path.join(self.local, REMOTE))), fetched

    def cancel(self):
        """End the run there: its client cancels the pilot and its batch job."""
        proc = self.conn.remote_side("cancel", self.remote_dir, timeout=600)
        return _answer(proc)


def localise_plan(local_dir):
    """A fetched run's plan.json, its workdir made this folder (inspect and open_run read it)."""
    plan_file = os.path.join(local_dir, PLAN)
    if not os.path.exists(plan_file):
        return
    try:
        plan = RunPlan.load(plan_file)  # checked: the cluster's folder may be anyone's
    except PlanError as exc:
        raise RunFailed(f"the fetched {exc}") from None
    if plan.workdir != local_dir:
        plan.workdir = local_dir
        plan.save(plan_file)  # whole, under a new name: a fetched link is replaced


@takes_options(RunSpec, PilotSpec, skip=("path", "progress", "env"))
def submit_remote(remote, topology, trajectory, analysis, *, out, remote_python=None,
                  local=None, batch=False, **options) -> RemoteRun:
    """Start a run on the cluster `remote` ([user@]host[:port]) and return at once.

    Every path is a path on the cluster; `analysis` is a name or a file or module
    there. InputError (the cluster's message) for bad input, before any pilot.
    ``.follow()`` then waits, printing the cluster's progress, and fetches the run
    into `local` (default ./NAME of `out`): it returns (Run, bytes fetched).
    `batch`: the run's client goes into a SLURM job of its own (the pilot then
    uses that job's allocation) instead of staying on the login node. The run's
    and the pilot's options (below) travel as JSON and are checked here first.

        >>> run = trajflow.submit_remote("me@login.cluster.org", "/scratch/me/sys.psf",
        ...                              "/scratch/me/md.dcd", "rmsd", out="/scratch/me/r1",
        ...                              remote_python="/home/me/venv/bin/python")
        >>> with run:
        ...     result, fetched = run.follow()
        >>> result.results.rmsd
    """
    where = RemoteSpec(remote=remote, remote_python=remote_python, remote_batch=batch,
                       local=local)
    run_options, pilot_options = split_options(options, RunSpec, PilotSpec)
    spec = RunSpec(topology=topology, trajectory=trajectory, analysis=analysis, out=out,
                   **run_options)
    pilot_spec = PilotSpec(**pilot_options)
    return RemoteRun.start(where, pilot_spec.resource, run_request(spec, pilot_spec),
                           local_folder(where, out))


def local_folder(remote: RemoteSpec, out):
    """This machine's folder of a remote run: as given, else ./NAME of its folder there."""
    return remote.local or os.path.basename(os.path.normpath(str(out)))


def run_request(spec, pilot_spec, resume=None, held=None):
    """What the cluster's side is sent to start a run: the specs as JSON (`held`: the
    name of the pilot held there that runs it, whose options are its own)."""
    return json.dumps({"run": spec.to_json(), "pilot": pilot_spec.to_json(), "resume": resume,
                       "held": held})


# --- the command line ---------------------------------------------------------
def add_remote_commands(sub):
    for name, text in (("status", "a remote run's state: queued, running (frames), done, failed"),
                       ("follow", "follow a remote run until it ends, then fetch it"),
                       ("fetch", "bring a remote run's result, profiles and report here"),
                       ("cancel", "cancel a remote run (its pilot and batch job; on a held "
                                  "pilot, its tasks only)")):
        p = sub.add_parser(name, help=text, description=text + ".")
        p.add_argument("rundir", metavar="LOCAL_RUNDIR",
                       help="the folder `trajflow run --remote` made here")


def _hint(local):
    local = shlex.quote(local)
    return (f"trajflow follow {local}  (progress, then fetch)\n"
            f"  trajflow status {local}  |  trajflow fetch {local}  |  trajflow cancel {local}")


def cmd_run_remote(remote: RemoteSpec, resume, spec, pilot_spec, held=None):
    """`trajflow run --remote HOST`: started there (on its held pilot `held`, if
    given), then followed and fetched here (unless --detach)."""
    if not (spec.out or resume):
        raise InputError("--remote needs --out, the run's folder on the cluster")
    resource = None if held else pilot_spec.resource  # a held pilot's python: the host's
    with RemoteRun.start(remote, resource, run_request(spec, pilot_spec, resume, held),
                         local_folder(remote, spec.out or resume)) as run:
        job = f", its client in batch job {run.where['batch_job']}" if run.where.get("batch_job") else ""
        print(f"trajflow: started on {run.target} ({run.where['host']}): {run.remote_dir}{job}; "
              f"following it here in {run.local}", file=sys.stderr)
        if remote.detach:
            print(f"detached; the run goes on on {run.target}:\n  " + _hint(run.local))
            return 0
        return _follow(run)


def cmd_pilot_remote(remote: RemoteSpec, request):
    """`trajflow pilot ... --remote HOST`: the same command on the cluster, whose
    holder outlives the SSH connection there; its output and exit code here."""
    target, starting = remote.remote, request["pilot_command"] == "start"
    conn = connect(target, remote.remote_python or default_python(target, request.get("resource")))
    name = request.get("name")
    may_be_starting = (f"trajflow: the pilot {name} may still be starting on {target}: `trajflow "
                       f"pilot status {name} --remote {target}` says, `trajflow pilot stop {name} "
                       f"--remote {target}` ends it")
    try:
        if starting:
            print(f"trajflow: starting held pilot {name} on {target} ...", file=sys.stderr)
        proc = conn.remote_side("pilot", json.dumps(request))
    except ConnectionLost as exc:
        print(f"trajflow: {exc}" + (f"\n{may_be_starting}" if starting else ""), file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        if starting:  # the cluster's side has no terminal: the interrupt does not reach it
            print(may_be_starting, file=sys.stderr)
        raise
    finally:
        conn.close()
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode == 0 and starting:
        print(f"trajflow: held on {target}: trajflow run --remote {target} --pilot {name} ...; "
              f"trajflow pilot stop {name} --remote {target}", file=sys.stderr)
    return proc.returncode


def _follow(run):
    try:
        result, fetched = run.follow()
    except KeyboardInterrupt:
        print(f"\ntrajflow: detached; the run goes on on {run.target}:\n  " + _hint(run.local),
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConnectionLost as exc:
        print(f"trajflow: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK if _report(run, result, fetched) else EXIT_FAILED


def _report(run, result, fetched):
    """What the fetch brought (the summary itself is the cluster's, in its log)."""
    outcome = result.outcome or {}
    here = (f"result: {result.result_path}" if result.ok else
            f"NO RESULT: the run ended {outcome.get('status', 'without an outcome')}"
            + (f" ({outcome['error']})" if outcome.get("error") else ""))
    print(f"{run.local}: {here}\n  fetched {fetched:,} bytes from {run.target}:{run.remote_dir} "
          "(result, plan, outcome, profiles, report, log; no trajectory data)\n"
          f"  trajflow inspect {shlex.quote(run.local)}  (phases, stragglers, advice; report.html "
          "beside it)")
    return result.ok


def cmd_status(args):
    with RemoteRun(args.rundir) as run:
        state = run.status(log_offset=1 << 62)  # no log: the state only
    frames = f"{state['frames_done']}/{state['frames_total']} frames analysed"
    if state.get("batch_job_pending"):
        frames += f"; its client's batch job {state['batch_job_pending']} waits in the queue"
    error = (state.get("outcome") or {}).get("error")
    print(f"{run.local}: {state['state']} on {run.target} ({frames})"
          + (f": {error}" if error else ""))
    return 0


def cmd_follow(args):
    with RemoteRun(args.rundir) as run:
        return _follow(run)


def cmd_fetch(args):
    with RemoteRun(args.rundir) as run:
        result, fetched = run.fetch()
    if result.outcome is None:
        print(f"{run.local}: the run has not ended on {run.target}; fetched what there is "
              f"({fetched:,} bytes)")
        return 0
    return EXIT_OK if _report(run, result, fetched) else EXIT_FAILED


def cmd_cancel(args):
    with RemoteRun(args.rundir) as run:
        answer = run.cancel()
    if answer.get("cancelled"):
        held = run.where.get("held")
        ended = (f"its tasks ended; the held pilot {held} goes on" if held
                 else "its pilot and batch job ended")
        print(f"{run.local}: cancelled on {run.target} ({ended}); state: {answer['state']}")
        return 0
    print(f"{run.local}: not cancelled on {run.target}: {answer.get('why')} "
          f"(state: {answer.get('state')})")
    return 0 if answer.get("state") in ENDED else 1
