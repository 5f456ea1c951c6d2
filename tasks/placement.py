"""Where a task's process runs: off the cores kept for RADICAL's agent.

A resource config may keep cores for RADICAL-Pilot's agent
(`system_architecture.blocked_cores`): RADICAL then schedules no task there. As
RADICAL means them, they are positions among a node's cores: trajflow reads them
as positions in the sorted list of CPUs the node lets the job use (its cgroup's
cpuset), so that a job confined to CPUs 8-15 keeps CPU 8 for position 0. The
bootstrap pins the agent there (`python -m trajflow.tasks.placement --pin PID`),
a local pilot's client goes there, and the workstation passes the positions to
every task as $TRAJFLOW_AGENT_CORES. A task started by the agent inherits the
agent's pin, so it moves itself to the node's other CPUs first thing (the
package's __init__ calls leave_agent_cpus before anything heavy is imported).
Without this the agent's ZMQ bridges and the ranks share cores and the ranks
wait for them (measured on 2 cores: 2 ranks took 1.32x their mpiexec time).

How often RADICAL's processes wake is this module's too: its ZMQ bridges and
components poll their sockets and sleep in 10 ms steps whether or not a message
is due, so the process holding a local pilot gives itself, and so every RADICAL
process it starts, a timer slack of RADICAL_TIMER_SLACK_NS (the kernel may then
end those waits up to 10 ms late and wakes them together). A task inherits it
and goes back to the kernel's default first thing, as it leaves the agent's CPUs.
Standard library only.
"""
import argparse
import os

AGENT_CORES_ENV = "TRAJFLOW_AGENT_CORES"
# Measured on 2 cores, an idle local pilot (its ~35 processes): 0.46-0.53 cores busy
# at the kernel's 50 us default, 0.16-0.19 at 10 ms, and a 2-block run 2.4 -> 2.6 s,
# 32 tasks unchanged (8.1-8.5 s); 50 ms cut idle to 0.08 cores but slowed runs 20-40 %.
RADICAL_TIMER_SLACK_NS = 10_000_000
DEFAULT_TIMER_SLACK_NS = 50_000  # Linux' default for a process that never set one
_PR_SET_TIMERSLACK = 29          # prctl(2)


def agent_positions(environ=None):
    """The kept positions, from the environment: a sorted tuple, empty if none."""
    text = (os.environ if environ is None else environ).get(AGENT_CORES_ENV, "").strip()
    return tuple(sorted({int(c) for c in text.split(",") if c.strip()})) if text else ()


def node_cpus(widen=False):
    """The CPUs this process may use, sorted; `widen`: first ask for every CPU, so that
    the kernel answers with all its cgroup allows (a process pinned by its parent
    would otherwise see only its pin). Widening changes this process' affinity."""
    if widen:
        try:  # the kernel drops what the cgroup's cpuset does not allow
            os.sched_setaffinity(0, range(os.cpu_count() or 1))
        except OSError:
            pass
    return sorted(os.sched_getaffinity(0))


def split_cpus(positions, cpus):
    """(the agent's CPUs, the others) of `cpus` for the kept `positions`; a node with no
    CPU besides the kept ones keeps them all for its tasks (nothing to move to)."""
    agent = [cpus[i] for i in positions if 0 <= i < len(cpus)]
    others = [c for c in cpus if c not in agent]
    return (agent, others) if others else ([], list(cpus))


# what the package's import changed for a task (its inherited CPUs, RADICAL's timer
# slack), kept for keep_inherited_placement in a process that is RADICAL's, not a task
_INHERITED = {}


def leave_agent_cpus(environ=None):
    """Move this process to the node's CPUs that are not the agent's; returns the CPUs it
    may run on now."""
    positions = agent_positions(environ)
    if not positions or not hasattr(os, "sched_setaffinity"):
        return current_cpus()
    _, others = split_cpus(positions, node_cpus(widen=True))
    _INHERITED.setdefault("cpus", current_cpus())
    pin_to(others)
    return current_cpus()


def pin_to(cpus, pid=0):
    """Pin `pid` (this process by default; and what it starts later) to `cpus`; False
    where not possible."""
    try:
        os.sched_setaffinity(pid, set(cpus))
        return True
    except (OSError, AttributeError, ValueError):
        return False


def timer_slack_ns(pid="self"):
    """The process' timer slack in ns (Linux' /proc/PID/timerslack_ns), or None where
    it cannot be read."""
    try:
        with open(f"/proc/{pid}/timerslack_ns", encoding="ascii") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return None


def set_timer_slack(ns):
    """This process' timer slack (and what it starts later); False where the kernel has
    no such knob. ctypes is imported only here: a task that needs no change never pays it."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(ns),
                                                       0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):  # a Python without ctypes, not Linux
        return False


def drop_radical_timer_slack():
    """A task started by a local pilot inherited RADICAL's timer slack: back to the
    default, so that its own waits end on time. Called on the main thread (a package
    import): /proc/self is that thread's, the only one readable without CAP_SYS_NICE."""
    if timer_slack_ns() == RADICAL_TIMER_SLACK_NS:
        _INHERITED.setdefault("timer_slack", RADICAL_TIMER_SLACK_NS)
        set_timer_slack(DEFAULT_TIMER_SLACK_NS)


def keep_inherited_placement():
    """For RADICAL's own processes that import trajflow.tasks (the component starter
    and the agent, which fork or start RADICAL's others): back to the CPUs and the
    timer slack they inherited, which the package's import gives back for a task.
    Without it every RADICAL process forked from the starter woke on time again, 10 ms
    apart (the slack that makes an idle pilot cost 0.16 of a core, not 0.5)."""
    if "timer_slack" in _INHERITED:
        set_timer_slack(_INHERITED.pop("timer_slack"))
    if "cpus" in _INHERITED:
        pin_to(_INHERITED.pop("cpus"))


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


def main(argv=None):
    """The bootstrap's pin: `--pin PID --positions 0,...` pins the agent's bootstrapper."""
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.placement",
                                description="Pin RADICAL's agent (its bootstrapper) to the "
                                            "node's kept cores.")
    p.add_argument("--pin", type=int, required=True, help="the bootstrapper's pid")
    p.add_argument("--positions", required=True, help="the kept positions, e.g. 0")
    args = p.parse_args(argv)
    positions = agent_positions({AGENT_CORES_ENV: args.positions})
    agent, _ = split_cpus(positions, node_cpus(widen=True))
    if agent and pin_to(agent, args.pin):
        print(f"trajflow: the agent is pinned to CPUs {agent}")
        return 0
    print(f"trajflow: the agent could not be pinned to positions {list(positions)} of this "
          f"node's CPUs {node_cpus()}; it shares them with the tasks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
