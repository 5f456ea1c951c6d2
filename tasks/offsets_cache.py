"""MDAnalysis' XTC/TRR frame offsets kept in trajflow's cache when they cannot be kept
beside the trajectory.

MDAnalysis stores where each frame of an XTC or TRR file starts in
`.NAME_offsets.npz` beside the file, behind a lock file there. In a dataset
folder someone else owns (read-only, or a group's project space) it cannot
write either, and falls back to scanning the whole file on every open: every
rank and task of a run, and the planning, each read the whole trajectory's
headers once more (seconds to minutes for a large file). On a file system
mounted without locks (Lustre's `noflock`) its lock raises and the Universe
cannot be opened at all. Here the offsets go to trajflow's cache instead
(`$TRAJFLOW_CACHE/offsets`, default `~/.cache/trajflow/offsets`), under a name
made from the file's real path, size and times, in MDAnalysis' own format, and
are checked as MDAnalysis checks its own (size, ctime, atoms) before use. The
planning computes them once; the tasks (on nodes that share the home folder)
read them. Where the offsets can live beside the file, MDAnalysis does as it
always does. The cache holds arrays only (numpy without pickle).
"""
import errno
import hashlib
import logging
import os
import tempfile
import warnings
import zipfile

import numpy as np

from .rundir import private_folder

log = logging.getLogger(__name__)

NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)  # flock refused


def cache_root() -> str:
    """trajflow's cache: $TRAJFLOW_CACHE, else $XDG_CACHE_HOME/trajflow or ~/.cache/trajflow."""
    return os.environ.get("TRAJFLOW_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trajflow")


def beside(filename) -> str:
    """MDAnalysis' own offsets file for `filename` (XDR.offsets_filename)."""
    head, tail = os.path.split(filename)
    return os.path.join(head, f".{tail}_offsets.npz")


def cached(filename, st=None) -> str:
    """The cache's offsets file for `filename` as it is now (or as `st`, its os.stat, says)."""
    st = st or os.stat(filename)
    key = f"{os.path.realpath(filename)}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    return os.path.join(cache_root(), "offsets", hashlib.sha256(key.encode()).hexdigest() + ".npz")


def valid_offsets(path, filename, n_atoms):
    """The offsets in `path` if they are `filename`'s as it is (MDAnalysis' checks), else None."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if (float(data["ctime"]) == os.path.getctime(filename)
                    and int(data["size"]) == os.path.getsize(filename)
                    and int(data["n_atoms"]) == n_atoms):
                return np.asarray(data["offsets"], dtype=np.int64)
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        pass  # none, another file's, or one being written
    return None


def store(filename, n_atoms, offsets, scanned):
    """Write `filename`'s offsets into the cache, stamped with `scanned` (its os.stat from
    before the scan), unless the file changed while it was scanned (a simulation still
    writing it). A private folder; a new file renamed into place, so a reader never sees
    half of one. Failing to cache is not an error."""
    now = os.stat(filename)
    if (now.st_size, now.st_mtime_ns, now.st_ctime_ns) != \
            (scanned.st_size, scanned.st_mtime_ns, scanned.st_ctime_ns):
        log.info("%s changed while its offsets were read: not cached", filename)
        return
    path = cached(filename, scanned)
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not private_folder(folder):
            log.warning("%s is not a folder of yours alone: offsets not cached there", folder)
            return
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, offsets=np.asarray(offsets, dtype=np.int64),
                         size=scanned.st_size, ctime=scanned.st_ctime,
                         n_atoms=n_atoms)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.info("offsets of %s not cached (%s): each open scans the file", filename, exc)


def lookup(filename, n_atoms):
    """`filename`'s offsets from beside it or from the cache, or None."""
    mine = cached(filename)
    for path in [beside(filename)] + ([mine] if private_folder(os.path.dirname(mine)) else []):
        offsets = valid_offsets(path, filename, n_atoms)
        if offsets is not None:
            return offsets
    return None


def _writable_beside(filename) -> bool:
    """Whether MDAnalysis can keep the offsets beside `filename`: its folder writable, and
    the lock and offsets files there, if any, too (a group's folder where another member
    made them: MDAnalysis then rescans on every open)."""
    if not os.access(os.path.dirname(os.path.abspath(filename)), os.W_OK):
        return False
    head, tail = os.path.split(os.path.abspath(filename))
    return all(os.access(p, os.W_OK) for p in (os.path.join(head, f".{tail}_offsets.lock"),
                                                beside(filename)) if os.path.exists(p))


def keep_offsets_in_cache():
    """Make MDAnalysis' XTC/TRR readers keep their offsets in trajflow's cache where the
    trajectory's folder cannot hold them (read-only) or cannot be locked. Idempotent;
    a later MDAnalysis without the hook it replaces is left as it is."""
    try:
        from MDAnalysis.coordinates.XDR import XDRBaseReader
    except ImportError:
        return
    own = XDRBaseReader.__dict__.get("_load_offsets")
    if own is None or getattr(own, "trajflow", False):
        return

    def _load_offsets(self):
        if _writable_beside(self.filename):
            try:
                return own(self)
            except OSError as exc:
                if exc.errno not in NO_LOCKS:
                    raise  # anything but a file system without locks
                log.info("%s: its folder cannot be locked (%s); offsets kept in trajflow's "
                         "cache", self.filename, exc)
        n_atoms = self._xdr.n_atoms
        offsets = lookup(self.filename, n_atoms)
        if offsets is None:
            scanned = os.stat(self.filename)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                offsets = np.asarray(self._xdr.offsets, dtype=np.int64)  # one scan
            store(self.filename, n_atoms, offsets, scanned)
        self._xdr.set_offsets(offsets)

    _load_offsets.trajflow, _load_offsets.original = True, own
    XDRBaseReader._load_offsets = _load_offsets
