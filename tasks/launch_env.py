"""What the MPI launcher told this process before MPI_Init: its rank, the job's size,
whether every rank shares this node, and which launch it is.

An analyze rank that knows these can claim and analyse chunks before MPI_Init, which
waits for the last rank of the launch to arrive: on a 16-core node the ranks reached
main() up to 0.19 s apart (mpiexec's start-up and the interpreters', measured), and
waiting for the last one was most of a small run's set-up. Where the launcher says too
little, or its launch cannot be named for sure, this gives None and the rank
initialises MPI first, as before.
"""
import os
from typing import NamedTuple, Optional

# =1: every rank initialises MPI before its chunks (as before claims were made without it)
MPI_INIT_FIRST = "TRAJFLOW_MPI_INIT_FIRST"
# (rank, size, ranks on this node) as each launcher names them
LAUNCHERS = (("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),                           # MPICH (hydra)
             ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
             ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_TASKS_PER_NODE"))          # srun
# what names one launch, the same for its every rank and new for the next launch
JOB_IDS = (("RP_SESSION_ID", "RP_PILOT_ID", "RP_TASK_ID"),  # a RADICAL-Pilot task (each rank
           ("SLURM_JOB_ID", "SLURM_STEP_ID"),              # runs under a shell of its own)
           ("PMIX_NAMESPACE",),                            # PMIx launchers (Open MPI 5)
           ("OMPI_MCA_ess_base_jobid",))                   # Open MPI 4
# launcher processes whose children are all the local ranks of one launch
LAUNCHER_PROCESSES = ("hydra_pmi_proxy",)  # MPICH's mpiexec


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


def _stat(pid):
    """(command name, start time in clock ticks since boot) of a process, or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
        name = text[text.index("(") + 1:text.rindex(")")]
        return name, text.rsplit(")", 1)[1].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def launch_name(env, parent=None):
    """The launch's name from the launcher's job ids, or from the launcher's own process
    where every local rank is its child (pid and start time: pids are reused, that pair
    is not); None where neither says it."""
    for keys in JOB_IDS:
        if all(env.get(key) for key in keys):
            return "-".join(env[key] for key in keys)
    parent = os.getppid() if parent is None else parent
    stat = _stat(parent)
    if stat is not None and stat[0] in LAUNCHER_PROCESSES:
        return f"{stat[0]}-{parent}-{stat[1]}"
    return None


def this_launch(environ=None, parent=None) -> Optional[Launch]:
    """This rank's Launch from its launcher's environment, or None where it says too little."""
    env = os.environ if environ is None else environ
    for rank_key, size_key, local_key in LAUNCHERS:
        rank, size = _int(env.get(rank_key)), _int(env.get(size_key))
        if rank is None or size is None or not 0 <= rank < size:
            continue
        local = _int(env.get(local_key, "").split("(")[0])  # srun: "16" or "8(x2)"
        name = launch_name(env, parent)
        return None if name is None else Launch(rank, size, local == size, name)
    return None
