"""What the MPI launcher told this process before MPI_Init: its rank, the job's size,
whether every rank shares this node, and which launch it is.

An analyze rank that knows these can claim and analyse chunks before MPI_Init, which
waits for the last rank of the launch to arrive: on a 16-core node the ranks reached
main() up to 0.19 s apart (mpiexec's start-up and the interpreters', measured), and
waiting for the last one was most of a small run's set-up. Launchers not known here
give None: the rank then initialises MPI first, as before.
"""
import os
from typing import NamedTuple, Optional

# (rank, size, ranks on this node) as each launcher names them
LAUNCHERS = (("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),                           # MPICH (hydra)
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_TASKS_PER_NODE"))          # srun


class Launch(NamedTuple):
    rank: int
    size: int
    one_node: bool
    id: str  # the same for every rank of this launch on this node, new for the next launch


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _started(pid):
    """A process' start time in clock ticks since boot (pids are reused; this pair is not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def launch_id(pid):
    """A launcher process' name for its launch: its pid and start time, or None if gone."""
    started = _started(pid)
    return None if started is None else f"{pid}-{started}"


def this_launch(environ=None) -> Optional[Launch]:
    """This rank's Launch from its launcher's environment, or None where it says too
    little. The launch is named by the launcher's process on this node (hydra's proxy,
    orted, slurmstepd: every local rank's parent) and its start time."""
    env = os.environ if environ is None else environ
    for rank_key, size_key, local_key in LAUNCHERS:
        rank, size = _int(env.get(rank_key)), _int(env.get(size_key))
        if rank is None or size is None or not 0 <= rank < size:
            continue
        local = _int(env.get(local_key, "").split("(")[0])  # srun: "16" or "8(x2)"
        launch = launch_id(os.getppid())
        return None if launch is None else Launch(rank, size, local == size, launch)
    return None
