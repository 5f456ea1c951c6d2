"""Testing hooks that inject known faults; inert unless their variable is set.

TRAJFLOW_TEST_DELAY=<block>:<phase>:<seconds>[,...] makes that block sleep in
that phase (open, io, compute, comm), so that tests can check the profiler
finds exactly that straggler and names that phase.

TRAJFLOW_TEST_FAIL=<block>:<times> makes the analyze work of that block exit
with code 3 on its first <times> attempts (counted in RUNDIR/faults/), so
that tests can check retries, and failure once retries are spent.

TRAJFLOW_TEST_KILL=<rank> makes that MPI rank SIGKILL itself as it begins its
chunks (whether or not any is left for it: a rank that starts late may find none),
so that tests can check nothing hangs and nothing is published.

TRAJFLOW_TEST_SLOW=<rank>:<cgroup folder>[,...] moves that MPI rank (in tasks
mode: the task of that block) into a cgroup the caller made with a CPU quota
(workflows/bench/cpu_quota.py), so that tests and the bench measure real
slowness, not a sleep.

TRAJFLOW_TEST_REMOTE_COUNTER=1 makes a dynamic schedule's ranks claim chunks
from the MPI window on rank 0 (the counter of ranks on several nodes) even
when they share one node, so that path is tested here.

TRAJFLOW_TEST_LINGER=<seconds> makes reduce sleep after it has published
result.h5, so that tests can interrupt a run whose result is complete.
"""
import os
import signal
import sys
import time

from .exit_codes import INJECTED_FAILURE

_PHASES = ("open", "io", "compute", "comm")


def _parse(name, fields, convert):
    spec = os.environ.get(name, "").strip()
    out = []
    if not spec:
        return out
    for item in spec.split(","):
        parts = item.split(":")
        try:
            if len(parts) != len(fields):
                raise ValueError
            out.append(tuple(c(p) for c, p in zip(convert, parts)))
        except (ValueError, KeyError):
            raise SystemExit(f"{name}={spec!r}: expected {':'.join(fields)}[,...]")
    return out


def _phase(p):
    if p not in _PHASES:
        raise ValueError(p)
    return p


_DELAYS = {(b, p): s for b, p, s in _parse("TRAJFLOW_TEST_DELAY", ("block", "phase", "seconds"),
                                           (int, _phase, float))}
_FAILS = {b: n for b, n in _parse("TRAJFLOW_TEST_FAIL", ("block", "times"), (int, int))}
_KILLS = {r for (r,) in _parse("TRAJFLOW_TEST_KILL", ("rank",), (int,))}
_SLOW = dict(_parse("TRAJFLOW_TEST_SLOW", ("rank", "cgroup"), (int, str)))
_DONE = set()


def delay(block, phase):
    """Sleep once per (block, phase) when asked to by TRAJFLOW_TEST_DELAY."""
    key = (block, phase)
    if key in _DELAYS and key not in _DONE:
        _DONE.add(key)
        time.sleep(_DELAYS[key])


def maybe_fail(workdir, block):
    """Exit 3 while this block has failed fewer times than TRAJFLOW_TEST_FAIL asks."""
    if block not in _FAILS:
        return
    folder = os.path.join(workdir, "faults")
    os.makedirs(folder, exist_ok=True)
    counter = os.path.join(folder, f"fail_block_{block:05d}.count")
    done = int(open(counter).read()) if os.path.exists(counter) else 0
    if done < _FAILS[block]:
        with open(counter, "w") as fh:
            fh.write(str(done + 1))
        print(f"TRAJFLOW_TEST_FAIL: block {block} fails on purpose "
              f"(attempt {done + 1} of {_FAILS[block]} failing ones)", file=sys.stderr, flush=True)
        sys.exit(INJECTED_FAILURE)


def linger_after_publish():
    """Sleep after the result is published when TRAJFLOW_TEST_LINGER asks to."""
    seconds = float(os.environ.get("TRAJFLOW_TEST_LINGER") or 0)
    if seconds:
        time.sleep(seconds)


def maybe_kill(rank):
    """SIGKILL this process if TRAJFLOW_TEST_KILL names its rank."""
    if rank in _KILLS:
        print(f"TRAJFLOW_TEST_KILL: rank {rank} kills itself", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_slow_down(rank):
    """Join the CPU-limited cgroup TRAJFLOW_TEST_SLOW names for this rank (or block)."""
    if rank not in _SLOW:
        return
    with open(os.path.join(_SLOW[rank], "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
    print(f"TRAJFLOW_TEST_SLOW: rank {rank} runs in {_SLOW[rank]}", file=sys.stderr, flush=True)


def remote_counter_forced():
    """Whether TRAJFLOW_TEST_REMOTE_COUNTER asks for the several-node claim counter."""
    return os.environ.get("TRAJFLOW_TEST_REMOTE_COUNTER", "") not in ("", "0")
