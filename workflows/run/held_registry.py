"""Where held pilots are found: one private folder per name, holding the holder's
Unix socket and its record.

Only the owner may reach a held pilot: its folder and the folder of all
pilots must be the user's own, not links, and closed to group and others
(0700), or nothing in them is used. There is no TCP port. A socket's path is
reached through the folder's open descriptor (/proc/self/fd/N/socket), which
keeps it short (a Unix socket's path has at most 107 bytes) and pins the
folder that was checked.

Everything read here is data (JSON checked field by field); messages are one
JSON object per line.
"""
import contextlib
import errno
import json
import os
import re
import shutil
import socket
import stat
import time

from trajflow.tasks.analyses import ANALYSES
from trajflow.tasks.rundir import read_record as read_plain, write_text
from trajflow.workflows.errors import InputError

PILOTS_ENV = "TRAJFLOW_PILOTS"  # the folder of held pilots (default ~/.trajflow/pilots)
SOCKET = "socket"
RECORD = "holder.json"   # the holder's record: pid, pilot, state
REQUEST = "start.json"   # what `pilot start` asked the holder for
LOG = "holder.log"
MAX_MESSAGE_BYTES = 1 << 20
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
STATES = ("starting", "active", "stopping", "failed")
LIST_HINT = "`trajflow pilot list` shows the held pilots"


def check_name(name):
    """A held pilot's name: letters, digits, '.', '_', '-' (it names a folder)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InputError(f"pilot name {name!r}: use letters, digits, '.', '_' and '-' (at "
                         "most 64, not starting with a punctuation mark)")
    return name


def pilots_root(create=True):
    """The folder of held pilots, checked private (created 0700 where missing)."""
    root = os.path.abspath(os.environ.get(PILOTS_ENV)
                           or os.path.join(os.path.expanduser("~"), ".trajflow", "pilots"))
    if create:
        os.makedirs(os.path.dirname(root), mode=0o700, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
    check_private(root)
    return root


def check_private(path):
    """InputError unless `path` is a folder of this user's, not a link, closed to
    group and others: a held pilot's socket in any other folder could be
    someone else's, or reachable by them."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such folder; {LIST_HINT}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise InputError(f"{path} is not a plain folder (a link or a file): held pilots are "
                         f"kept only in a private folder of your own; remove it, or set "
                         f"{PILOTS_ENV} to another folder")
    if info.st_uid != os.getuid():
        raise InputError(f"{path} belongs to user id {info.st_uid}, not you ({os.getuid()}): "
                         "a held pilot is reachable by its owner only; use your own (set "
                         f"{PILOTS_ENV})")
    if info.st_mode & 0o077:
        raise InputError(f"{path} is open to others (mode {stat.S_IMODE(info.st_mode):o}): "
                         f"anyone who can enter it could send work to your pilot; "
                         f"chmod 700 {path}")


def pilot_folder(name):
    """The folder of the held pilot `name` (it may not exist)."""
    return os.path.join(pilots_root(), check_name(name))


def held_names():
    """The names of the folders in the pilots' folder (held, starting or stale)."""
    root = pilots_root()
    return sorted(n for n in os.listdir(root) if NAME_PATTERN.match(n)
                  and os.path.isdir(os.path.join(root, n)))


@contextlib.contextmanager
def folder_descriptor(folder):
    """An O_PATH descriptor of the checked `folder`, for its socket's short path."""
    check_private(folder)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)  # the folder opened is the one checked
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise InputError(f"{folder} changed while it was opened; try again")
        yield fd
    finally:
        os.close(fd)


def listen(folder):
    """The holder's listening socket in `folder` (a stale one replaced)."""
    with folder_descriptor(folder) as fd:
        path = f"/proc/self/fd/{fd}/{SOCKET}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, SOCKET))
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket itself 0600 too
        try:
            server.bind(path)
        finally:
            os.umask(old)
        server.listen(64)
        return server


def connect(folder, timeout_s=5.0):
    """A connection to the holder in `folder`; ConnectionRefusedError or
    FileNotFoundError where nothing listens there."""
    with folder_descriptor(folder) as fd:
        sock_path = os.path.join(folder, SOCKET)
        info = os.lstat(sock_path)
        if not stat.S_ISSOCK(info.st_mode) or info.st_uid != os.getuid():
            raise InputError(f"{sock_path} is not a socket of yours: remove it")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(timeout_s)
        try:
            conn.connect(f"/proc/self/fd/{fd}/{SOCKET}")
        except OSError:
            conn.close()
            raise
        conn.settimeout(None)
        return conn


def send(conn, message):
    """One message: a JSON object on one line."""
    conn.sendall((json.dumps(message) + "\n").encode())


class Messages:
    """The messages of a connection, one JSON object per line (EOFError at its end);
    a line longer than MAX_MESSAGE_BYTES or not a JSON object is refused."""

    def __init__(self, conn):
        self.file = conn.makefile("rb")

    def receive(self):
        line = self.file.readline(MAX_MESSAGE_BYTES + 1)
        if not line:
            raise EOFError("the connection was closed")
        if len(line) > MAX_MESSAGE_BYTES or not line.endswith(b"\n"):
            raise ValueError("a message too long or cut short")
        message = json.loads(line)
        if not isinstance(message, dict):
            raise ValueError("a message that is not a JSON object")
        return message

    def close(self):
        self.file.close()


def plannable_there(analysis, args) -> bool:
    """Whether a holder plans a run of `analysis` itself: trajflow's own analyses only
    (a user's code is never imported by the long-lived holder); both sides ask this."""
    return isinstance(analysis, str) and analysis in ANALYSES and not args


def write_record(folder, record):
    """The holder's record, written whole under a new name (never through a link)."""
    write_text(os.path.join(folder, RECORD), json.dumps(record, indent=1))


_RECORD_TYPES = {"name": str, "pid": int, "state": str, "started": (int, float),
                 "resource": str, "cpus": int, "walltime": int, "idle_timeout": (int, float),
                 "session_dir": (str, type(None)), "error": (str, type(None))}


def read_record(folder):
    """The holder's record, checked field by field; None where there is none (yet)
    or it is not one."""
    record = read_plain(os.path.join(folder, RECORD), 1 << 16)
    if not isinstance(record, dict) or any(
            not isinstance(record.get(k), t) or isinstance(record.get(k), bool)
            for k, t in _RECORD_TYPES.items()) or record["state"] not in STATES:
        return None
    return record


HOLDER_MODULE = "trajflow.workflows.run.held_holder"


def holder_alive(pid):
    """Whether `pid` is a living holder: not gone, not a zombie nobody reaped (its
    parent, `pilot start`, has ended), not another program that got its pid."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():
            return False  # a pid reused by someone else's process
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
    except (OSError, IndexError):
        return False
    return state != b"Z" and HOLDER_MODULE.encode() in cmdline


def held_elsewhere(record):
    """The host whose holder wrote `record`, where that is not this one (a home folder
    shared by a cluster's login nodes: a Unix socket answers on its own node only)."""
    host = record.get("host") if record else None
    return host if isinstance(host, str) and host != socket.gethostname() else None


def is_stale(folder, grace_s=120.0):
    """True where nobody holds this name any more: its holder is gone (or never
    wrote its record and the folder is older than `grace_s`). A holder on another
    host is never judged from here."""
    record = read_record(folder)
    if record is not None:
        return not held_elsewhere(record) and not holder_alive(record["pid"])
    try:
        return time.time() - os.lstat(folder).st_mtime > grace_s
    except FileNotFoundError:
        return False


def remove_folder(folder):
    """A held pilot's folder, removed (its own names only; nothing followed)."""
    shutil.rmtree(folder, ignore_errors=True)


def is_refused(exc):
    return isinstance(exc, (ConnectionRefusedError, FileNotFoundError)) or (
        isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.ENOENT))
