"""Where a task's process runs: off the cores kept for RADICAL's agent.

A resource config may keep cores for RADICAL-Pilot's agent
(`system_architecture.blocked_cores`, read by trajflow as the operating system's
CPU numbers): RADICAL then schedules no task there, the config's bootstrap pins
the agent there, and the workstation passes them to every task as
$TRAJFLOW_AGENT_CPUS. A task started by the agent inherits the agent's pin, so
it moves itself to the node's other CPUs here, first thing. Without this the
agent's ZMQ bridges and the ranks share cores, and the ranks wait for them
(measured on 2 cores: a 2-rank stage 2.2x its time under plain mpiexec).
"""
import os

AGENT_CPUS_ENV = "TRAJFLOW_AGENT_CPUS"


def agent_cpus(environ=None):
    """The CPUs kept for the agent, from the environment: a frozenset, empty if none."""
    text = (os.environ if environ is None else environ).get(AGENT_CPUS_ENV, "").strip()
    return frozenset(int(c) for c in text.split(",") if c.strip()) if text else frozenset()


def leave_agent_cpus(environ=None):
    """Take the agent's CPUs out of this process' affinity; where it has only those (it
    inherited the agent's pin), every other CPU this node lets it use. Returns the
    CPUs it may run on now. A node whose CPUs are all the agent's keeps them."""
    avoid = agent_cpus(environ)
    if not avoid or not hasattr(os, "sched_setaffinity"):
        return current_cpus()
    now = os.sched_getaffinity(0)
    wanted = (now - avoid) or (set(range(os.cpu_count() or 1)) - avoid)
    if wanted and wanted != now:
        try:  # the kernel keeps only what the process' cgroup allows
            os.sched_setaffinity(0, wanted)
        except OSError:  # none of them allowed here: stay where it is
            pass
    return current_cpus()


def pin_to(cpus):
    """Pin this process (and what it starts later) to `cpus`; False where not possible."""
    try:
        os.sched_setaffinity(0, set(cpus))
        return True
    except (OSError, AttributeError):
        return False


def current_cpus():
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def runqueue_wait_s():
    """Seconds this process was ready to run but waited for a CPU held by another
    (Linux' /proc/self/schedstat, second field), or None where the kernel does not say."""
    try:
        with open("/proc/self/schedstat", encoding="ascii") as fh:
            fields = fh.read().split()
        return int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
