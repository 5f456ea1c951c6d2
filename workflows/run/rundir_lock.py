"""One run per RUNDIR: a lock taken before anything is read or written.

Two runs started into one folder (or a --resume while the run still goes)
would read each other's plan and both report success with one result (seen).
The lock is RUNDIR/.trajflow-lock, held with flock(2) by the process that
runs the run until the run has ended (the child holding its pilot closes the
copy it inherits: RADICAL's processes forked from it would keep a killed
run's lock held, seen; the child stops its pilot once that process is gone); the file says who holds it (host, pid, since when). A lock
whose holder is gone is released by the kernel and taken over with a note;
where the file system has no flock, a lock of this host whose pid is dead is
taken over, one of another host is refused (remove the file if that run is
gone).
"""
import errno
import fcntl
import os
import stat
import socket
import time

from trajflow.tasks.rundir import lock_holder, LOCK
from trajflow.workflows.errors import InputError

_HELD = set()  # this process's lock file descriptors


def close_inherited():
    """In a forked child: close the locks' descriptors it inherited (the parent keeps them)."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


class RunLock:
    """The lock of one RUNDIR, held from acquire() to release()."""

    def __init__(self, rundir):
        self.rundir = os.path.abspath(rundir)
        self.path = os.path.join(self.rundir, LOCK)
        self.fd = None
        self.taken_over = None   # the holder of a stale lock this one replaced
        self.created_dir = False

    def acquire(self, what="--out"):
        """Take the lock (creating RUNDIR if needed); InputError naming the holder if held."""
        if not os.path.isdir(self.rundir):
            os.makedirs(self.rundir)
            self.created_dir = True
        try:  # never through a link planted at the lock's name (it would be truncated)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.ELOOP, "not a plain file")
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise InputError(f"{what} {self.rundir!r} is not writable ({exc.strerror}): "
                                 "choose a folder you can write to") from None
            if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
                raise
            raise InputError(f"{what} {self.rundir!r}: its {LOCK} is not a plain file (a link "
                             "or a device, which trajflow never writes through): remove it if "
                             "the folder is yours, or choose another folder") from None
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        try:
            _take(fd)
        except BlockingIOError:
            os.close(fd)
            if _ours(holder):  # this very process planned it: a script's own second call
                return self
            raise InputError(f"{what} {self.rundir!r} is in use by another trajflow run "
                             f"({holder or 'holder unknown'}): wait for it to end, or choose "
                             "another folder") from None
        except OSError:  # no flock on this file system: judge by the holder's pid
            if holder and not _stale(holder):
                os.close(fd)
                raise InputError(f"{what} {self.rundir!r} is in use by another trajflow run "
                                 f"({holder}); if that run is gone, remove {self.path}") from None
        self.taken_over = holder or None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"host {socket.gethostname()} pid {os.getpid()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self.fd = fd
        _HELD.add(fd)
        return self

    def say_taken_over(self, say):
        """Say, where it did, that this lock replaced a stale one (whose run is gone)."""
        if self.taken_over:
            say(f"{self.rundir}: took over the lock of a run that is gone ({self.taken_over})")

    def let_go(self):
        """Close this process's hold only: the lock stays taken by the process it was
        handed to (a held pilot's holder, which got the same open file), its file kept."""
        if self.fd is None:
            return
        os.close(self.fd)
        _HELD.discard(self.fd)
        self.fd = None

    def release(self, remove_dir=False):
        """Let go (the file goes first, then the lock); `remove_dir`: also RUNDIR, if
        this lock created it and nothing else is in it (a run refused while planning)."""
        if self.fd is None:
            return
        _unlink_if_ours(self.path, self.fd)
        os.close(self.fd)
        _HELD.discard(self.fd)
        self.fd = None
        if remove_dir and self.created_dir:
            try:
                os.rmdir(self.rundir)
            except OSError:
                pass


def remove_handed_lock(rundir, fd):
    """The held pilot's side of release(), for a lock handed to it with its run: the
    file goes if it is still this lock's (its client, which would have removed it, may
    have ended before the run's report was written); the caller then closes `fd`."""
    _unlink_if_ours(os.path.join(rundir, LOCK), fd)


def _unlink_if_ours(path, fd):
    """Remove the lock file at `path` only while it is the file `fd` holds open: where
    another run's lock has replaced it (a user removed a lock the file system could not
    flock, as the refusal says to, and started another run), that one stays."""
    try:
        held, there = os.fstat(fd), os.lstat(path)
    except OSError:
        return
    if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
        try:
            os.unlink(path)
        except OSError:
            pass


def _take(fd, tries=10, pause_s=0.05):
    """flock(LOCK_EX) without waiting for a run that holds it, but past a reader's
    instant: `trajflow runs` asks whether a run goes by taking the lock shared for a
    moment (tasks/rundir.py lock_held)."""
    for _ in range(tries - 1):
        try:
            return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            time.sleep(pause_s)
    return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _ours(holder):
    host, pid = lock_holder(holder)
    return host == socket.gethostname() and pid == os.getpid()


def _stale(holder):
    """A holder on this host whose process is gone."""
    host, pid = lock_holder(holder)
    if host != socket.gethostname() or pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
