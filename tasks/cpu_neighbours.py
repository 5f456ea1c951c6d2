"""Who else used a node's CPUs while a rank ran: measured, not guessed.

A rank's t_cpu_wait (Linux' run-queue wait) says how long it was ready to run
while another process held its CPU; it does not say whose. The first rank on
each node reads every process' CPU time from /proc as its record starts and as
it ends; the difference, per process, names who ran meanwhile:

- this run: its launcher (mpiexec and its proxies, RADICAL's shells of the
  task), and its other ranks on the node where they outnumber the CPUs the
  ranks may use (otherwise each had a core of its own: `own_ranks_s`, no culprit);
- other runs: another trajflow run's tasks (runs side by side on a held pilot);
- RADICAL: the agent and its components (they name themselves rp.*), the client
  that runs EnTK for the run (TRAJFLOW_CLIENT_PID);
- other: anything else (another job, a daemon), named with its pid.

A process that both started and ended inside the window is not seen.
"""
import logging
import os
import time

from . import procfs
from .plan import encode_path_arg
from .rundir import PLAN

# the variable each launcher sets to a rank's place among the ranks of its node
LOCAL_RANK_VARS = ("MPI_LOCALRANKID",              # MPICH (hydra)
                   "OMPI_COMM_WORLD_LOCAL_RANK",   # Open MPI
                   "SLURM_LOCALID",                # srun
                   "PALS_LOCAL_RANKID",            # Cray PALS
                   "MV2_COMM_WORLD_LOCAL_RANK")    # MVAPICH
CLIENT_PID = "TRAJFLOW_CLIENT_PID"  # the process that runs EnTK for the run (pipeline.py)
KINDS = ("this run", "other runs", "RADICAL", "other")
# a task's launch chain: the launchers' processes, and RADICAL's shell scripts of a task
LAUNCHERS = ("mpiexec", "mpirun", "hydra_pmi_proxy", "srun", "prterun", "prted", "orted")
TASK_SCRIPTS = (b".exec.sh", b".launch.sh")
TASK_MODULE = b"trajflow.tasks."   # every task program's module (tasks/stages.py)
RANK_MODULE = b"trajflow.tasks.analyze"
TOP = 5          # the processes named in a record
LEAST_S = 0.01   # CPU seconds below this are no one's

log = logging.getLogger(__name__)


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
        # the folder as a task's command line may spell it: as given, as it is, and the
        # plan's path as the stages encode one a shell would read (tasks/stages.py)
        self.run_folder = {os.fsencode(os.path.join(f(run_folder), ""))
                           for f in (os.path.abspath, os.path.realpath)}
        self.run_folder.add(os.fsencode(encode_path_arg(os.path.join(
            os.path.abspath(run_folder), PLAN))))
        self.t0 = time.time()
        self.before = procfs.cpu_times()

    @classmethod
    def for_rank(cls, rank, run_folder):
        """One per node: a CpuNeighbours for its first rank, None for the others (and
        where /proc cannot be read: a measurement never fails a run)."""
        try:
            return cls(run_folder) if first_on_node(rank) else None
        except Exception as exc:  # noqa: BLE001
            log.warning("no measurement of the node's other processes: %s", exc)
            return None

    def measure(self, top=TOP) -> dict:
        """What the node's other processes used since the start: {"window_s", "node_cpus",
        "cpus_allowed", "run_ranks_here", "own_ranks_s", "by_kind": {kind: CPU s},
        "top": [[name, pid, kind, CPU s], ...] (most first)}; {"error": why} where it
        could not be measured (a measurement never fails a run)."""
        try:
            return self._measure(top)
        except Exception as exc:  # noqa: BLE001
            return {"error": repr(exc)[:200]}

    def _measure(self, top):
        after = procfs.cpu_times()
        me = os.getpid()
        used = sorted(((cpu - self.before.get(key, (0.0,))[0], key[0], name)
                       for key, (cpu, name) in after.items() if key[0] != me), reverse=True)
        used = [u for u in used if u[0] >= LEAST_S]
        chain = launch_chain(me)
        kinds = [(seconds, pid, name, self.kind(pid, chain)) for seconds, pid, name in used]
        rank_pids = [me] + [pid for _, pid, _, kind in kinds if kind == "rank"]
        cpus = len(allowed_cpus(rank_pids))
        ranks = len(rank_pids)
        crowded = ranks > cpus  # the run's own ranks outnumber their CPUs: they are a culprit
        by_kind, own_ranks, named = dict.fromkeys(KINDS, 0.0), 0.0, []
        for seconds, pid, name, kind in kinds:
            if kind == "rank":
                if not crowded:
                    own_ranks += seconds
                    continue
                kind = "this run"
            by_kind[kind] += seconds
            if len(named) < top:
                named.append([name, pid, kind, round(seconds, 3)])
        return {"window_s": time.time() - self.t0, "node_cpus": os.cpu_count() or 1,
                "cpus_allowed": cpus, "run_ranks_here": ranks, "own_ranks_s": round(own_ranks, 3),
                "by_kind": {k: round(v, 3) for k, v in by_kind.items()}, "top": named}

    def kind(self, pid, chain):
        """"rank" (another rank of this run), or one of KINDS."""
        if str(pid) == os.environ.get(CLIENT_PID):
            return "RADICAL"
        p = procfs.process(pid)
        if p is None:
            return "other"
        if pid in chain:
            return "this run"
        words = p.cmdline.replace(b"\0", b" ").split()  # (a task served by the pilot's
        # task server has its command line as one retitled string)
        if self.ours(p):  # a launcher's words name the rank's module too: not a rank
            return "rank" if RANK_MODULE in words and p.name not in LAUNCHERS else "this run"
        if any(w.startswith(TASK_MODULE) for w in words):
            return "other runs"
        return "RADICAL" if procfs.is_radical(p) else "other"

    def ours(self, p):
        return any(folder in p.cmdline for folder in self.run_folder)


def allowed_cpus(pids):
    """The CPUs the processes `pids` may run on, together (each rank may be bound to one
    core of its own); those of the node where that cannot be read."""
    cpus = set()
    for pid in pids:
        try:
            cpus |= os.sched_getaffinity(pid)
        except (AttributeError, OSError):  # gone meanwhile, or not Linux
            continue
    return cpus or set(range(os.cpu_count() or 1))


def launch_chain(pid):
    """The launchers above `pid` (mpiexec, its proxies, RADICAL's shell scripts of the
    task), up to the first ancestor that is none of them."""
    chain = set()
    for ancestor in procfs.ancestors(pid):
        p = procfs.process(ancestor)
        if p is None or not (p.name in LAUNCHERS or any(s in p.cmdline for s in TASK_SCRIPTS)):
            break
        chain.add(ancestor)
    return chain
