"""A run's folder (RUNDIR): every file name and record in it, for both sides.

The workstation (planning, the pilot process, inspection, remote runs) and
the tasks read and write the same folder; its names live here and nowhere
else. Standard library only: the pilot's guard (client_guard.py) starts
before anything else is importable and uses `write_record` too.

    RUNDIR/plan.json            the plan (tasks/plan.py), selection.npz beside it
    RUNDIR/.trajflow-run        "this folder is a trajflow run"
    RUNDIR/.trajflow-lock       one run per RUNDIR (workflows/run/rundir_lock.py)
    RUNDIR/outcome.json         how the run ended, written the moment it has ended
    RUNDIR/.trajflow-reserve    room kept for outcome.json until the run has ended well
    RUNDIR/result.h5            the result; its presence means the run is complete
    RUNDIR/report.html          the HTML report written after the run
    RUNDIR/radical_session      the RADICAL session folders that ran it
    RUNDIR/client.json, client.log, client_exit.json, client.sbatch   a remote run's client
    RUNDIR/split/ parts/ profile/ progress/ radical/ analysis/ backend/
    RUNDIR/claims/              tasks mode, dynamic schedule: who runs which block (block_claims.py)
    RUNDIR/progress/started.STAGE  touched by each task of STAGE as it starts (the watchdog)
"""
import contextlib
import errno
import json
import math
import os
import secrets
import shutil
import stat
import time

PLAN = "plan.json"
SELECTION = "selection.npz"
MARKER = ".trajflow-run"
LOCK = ".trajflow-lock"
OUTCOME = "outcome.json"
RESERVE = ".trajflow-reserve"
RESERVE_BYTES = 256 << 10  # an outcome with its earlier attempts is a few kB
OUTCOME_BEFORE = "outcome.before.json"  # a failed outcome set aside while a resume runs
RESULT = "result.h5"
BACKEND_RESULT = os.path.join("backend", "results.pickle")  # a trajflow.Backend run's result
REPORT = "report.html"
SESSIONS = "radical_session"
MANIFEST = os.path.join("split", "manifest.json")
CLIENT = "client.json"
CLIENT_LOG = "client.log"
CLIENT_EXIT = "client_exit.json"
BATCH_SCRIPT = "client.sbatch"
CLAIMS = "claims"
REMOTE = "remote.json"        # in a remote run's local folder: where the run lives
FOLDERS = ("parts", "profile", "split")  # made when the plan is written; others as needed
ANALYSIS_DIR = "analysis"     # a user's analysis as the tasks load it (its copy, its modules)
KEPT_TASK_FILES = "radical"   # each task's RADICAL profile, stdout and stderr
SCHEDULING = "scheduling.prof"  # beside them: the task's lines of the agent scheduler's profile
PILOT_EVENTS = "pilot.prof"     # in KEPT_TASK_FILES: the pilot's own lines (start, active)
# RADICAL's profiles in a pilot's sandbox those lines are taken from
SCHEDULER_PROFILES = "agent_scheduling.*.prof"
PILOT_PROFILES = ("bootstrap_0.prof", "agent_0.prof")
# what a fetch brings back from a remote run (its own small files; never split/ or parts/)
FETCHED = (RESULT, PLAN, OUTCOME, REPORT, CLIENT_LOG, CLIENT_EXIT, "profile/", "radical/",
           "backend/")


# every name a run keeps in its folder: none may be a link (a write there would land
# wherever the link points; the folder may be in shared project space)
OWN_FILES = (PLAN, SELECTION, MARKER, LOCK, OUTCOME, RESERVE, OUTCOME_BEFORE, RESULT, REPORT,
             SESSIONS, CLIENT, CLIENT_LOG, CLIENT_EXIT, BATCH_SCRIPT, REMOTE)
OWN_FOLDERS = (*FOLDERS, CLAIMS, KEPT_TASK_FILES, "progress", ANALYSIS_DIR, "backend")


def owned_by_user(path, kind=stat.S_ISREG) -> bool:
    """`path` is itself (not a link) of `kind` (stat.S_ISREG, S_ISDIR) and this user's."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return kind(st.st_mode) and st.st_uid == os.getuid()


def foreign_entries(rundir):
    """The names of the run's own files and folders in `rundir` that are symbolic links,
    or not of their kind (a FIFO would hang a read, a folder at outcome.json fail its
    write): `--resume` refuses them."""
    found = []
    for names, kind in ((OWN_FILES, stat.S_ISREG), (OWN_FOLDERS, stat.S_ISDIR)):
        for name in names:
            try:
                mode = os.lstat(os.path.join(rundir, name)).st_mode
            except OSError:
                continue
            if not kind(mode):  # S_ISREG and S_ISDIR are False for a link (lstat)
                found.append(name)
    return found


def path(rundir, *parts):
    return os.path.join(rundir, *parts)


def is_run(rundir) -> bool:
    """Whether `rundir` is (or was begun as) a trajflow run."""
    return os.path.exists(path(rundir, MARKER))


def has_plan(rundir) -> bool:
    return os.path.exists(path(rundir, PLAN))


# a file created for writing: never through a link, never over a file that is there
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | \
    getattr(os, "O_CLOEXEC", 0)


def temporary_name(final):
    """A name beside `final` that nobody else can have foreseen (a run folder may be
    in shared project space: a link planted at a predictable name would be written
    through), created empty here with O_EXCL | O_NOFOLLOW so that it is ours."""
    while True:
        tmp = f"{final}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, _NEW_FILE, 0o666))  # the umask applies, as with open()
            return tmp
        except FileExistsError:
            continue


def open_in_run(file, mode="w"):
    """open() for a file of a run folder ("w", "a", "wb", "ab"): never through a link
    at its name, never blocking on a FIFO planted there (OSError for both)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode[0] == "a" else os.O_TRUNC)
    fd = os.open(file, flags | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a plain file", file)
    os.set_blocking(fd, True)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


@contextlib.contextmanager
def replaced_whole(final, tmp=None):
    """A temporary name beside `final` to write to: renamed onto `final` when the
    block ends, removed when it raises (a full disk leaves nothing half-written;
    only a killed writer leaves one, see RunPlan.partial_files). A link at `final`
    is replaced by the file, never written through (rename replaces the link)."""
    tmp = tmp or temporary_name(final)
    try:
        yield tmp
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_text(file, text, mode="w", *, user_target=False):
    """A small file (text, or bytes with mode "wb") replaced whole, never half. A
    link (or FIFO) in a run folder is replaced, never written through; a target the
    user named (`user_target`: --html FILE, /dev/stdout, a link of theirs) is written
    through, as open() would."""
    kw = {} if "b" in mode else {"encoding": "utf-8"}
    if user_target and (os.path.islink(file) or (os.path.exists(file)
                                                 and not os.path.isfile(file))):
        with open(file, mode, **kw) as fh:
            fh.write(text)
        return
    with replaced_whole(file) as tmp:
        with open(tmp, mode, **kw) as fh:
            fh.write(text)


def write_record(file, **fields):
    """A small JSON record with the time it was written, replaced whole (never half)."""
    write_text(file, json.dumps({"time": time.time(), **fields}))


def read_lines(file, most=64 << 20):
    """The lines of a small text file of a run, at most `most` bytes read, bytes that are
    not UTF-8 replaced; none where it is not a plain file (a FIFO would hang the read)
    or cannot be read."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return []
        return fh.read(most).decode("utf-8", errors="replace").splitlines()


def read_record(file, most=16 << 20):
    """A record (JSON) or None when it is not there, not whole, or not a plain file (a
    FIFO planted in a run folder would hang a read); at most `most` bytes."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return json.loads(fh.read(most + 1).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def record_outcome(rundir, status, error=None, stopped_at=None, failed_tasks=(),
                   retried_tasks=(), note=None):
    """Write RUNDIR/outcome.json atomically: status "done" or "failed", and why;
    the tasks that failed for good and those that failed once and were run again."""
    record = {"run": os.path.basename(rundir), "status": status, "ended": time.time(),
              "stopped_at": stopped_at, "error": error, "failed_tasks": list(failed_tasks),
              "retried_tasks": list(retried_tasks)}
    if note:
        record["note"] = note
    raw = read_record(path(rundir, OUTCOME))
    if _provisional(raw):  # when it was handed over and began: where its wall time went
        record.update({k: raw[k] for k in HANDOVER_TIMES if is_finite_number(raw.get(k))})
    # a resumed run keeps how its earlier attempts ended (not the provisional record)
    before = (outcome_said(rundir) and read_outcome(rundir)) or \
        _typed_record(read_record(path(rundir, OUTCOME_BEFORE))) or {}
    earlier = _history(before)
    if earlier:
        record["earlier"] = earlier
    _write_outcome_record(rundir, record)
    try:
        os.remove(path(rundir, OUTCOME_BEFORE))
    except FileNotFoundError:
        pass


def _write_outcome_record(rundir, record):
    """outcome.json, in the room kept for it when the disk (or the quota) has filled
    meanwhile: a run that failed on a full disk once ended with no outcome.json."""
    text = json.dumps(record, indent=1)
    try:
        write_text(path(rundir, OUTCOME), text)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not _write_into_room(rundir, text):
            raise
    if record["status"] == "done":
        release_room(rundir)


def remove_entry(path):
    """Remove `path`: a folder with what is in it, a file, or a link itself (never what
    a link points to); nothing if it is not there."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def keep_room(rundir):
    """RESERVE_BYTES kept in RUNDIR for its outcome.json, so that a disk filled during
    the run (by this run or another job) cannot keep the run from saying how it ended.
    Random bytes, since a compressing file system stores zeros as nothing; best
    effort: a disk full already is said by the space check before any pilot."""
    target = path(rundir, RESERVE)
    with contextlib.suppress(OSError):
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode) and st.st_size >= RESERVE_BYTES:
            return
    with contextlib.suppress(OSError):
        write_text(target, os.urandom(RESERVE_BYTES), "wb")


def _write_into_room(rundir, text) -> bool:
    """`text` written over the room's own blocks, then renamed onto outcome.json: no
    new block is needed and nothing is freed for another writer to take first."""
    data = text.encode("utf-8")
    room = path(rundir, RESERVE)
    try:
        fd = os.open(room, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError:  # gone, or a link: never written through
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size < len(data):
            return False
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(room, path(rundir, OUTCOME))
    return True


def release_room(rundir):
    """The room given back: the run has ended well (never fails the caller)."""
    with contextlib.suppress(OSError):
        os.remove(path(rundir, RESERVE))


def add_to_failure(rundir, why):
    """A failed run's outcome told what came after it was written: its pilot failed
    too (a lost node, seen: the task's MPI peers died before the batch system had
    declared the node down, so the first account could not name it)."""
    record = read_outcome(rundir)
    if not record or record.get("status") != "failed":
        return
    said = [part for part in (record.get("error") or "").split("; ") if part]
    if any(part in why or why in part for part in said):  # e.g. the lost node, named already
        return
    record["error"] = "; then ".join(filter(None, [record.get("error"), why]))
    _write_outcome_record(rundir, record)


def _history(record):
    """The attempts a record tells of, oldest first: its `earlier` ones and, if it
    failed, itself."""
    earlier = list(record.get("earlier", []))
    if record.get("status") == "failed":
        earlier.append({k: record.get(k) for k in ("ended", "stopped_at", "error", "failed_tasks")})
    return earlier


def begin_attempt(rundir):
    """A failed (or interrupted) run about to be resumed: its outcome set aside
    (record_outcome keeps it in `earlier`), so that until this attempt ends the folder
    says it has not ended, and a failure of this attempt is recorded as its own. An
    attempt killed before it said how it ended (its record provisional) is added to the
    history set aside before it, never in its place."""
    raw = read_record(path(rundir, OUTCOME))
    if not os.path.lexists(path(rundir, OUTCOME)) or (
            isinstance(raw, dict) and raw.get("status") == "done" and not _provisional(raw)):
        return
    before = _typed_record(read_record(path(rundir, OUTCOME_BEFORE)))
    if _provisional(raw) and before:  # whole over outcome.json, then set aside: one step each
        record = {**_typed_record(raw), "earlier": _history(before)}
        write_text(path(rundir, OUTCOME), json.dumps(record, indent=1))
    os.replace(path(rundir, OUTCOME), path(rundir, OUTCOME_BEFORE))


INTERRUPTED = ("interrupted: the process running it ended before it could say how the run "
               "ended (killed, or its machine lost)")


def record_handed_over(rundir):
    """outcome.json saying "failed: interrupted" from the moment a run is handed to its
    pilot, until how it ended replaces it: a client killed at any moment leaves a folder
    that says so (a Ctrl-C right after the pilot was requested once left none). While
    the process holding the run's lock lives, read_outcome reads it as not ended."""
    now = time.time()
    record = {"run": os.path.basename(rundir), "status": "failed", "ended": now,
              "stopped_at": None, "error": INTERRUPTED, "failed_tasks": [],
              "retried_tasks": [], "provisional": True, "handed_at": now}
    try:
        write_text(path(rundir, OUTCOME), json.dumps(record, indent=1))
    except OSError:  # a full disk: the space check said so; the run goes on
        pass


def record_dispatched(rundir):
    """The moment a handed-over run left its pilot's queue (it had waited there behind
    other runs), kept in its provisional record until how it ended replaces it."""
    record = read_record(path(rundir, OUTCOME))
    if not _provisional(record):
        return
    record["dispatched_at"] = time.time()
    with contextlib.suppress(OSError):
        write_text(path(rundir, OUTCOME), json.dumps(record, indent=1))


def withdraw_handover(rundir):
    """A run cancelled before it began: its provisional record taken back (and the
    failure set aside for it, if it was a resume, put back)."""
    if not _provisional(read_record(path(rundir, OUTCOME))):
        return
    with contextlib.suppress(OSError):
        if os.path.exists(path(rundir, OUTCOME_BEFORE)):
            os.replace(path(rundir, OUTCOME_BEFORE), path(rundir, OUTCOME))
        else:
            os.remove(path(rundir, OUTCOME))


def is_finite_number(value) -> bool:
    """An int or float (not a bool) that is finite as a float (a 400-digit int is not)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _provisional(record) -> bool:
    return isinstance(record, dict) and record.get("provisional") is True


def outcome_said(rundir) -> bool:
    """Whether outcome.json says how the run ended (not the provisional record)."""
    raw = read_record(path(rundir, OUTCOME))
    return isinstance(raw, dict) and not _provisional(raw)


def lock_held(rundir) -> bool:
    """Whether a process holds RUNDIR's lock (flock(2), as workflows/run/rundir_lock.py
    takes it: whichever process has inherited it, on whichever node where the file
    system's flock reaches across nodes). Where the file system has no flock, the pid
    the lock file names is asked instead."""
    import fcntl
    try:
        fd = os.open(path(rundir, LOCK), os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # released: its run said how it ended, or never began
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return _holder_pid_lives(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        # free here; but a holder on another node is not seen where flock is node-local
        # (BeeGFS, Lustre with localflock, NFS with local_lock): then its pid's word
        return _holder_pid_lives(fd) and _holder_host(fd) != _this_host()
    finally:
        os.close(fd)


def _this_host():
    import socket
    return socket.gethostname()


def lock_holder(text):
    """(host, pid) of the holder a lock file names ("host H pid P since ..."), or
    (None, None)."""
    words = text.split()
    try:
        return words[words.index("host") + 1], int(words[words.index("pid") + 1])
    except (ValueError, IndexError):
        return None, None


def _holder_host(fd):
    return lock_holder(os.pread(fd, 4096, 0).decode(errors="replace"))[0]


def _holder_pid_lives(fd) -> bool:
    host, pid = lock_holder(os.pread(fd, 4096, 0).decode(errors="replace"))
    if pid is None:
        return False
    if host != _this_host():
        return True  # cannot be asked from here
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def read_outcome(rundir):
    """The outcome.json of a run, or None while it has not ended. A record that is not
    one trajflow wrote (a folder may come from anyone) reads as a failure saying so;
    fields of the wrong type are left out."""
    record = read_record(path(rundir, OUTCOME))
    if record is None:
        return None if not os.path.lexists(path(rundir, OUTCOME)) else \
            _not_ours("it is not a whole JSON record of a plain file")
    if _provisional(record):
        remote_going = os.path.exists(path(rundir, REMOTE)) and \
            not os.path.exists(path(rundir, CLIENT_EXIT))
        if (remote_going or os.path.exists(path(rundir, RESULT))
                or os.path.exists(path(rundir, BACKEND_RESULT)) or lock_held(rundir)):
            # still going (a fetched remote run whose client has not ended: its state is
            # the cluster's to say), or its result whole before it could say
            return None
        record = read_record(path(rundir, OUTCOME))  # it may have said so meanwhile
        if record is None:
            return None
    return _typed_record(record)


def _typed_record(record):
    """An outcome record as read_outcome gives it (None stays None)."""
    if record is None:
        return None
    if not isinstance(record, dict) or record.get("status") not in ("done", "failed"):
        return _not_ours("it has no status done or failed")
    return _typed_outcome(record)


def _not_ours(why):
    return {"status": "failed", "error": f"{OUTCOME} is not one trajflow wrote ({why}): "
                                         "the folder was damaged or edited", "failed_tasks": []}


# the fields of outcome.json and what each holds (read_outcome keeps only these)
_OUTCOME_FIELDS = {"run": str, "status": str, "ended": (int, float), "time": (int, float),
                   "stopped_at": str, "error": str, "note": str, "failed_tasks": list,
                   "retried_tasks": list, "earlier": list, "handed_at": (int, float),
                   "dispatched_at": (int, float)}
# the moments before its tasks a run's outcome keeps (see wall_time.py in workflows/profile)
HANDOVER_TIMES = ("handed_at", "dispatched_at")


def _typed_outcome(record, earlier=False):
    out = {}
    for key, kind in _OUTCOME_FIELDS.items():
        value = record.get(key)
        if value is None and key in record:
            out[key] = None
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            continue
        if kind is list and key != "earlier":
            value = [v for v in value if isinstance(v, str)]
        elif key == "earlier":
            value = [_typed_outcome(e, earlier=True) for e in value if isinstance(e, dict)]
        out[key] = value
    if not earlier and out.get("failed_tasks") is None:
        out["failed_tasks"] = []
    return out


def started_marker(workdir, stage):
    """The file every task of `stage` touches as it starts: the workstation's watchdog
    (workflows/run/watchdog.py) sees by its time that the stage's first task ran."""
    return os.path.join(workdir, "progress", f"started.{stage}")


def mark_started(workdir, stage):
    """Touch started_marker; never fails a task (a full disk is reported elsewhere)."""
    path = started_marker(workdir, stage)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK
                     | getattr(os, "O_NOFOLLOW", 0), 0o666)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.utime(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def private_folder(path) -> bool:
    """Whether `path` is a folder of this user's alone (not a link, not writable by others):
    what someone else planted there (offsets, a chunk counter) would make a run read the
    wrong frames."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
