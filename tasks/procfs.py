"""What this machine's /proc says about its processes: one place that reads it.

The watchdog names stopped ranks and dead RADICAL processes, the pilot's
teardown finds a local pilot's tasks, a stop signal's sender is guessed from
the parent's name, and a rank measures who else used its node's CPUs
(cpu_neighbours.py); all of them read /proc the same way here (Linux only:
elsewhere each answer is empty).
"""
import glob
import os
import time


class Process:
    """One process as /proc showed it: pid, name (the kernel's, 15 characters), state
    (R, S, D, T: stopped, Z), parent, process group, and its command line as bytes."""
    __slots__ = ("pid", "name", "state", "parent", "group", "cmdline")

    def __init__(self, pid, name, state, parent, group, cmdline):
        self.pid, self.name, self.state = pid, name, state
        self.parent, self.group, self.cmdline = parent, group, cmdline

    @property
    def title(self):
        """The whole command line as one string (a RADICAL component's process title)."""
        return self.cmdline.replace(b"\0", b" ").decode(errors="replace").strip()


def process(pid):
    """The Process `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        head, _, tail = stat.rpartition(b")")
        fields = tail.split()
        return Process(int(pid), head.partition(b"(")[2].decode(errors="replace"),
                       fields[0].decode(), int(fields[1]), int(fields[2]), cmdline)
    except (OSError, ValueError, IndexError):
        return None


def processes():
    """Every process readable now."""
    found = (process(path.split("/")[2]) for path in glob.glob("/proc/[0-9]*/stat"))
    return [p for p in found if p is not None]


def die_with_parent(parent):
    """SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG; it follows the
    parent's thread that started it), and end now if `parent` is gone already."""
    import ctypes
    import signal
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def group_ended(group, patience_s=0.0, poll_s=0.05) -> bool:
    """Whether process group `group` has no live member within `patience_s` (a zombie
    not yet reaped by its new parent has ended already). Polled: a fixed wait after a
    signal to a group cost seconds of every run's end, the group mostly gone at once."""
    if not os.path.isdir("/proc/self"):  # nothing to poll: wait, and say it may live on
        time.sleep(patience_s)
        return False
    deadline = time.time() + patience_s
    while any(p.group == group and p.state != "Z" for p in processes()):
        if time.time() >= deadline:
            return False
        time.sleep(poll_s)
    return True


def cwd(pid):
    """The working folder of `pid`, or None once it is gone (or is another user's)."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def environment(pid):
    """The environment `pid` started with, as a dict of bytes (empty once it is gone or
    is another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return {}
    return dict(entry.partition(b"=")[::2] for entry in entries if b"=" in entry)


def state(pid):
    """The state letter of `pid`, or None once it is gone."""
    found = process(pid)
    return found.state if found else None


def name(pid):
    found = process(pid)
    return found.name if found else ""


def descendants(roots, every):
    """pids below `roots` in the process tree of `every` (a processes() list)."""
    children = {}
    for p in every:
        children.setdefault(p.parent, []).append(p.pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_times():
    """{(pid, start time in ticks since boot): (CPU seconds used so far, its threads' all,
    name)} of every process readable now (pids are reused; that pair is not). Only
    each /proc/PID/stat is read: a few ms for a node's hundreds of processes."""
    found = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
            head, _, tail = stat.rpartition(b")")
            fields = tail.split()
            found[(int(entry.name), int(fields[19]))] = (
                (int(fields[11]) + int(fields[12])) / TICKS_PER_S,
                head.partition(b"(")[2].decode(errors="replace"))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    return found


def ancestors(pid):
    """The pids above `pid` up to init."""
    found = []
    while True:
        p = process(pid)
        if p is None or p.parent in (0, pid) or p.parent in found:
            return found
        found.append(p.parent)
        pid = p.parent


def is_radical(p) -> bool:
    """A RADICAL-Pilot process: its components title themselves rp.<uid> (their command
    line replaced), the rest (the agent's bootstrapper, a task's shells in the pilot's
    sandbox) have RADICAL's name on their command line."""
    return (p.name.startswith("rp.") or p.cmdline.startswith(b"rp.")
            or b"radical" in p.cmdline.lower())
