"""Real slowness for the straggler bench and tests: a cgroup with a CPU quota.

A process moved into it (tasks/faults.py, TRAJFLOW_TEST_SLOW) gets at most
`fraction` of one core from the kernel's CFS bandwidth control, as a rank on
a busy or throttled node does; no sleep is added to the code measured.
cgroup v1 (a `cpu` hierarchy) and v2 (the `cpu` controller in the unified
tree) both work; creating one needs root.
"""
import itertools
import os
import time

V1_CPU = "/sys/fs/cgroup/cpu"
V2_ROOT = "/sys/fs/cgroup"
PERIOD_US = 100_000
_numbers = itertools.count()


def _v2_has_cpu():
    try:
        with open(os.path.join(V2_ROOT, "cgroup.controllers")) as fh:
            return "cpu" in fh.read().split()
    except OSError:
        return False


def unavailable():
    """Why a CPU quota cannot be set here, or None if it can."""
    if os.geteuid() != 0:
        return "setting a cgroup CPU quota needs root"
    if os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us")) or _v2_has_cpu():
        return None
    return "no cgroup cpu controller (v1 /sys/fs/cgroup/cpu or v2 cpu) on this machine"


class CpuQuota:
    """A cgroup whose processes together get at most `fraction` of one core."""

    def __init__(self, fraction: float):
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        if not 0 < fraction <= 1:
            raise ValueError(f"a CPU quota is a fraction of one core in (0, 1], not {fraction}")
        self.fraction = fraction
        name = f"trajflow-slow-{os.getpid()}-{next(_numbers)}"
        quota = max(1000, int(PERIOD_US * fraction))
        if os.path.exists(os.path.join(V1_CPU, "cpu.cfs_quota_us")):
            self.path = os.path.join(V1_CPU, name)
            os.mkdir(self.path)
            self._write("cpu.cfs_period_us", PERIOD_US)
            self._write("cpu.cfs_quota_us", quota)
        else:
            self.path = os.path.join(V2_ROOT, name)
            os.mkdir(self.path)
            if not os.path.exists(os.path.join(self.path, "cpu.max")):
                os.rmdir(self.path)
                raise RuntimeError(f"{V2_ROOT}/cgroup.subtree_control does not enable the cpu "
                                   "controller: echo +cpu > it (as root)")
            self._write("cpu.max", f"{quota} {PERIOD_US}")

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as fh:
            fh.write(str(value))

    def pids(self):
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as fh:
                return [int(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []

    def close(self, timeout_s: float = 10.0):
        """Remove the cgroup once its processes have ended (they are not killed here:
        the test or bench that started them ends them by pid)."""
        deadline = time.time() + timeout_s
        while os.path.isdir(self.path):
            try:
                os.rmdir(self.path)
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"{self.path} still holds processes {self.pids()}")
                time.sleep(0.05)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
