"""Batch systems as trajflow uses them: submit a job, ask its state, cancel it,
and, for a pilot's own job, keep it from being requeued and say which of its
nodes were lost.

One class per batch system, as Parsl's providers are: `--remote-batch` puts a
run's client into a job of its own through the resource's batch system; a
pilot's job (submitted by RADICAL-Pilot) records its id and nodes, so that a
pilot that dies with a node is reported by the node's name. SLURM is the
first; another (PBS, LSF) is one more class in BATCH_SYSTEMS, named as
RADICAL-Pilot's resource configs name it (`resource_manager`).
"""
import math
import shlex
import subprocess
from typing import List, Optional


BATCH_JOB = "batch_job.txt"  # in a RADICAL session's folder: its pilot job's id and nodes


class BatchError(RuntimeError):
    """The batch system refused or failed a request; the message is its own."""


class BatchSystem:
    name = ""

    def job_options(self, *, cores, minutes, log, job_name, queue=None, project=None,
                    cores_per_node=None) -> List[str]:
        """Options for `submit`: the cores (whole nodes where the site gives them
        whole), the time, where the job's output goes, its name, queue and account."""
        raise NotImplementedError

    def submit(self, script: str, options: List[str]) -> str:
        """Submit the script file; the job's id, or BatchError."""
        raise NotImplementedError

    def status(self, job_id: str) -> Optional[str]:
        """The job's state while it is queued or runs (PENDING, RUNNING, ...); None once
        it has ended or left the queue."""
        raise NotImplementedError

    def cancel(self, job_id: str) -> None:
        """End the job (its processes are signalled first, so its client can stop in order)."""
        raise NotImplementedError

    def client_environment(self) -> dict:
        """Variables for the process whose RADICAL-Pilot submits a pilot's job."""
        return {}

    def job_record_command(self, path: str) -> str:
        """A shell command, run inside a pilot's job, writing `<job id> <node list>` to path."""
        raise NotImplementedError

    def lost_nodes(self, nodes: str) -> List[str]:
        """Of a job's node list, those the batch system has found down, as
        'NODE (STATE: REASON)'; [] when none is, or it cannot say."""
        raise NotImplementedError


class Slurm(BatchSystem):
    name = "SLURM"
    # squeue's states of a job that has not ended
    LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
            "RESIZING", "SIGNALING", "STAGE_OUT")

    def job_options(self, *, cores, minutes, log, job_name, queue=None, project=None,
                    cores_per_node=None):
        # on sbatch's command line, not in #SBATCH lines: paths with spaces or quotes stay whole
        options = ([f"--nodes={math.ceil(cores / cores_per_node)}", "--exclusive"]
                   if cores_per_node else [f"--ntasks={cores}"])
        options += [f"--time={minutes}", f"--output={log.replace('%', '%%')}",  # sbatch's % patterns
                    "--open-mode=append", f"--job-name={job_name}"[:64],
                    "--no-requeue"]  # a requeued client would start the run again unasked
        if queue:
            options.append(f"--partition={queue}")
        if project:
            options.append(f"--account={project}")
        return options

    def submit(self, script, options):
        proc = subprocess.run(["sbatch", "--parsable", *options, script], capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise BatchError(proc.stderr.strip()[-500:] or f"sbatch exit {proc.returncode}")
        return proc.stdout.strip().split(";")[0]

    def status(self, job_id):
        proc = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"],
                              capture_output=True, text=True)
        state = proc.stdout.strip()
        return state if state in self.LIVE else None

    def cancel(self, job_id):
        # SLURM signals the job's processes (the client cancels its pilot), then ends the job
        subprocess.run(["scancel", str(job_id)], capture_output=True)

    def client_environment(self):
        # SLURM requeues a batch job whose node failed (JobRequeue=1 is its default): the
        # pilot's job came back PENDING as a job no client listens to, and RADICAL-Pilot,
        # seeing no end, left the run waiting without a word (seen on the virtual cluster)
        return {"SBATCH_NO_REQUEUE": "1"}

    def job_record_command(self, path):
        # never fails the pilot: RADICAL's bootstrapper aborts on a failing pre_bootstrap entry
        return (f'echo "$SLURM_JOB_ID $SLURM_JOB_NODELIST" > {shlex.quote(path)} 2>/dev/null '
                "|| echo 'trajflow: no record of the batch job'")

    def lost_nodes(self, nodes):
        try:
            proc = subprocess.run(["sinfo", "-h", "-N", "-n", nodes, "-o", "%N|%T|%E"],
                                  capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return []
        lost = []
        for line in proc.stdout.splitlines():
            node, state, reason = (line.split("|") + ["", ""])[:3]
            # '*': not responding; down, fail(ing): taken out of service
            if state.endswith("*") or state.startswith(("down", "fail")):
                words = [state.rstrip("*")] + (["not responding"] if state.endswith("*") else [])
                if reason and reason != "none" and reason.lower() != "not responding":
                    words.append(reason)
                lost.append(f"{node} ({self.name}: {', '.join(words)})")
        return sorted(set(lost))


BATCH_SYSTEMS = {system.name: system for system in (Slurm(),)}


def lost_nodes_of_job(system: BatchSystem, record_path: str) -> str:
    """'node X of batch job J is down (STATE: REASON)' from the job's record
    (written in the job by job_record_command), or "" when none is or no record."""
    try:
        with open(record_path, encoding="utf-8") as fh:
            job_id, nodes = (fh.read().split() + ["", ""])[:2]
    except OSError:
        return ""
    lost = system.lost_nodes(nodes) if nodes else []
    if not lost:
        return ""
    return (f"{'node' if len(lost) == 1 else 'nodes'} {', '.join(lost)} of the pilot's batch "
            f"job {job_id} {'was' if len(lost) == 1 else 'were'} lost")
