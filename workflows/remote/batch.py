"""Batch systems as trajflow uses them: submit a job, ask its state, cancel it.

One class per batch system, as Parsl's providers are: `--remote-batch` puts a
run's client into a job of its own through the resource's batch system. SLURM
is the first; another (PBS, LSF) is one more class in BATCH_SYSTEMS, named as
RADICAL-Pilot's resource configs name it (`resource_manager`).
"""
import math
import subprocess
from typing import List, Optional


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
                    "--open-mode=append", f"--job-name={job_name}"[:64]]
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


BATCH_SYSTEMS = {system.name: system for system in (Slurm(),)}
