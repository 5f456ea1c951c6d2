"""Tasks mode on a dynamic schedule: blocks claimed in the run folder, and backup
copies of late blocks.

Each analyze task claims its block when it starts (the pilot starts a task
whenever a core frees, so over-decomposition, more blocks than cores, balances
by itself). When a task has finished its block and no block is left
unclaimed, it does not leave at once: if a block has run BACKUP_AFTER times
the median block time, or will at the pace its chunks have gone so far, it
analyses a backup
copy of it (at most BACKUP_SHARE of the blocks get one). The first copy to
publish the block's part wins (a hard link, which fails if the part exists);
the other stops at its next chunk. Both copies compute the same thing, so the
result is bit-identical whichever wins.

    RUNDIR/claims/block_00003          {"task", "host", "pid", "t"}: block 3 started at t
    RUNDIR/claims/block_00003.progress {"t_first", "frames", "t"}: its own copy's pace
                                       (times are each host's clock: skew between nodes
                                       shifts the judgement by as much)
    RUNDIR/claims/block_00003.done     {"seconds", "by"}: how long the block took, who won
    RUNDIR/claims/block_00003.backup   a backup copy of block 3 was started (one per block)
    RUNDIR/claims/backup_slot_00000    one of the run's backup slots (the cap)

The workstation clears claims/ before each attempt of the analyze stage
(pipeline.py), so a resumed run never reads an old attempt's claims.
"""
import json
import math
import os
import socket
import statistics
import time

from .rundir import CLAIMS, write_text
from .timing import write_progress

BACKUP_AFTER = 2.0   # a block is late once it has run this many median block times
BACKUP_SHARE = 0.10  # at most this share of the blocks get a backup copy (at least one)
PROJECT_AFTER = 0.1  # a block's pace is projected once this share of its frames is done
POLL_S = 0.1         # how soon an idle task looks again for a late block (then less often)
MAX_POLL_S = 2.0


class BlockClaims:
    """The claims of one run's blocks (RUNDIR/claims/)."""

    def __init__(self, plan, task):
        self.plan, self.task = plan, task
        self.folder = plan.path(CLAIMS)
        os.makedirs(self.folder, exist_ok=True)

    def _path(self, block, suffix=""):
        return os.path.join(self.folder, f"block_{block:05d}{suffix}")

    def _write(self, path, record, exclusive=False):
        """Write a small JSON file whole; with `exclusive`, only if it does not exist
        (False then)."""
        data = json.dumps(record).encode()
        if exclusive:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            return True
        write_text(path, data, "wb")
        return True

    def _read(self, path):
        try:
            with open(path, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def _me(self):
        return {"task": self.task, "host": socket.gethostname(), "pid": os.getpid(),
                "t": time.time()}

    # --- a block's own task ------------------------------------------------------
    def claim(self, block):
        """This task takes its block (a retry takes it again)."""
        self._write(self._path(block), self._me())

    def published(self, block):
        return os.path.exists(self.plan.block_part_path(block))

    def progressed(self, block, t_first, frames):
        """The block's own copy has done `frames` since its first chunk began at `t_first`."""
        self._write(self._path(block, ".progress"), {"t_first": t_first, "frames": frames,
                                                      "t": time.time()})

    def finished(self, block, seconds):
        """The copy that published says how long the block took (the median's data)."""
        self._write(self._path(block, ".done"), {"seconds": seconds, "by": self.task})

    def whole_progress(self, block, frames):
        """A backup copy published the block: its progress (the progress bar's) is whole."""
        write_progress(self.plan.progress_path(block), frames)

    # --- an idle task ------------------------------------------------------------
    def next_backup(self):
        """The block to copy, or None when there is nothing (more) worth copying.
        Waits while a block may still become late (POLL_S, then longer: the file
        system's metadata server serves every idle task); returns at once when a
        block is unclaimed (its task waits for this core)."""
        n = self.plan.n_blocks
        cap = max(1, math.ceil(BACKUP_SHARE * n))
        parts_dir = os.path.dirname(self.plan.block_part_path(0))
        names = {os.path.basename(self.plan.block_part_path(b)): b for b in range(n)}
        published, pause = set(), POLL_S
        while True:
            # one listing of parts/ and of claims/ a look; a published block stays so
            published |= {names[f] for f in _listing(parts_dir) if f in names}
            missing = [b for b in range(n) if b not in published]
            if not missing:
                return None
            here = _listing(self.folder)
            if any(f"block_{b:05d}" not in here for b in missing):
                return None
            uncopied = [b for b in missing if f"block_{b:05d}.backup" not in here]
            if not uncopied or sum(f.startswith("backup_slot_") for f in here) >= cap:
                return None
            done = [d["seconds"] for d in (self._read(os.path.join(self.folder, f)) for f in here
                                           if f.endswith(".done")) if d]
            if done:
                median = statistics.median(done)
                late = sorted(((self._expected_s(b), b) for b in uncopied), reverse=True)
                for expected, b in late:
                    if expected < BACKUP_AFTER * median:
                        break
                    if self._take_backup(b, cap):
                        return b
            time.sleep(pause)
            pause = min(MAX_POLL_S, pause * 1.5)

    def _expected_s(self, block):
        """How long the block's own copy will have taken, counted from where the
        median's are (the copy's start, after its set-up): what it has run, or, once
        it has done PROJECT_AFTER of its frames, what it will run at its pace so far
        (a task at a quarter of a core is known to be late after a few chunks, not only
        after twice the median). Before its copy starts: since its claim."""
        now = time.time()
        progress = self._read(self._path(block, ".progress"))
        if not progress:
            claim = self._read(self._path(block))
            return now - claim["t"] if claim else 0.0
        elapsed = now - progress["t_first"]
        start, stop = self.plan.blocks[block]
        if progress["frames"] >= PROJECT_AFTER * (stop - start):
            pace = (progress["t"] - progress["t_first"]) / progress["frames"]
            return max(elapsed, elapsed + pace * (stop - start - progress["frames"]))
        return elapsed

    def _take_backup(self, block, cap):
        """One backup slot and the block's backup mark, both or neither."""
        for slot in range(cap):
            path = os.path.join(self.folder, f"backup_slot_{slot:05d}")
            if self._write(path, {**self._me(), "block": block}, exclusive=True):
                if self._write(self._path(block, ".backup"), self._me(), exclusive=True):
                    return True
                os.remove(path)  # another task copies this block: the slot is free again
                return False
        return False


def _listing(folder):
    try:
        return set(os.listdir(folder))
    except FileNotFoundError:
        return set()
