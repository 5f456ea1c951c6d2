"""Who else used a node's CPUs while a rank ran: measured, not guessed.

A rank's t_cpu_wait (Linux' run-queue wait) says how long it was ready to run
while another process held its CPU; it does not say whose. The first rank on
each node reads every process' CPU time from /proc as its record starts and as
it ends; the difference, per process, names who ran meanwhile: this run's own
processes (its other ranks, its launcher), RADICAL's (the agent's components,
the client that runs EnTK), or others (another job, a daemon). A process that
both started and ended inside the window is not seen.
"""
import os
import time

from . import procfs

# the variable each launcher sets to a rank's place among the ranks of its node
LOCAL_RANK_VARS = ("MPI_LOCALRANKID",              # MPICH (hydra)
                   "OMPI_COMM_WORLD_LOCAL_RANK",   # Open MPI
                   "SLURM_LOCALID",                # srun
                   "PALS_LOCAL_RANKID",            # Cray PALS
                   "MV2_COMM_WORLD_LOCAL_RANK")    # MVAPICH
CLIENT_PID = "TRAJFLOW_CLIENT_PID"  # the process that runs EnTK for the run (pipeline.py)
KINDS = ("this run", "RADICAL", "other")
TOP = 5          # the processes named in a record
LEAST_S = 0.01   # CPU seconds below this are no one's


def first_on_node(rank, env=None) -> bool:
    """Whether this rank is its node's first (by the launcher; rank 0 where it is silent)."""
    env = os.environ if env is None else env
    for var in LOCAL_RANK_VARS:
        if env.get(var, "").strip().isdigit():
            return int(env[var]) == 0
    return rank == 0


class CpuNeighbours:
    """Started as a rank's record starts; `measure()` as it ends."""

    def __init__(self, run_folder):
        self.run_folder = os.path.realpath(run_folder).encode()
        self.t0 = time.time()
        self.before = procfs.cpu_times()

    @classmethod
    def for_rank(cls, rank, run_folder):
        """One per node: a CpuNeighbours for its first rank, None for the others."""
        return cls(run_folder) if first_on_node(rank) else None

    def measure(self) -> dict:
        """{"window_s", "node_cpus", "by_kind": {kind: CPU s}, "top": [[name, pid, kind,
        CPU s], ...]}: what the other processes of this node used since the start."""
        after = procfs.cpu_times()
        me = os.getpid()
        used = sorted(((cpu - self.before.get(key, (0.0,))[0], key[0], name)
                       for key, (cpu, name) in after.items() if key[0] != me), reverse=True)
        used = [u for u in used if u[0] >= LEAST_S]
        own = self.launchers(me)
        by_kind = dict.fromkeys(KINDS, 0.0)
        top = []
        for seconds, pid, name in used:
            kind = self.kind(pid, own)
            by_kind[kind] += seconds
            if len(top) < TOP:
                top.append([name, pid, kind, round(seconds, 3)])
        return {"window_s": time.time() - self.t0, "node_cpus": os.cpu_count(),
                "by_kind": {k: round(v, 3) for k, v in by_kind.items()}, "top": top}

    @staticmethod
    def launchers(me):
        """This rank's launcher (mpiexec, its proxies): its ancestors below RADICAL's."""
        own = set()
        for pid in procfs.ancestors(me):
            p = procfs.process(pid)
            if p is None or _radical(pid, p.cmdline):
                break
            own.add(pid)
        return own

    def kind(self, pid, own):
        p = procfs.process(pid)
        cmdline = p.cmdline if p is not None else b""
        if pid in own or self.run_folder in cmdline:
            return "this run"
        return "RADICAL" if _radical(pid, cmdline) else "other"


def _radical(pid, cmdline):
    """RADICAL's agent and its components, a task's shells in the pilot's sandbox, or
    the client that runs EnTK for the run."""
    return b"radical" in cmdline.lower() or str(pid) == os.environ.get(CLIENT_PID)
