"""How an analyze task's ranks (MPI) or tasks (tasks mode) share the run's frames:
one object per `schedule`.

    static:  rank r analyses block r, task b block b: the balanced blocks of the
             papers (Khoshlessan et al. 2019); a slow rank sets the stage's end.
    dynamic: every block is cut into chunks. MPI ranks take the next chunk from
             a shared counter (work sharing without a master loop), so a slow
             rank simply does fewer: on one node an atomic add in an MPI
             shared-memory window, across nodes MPI_Rget_accumulate on rank 0.
             Tasks claim their blocks and, when idle, copy a late block
             (block_claims.py).

Either way a rank gets `Chunk`s (a span of the run's frames inside one block)
and the gather joins every rank's chunks back in chunk order (analyze.py): a
built-in analysis' result is the same bit for bit; a user's analysis merges
more pieces with its class' aggregator (equal to float rounding). Adding a
schedule is one class registered in SCHEDULES.
"""
import contextlib
import os
import stat
import sys
import threading
import time
from typing import Dict, Iterator, List, NamedTuple

import numpy as np

from . import faults
from .exit_codes import COLLECTIVE_TIMEOUT
from .fast_exit import abort_mpi_job


class Chunk(NamedTuple):
    """Positions [start, stop) of the run's frames, all inside block `block`;
    `id` orders the chunks as the frames are ordered."""
    id: int
    block: int
    start: int
    stop: int


class Schedule:
    name = ""
    help = ""
    one_chunk_per_rank = False   # MPI: a rank analyses one chunk, its block
    copies_late_blocks = False   # tasks mode: claim blocks, copy late ones (block_claims.py)

    def chunks(self, plan) -> List[Chunk]:
        """Every chunk of the run, in frame order (id = index)."""
        raise NotImplementedError

    def block_chunks(self, plan, block) -> List[Chunk]:
        """The chunks of one block, in frame order."""
        return [c for c in self.chunks(plan) if c.block == block]

    @contextlib.contextmanager
    def claims(self, comm, chunks: List[Chunk], timer, timeout_s,
               counter=None) -> Iterator[Iterator[Chunk]]:
        """The chunks this rank analyses, as it should take them. The context ends
        after every rank has left its loop (the caller's barrier is inside it); a
        claim not answered within `timeout_s` aborts the job. `counter`: the claims'
        counter where the caller made it (before MPI_Init: LaunchCounter)."""
        raise NotImplementedError


class Static(Schedule):
    name = "static"
    help = "rank r analyses block r, task b block b (balanced blocks, the papers' method)"
    one_chunk_per_rank = True

    def chunks(self, plan):
        return [Chunk(b, b, start, stop) for b, (start, stop) in enumerate(plan.blocks)]

    @contextlib.contextmanager
    def claims(self, comm, chunks, timer, timeout_s, counter=None):
        yield iter([chunks[comm.Get_rank()]])


# A dynamic run cuts each block into at most this many chunks (fewer when a chunk would
# hold fewer than MIN_CHUNK_FRAMES frames): with 2 ranks, 64 chunks leave a rank at a
# quarter of the others' speed at most one of its chunks (1/16 of the run's work at its
# speed) behind at the end; each chunk costs a claim (0.2 us in shared memory; across
# nodes a round trip hidden behind the work, see RemoteCounter), a seek and a kernel call.
CHUNKS_PER_BLOCK = 32
MIN_CHUNK_FRAMES = 4


def chunks_in_block(frames):
    """How many chunks a dynamic run cuts a block of `frames` frames into."""
    return max(1, min(CHUNKS_PER_BLOCK, int(frames) // MIN_CHUNK_FRAMES))


class Dynamic(Schedule):
    name = "dynamic"
    help = ("MPI ranks take small chunks of frames from a shared counter, so a slow rank "
            "does fewer; an idle task runs a backup copy of a late block, the first copy "
            "to finish wins")
    copies_late_blocks = True

    def chunks(self, plan):
        out = []
        for b, (start, stop) in enumerate(plan.blocks):
            n = chunks_in_block(stop - start)
            edges = np.linspace(start, stop, n + 1).round().astype(int)
            out += [Chunk(len(out) + i, b, int(lo), int(hi))
                    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]
        return out

    @staticmethod
    def claim_order(chunks):
        """The blocks' chunks in turn (chunk i of every block, then i + 1), so that
        ranks starting together begin in different blocks (a split segment or a
        region of the file each) and mostly stay there."""
        by_block = {}
        for chunk in chunks:
            by_block.setdefault(chunk.block, []).append(chunk)
        longest = max(map(len, by_block.values()))
        return [c[i] for i in range(longest) for c in by_block.values() if i < len(c)]

    @contextlib.contextmanager
    def claims(self, comm, chunks, timer, timeout_s, counter=None):
        if counter is None:
            with timer.phase("setup"):
                counter = claim_counter(comm, timeout_s)
        try:
            size = comm.Get_size() if comm is not None else None  # for a remote counter only
            yield self._claimed(counter, size, self.claim_order(chunks), timer)
        except BaseException:
            counter.abandon()  # the task aborts: no collective call that would wait
            raise
        with timer.phase("finalize"):
            counter.close()

    @staticmethod
    def _claimed(counter, size, ordered, timer):
        n = len(ordered)
        pending = counter.claim()
        while True:
            with timer.phase("claim"):  # a remote claim was mostly made during the last chunk
                k = pending.wait()
            if k >= n:
                return
            # a remote counter: far from the end, claim the next chunk before analysing
            # this one (the round trip is hidden behind the work); near it, claim after,
            # so that a slow rank holds no chunk it would start late
            ahead = counter.round_trip and n - k > 2 * size
            pending = counter.claim() if ahead else None
            yield ordered[k]
            if pending is None:
                pending = counter.claim()


def claim_counter(comm, timeout_s):
    """The counter the ranks claim chunks from: in shared memory when they all share
    a node, else in an MPI window on rank 0 (a claim unanswered for `timeout_s`
    aborts the job)."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == comm.Get_size()
    node.Free()
    if one_node and not faults.remote_counter_forced():
        return SharedMemoryCounter(comm)
    return RemoteCounter(comm, timeout_s)


class _Claimed:
    """A claim made at once (shared memory)."""

    def __init__(self, value):
        self.value = value

    def wait(self) -> int:
        return self.value


class SharedMemoryCounter:
    """The counter in an MPI shared-memory window (every rank on one node): a claim
    is one atomic add by the claiming rank itself (kernels.atomic_fetch_add, ~0.2 us),
    so no rank waits for another, however slow or stopped that one is."""
    round_trip = False

    def __init__(self, comm):
        from mpi4py import MPI
        from . import kernels
        self.fetch_add = kernels.atomic_fetch_add
        rank = comm.Get_rank()
        self.win = MPI.Win.Allocate_shared(8 if rank == 0 else 0, 8, comm=comm)
        memory, _ = self.win.Shared_query(0)
        self.counter = np.frombuffer(memory, dtype=np.int64)
        if rank == 0:
            self.counter[0] = 0
        comm.Barrier()  # zeroed before anyone claims

    def claim(self):
        return _Claimed(self.fetch_add(self.counter, 1))

    def close(self):
        """Collective, after every rank's last claim (the caller's barrier)."""
        self.counter = None  # the window's memory goes with it
        self.win.Free()

    def abandon(self):
        pass


class CounterUnavailable(Exception):
    """The launch's counter cannot be made here (the folder is not this user's alone):
    the ranks initialise MPI first instead."""


class LaunchCounter:
    """The counter before MPI_Init, for ranks that all share one node: an int64 in a
    file of 8 bytes in this user's private folder in /dev/shm, named by the run and the
    launch (launch_env.py), mapped into each rank; a claim is the same atomic add as in
    SharedMemoryCounter. So a rank claims its first chunk as soon as it starts, not
    after the last rank of the launch has (MPI_Init waits for it). After MPI_Init the
    ranks check that they shared one file and that their claims cover every chunk once
    (analyze.py); rank 0 removes the file after the barrier."""
    round_trip = False
    FOLDER = "/dev/shm"
    STALE_S = 7 * 86400  # a counter left by a job that aborted, removed by the next run

    def __init__(self, launch, run_folder, rank):
        import hashlib
        import mmap
        from . import kernels
        from .rundir import private_folder
        self.fetch_add, self.rank = kernels.atomic_fetch_add, rank
        folder = os.path.join(self.FOLDER, f"trajflow-{os.getuid()}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not private_folder(folder):
            raise CounterUnavailable(f"{folder} is not this user's own folder")
        key = hashlib.sha256(f"{os.path.realpath(run_folder)}\0{launch.id}".encode()).hexdigest()
        self.path = os.path.join(folder, f"claims-{key[:32]}")
        # never this launch's own: a rank that registered and died before this one came
        # must stay there to be seen gone (ranks_gone)
        _remove_stale_counters(folder, self.STALE_S, keep=os.path.basename(self.path))
        size = 8 * (1 + launch.size)  # the counter, then each rank's pid
        _create_once(self.path, bytes(size))
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != size:
                raise CounterUnavailable(f"{self.path} is not a chunk counter of this user's")
            self.memory = mmap.mmap(fd, size)
            self.identity = (st.st_dev, st.st_ino)  # the ranks compare it after MPI_Init
        finally:
            os.close(fd)
        words = np.frombuffer(self.memory, dtype=np.int64)
        self.counter, self.pids = words[:1], words[1:]
        self.pids[rank] = os.getpid()  # so the others can tell this rank died before MPI_Init

    def ranks_gone(self):
        """The ranks that started, claimed, and ended before MPI_Init (a crash, a kill):
        the others would wait for them in MPI_Init, which some launchers (a rank under
        a shell of its own) do not end."""
        return [rank for rank, pid in enumerate(self.pids) if pid and not _alive(int(pid))]

    def claim(self):
        return _Claimed(self.fetch_add(self.counter, 1))

    def exhaust(self, n_chunks):
        """No chunk left to claim: this rank failed, the others stop at their next claim."""
        self.fetch_add(self.counter, n_chunks)

    def close(self):
        """After every rank's last claim (the caller's barrier)."""
        self.counter = self.pids = None
        self.memory.close()
        if self.rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def abandon(self):
        pass


def _alive(pid):
    """Whether a process runs (a zombie, ended and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _remove_stale_counters(folder, older_than_s, keep):
    """Counters left by jobs that aborted before their rank 0 removed them, but `keep`:
    every rank that registered has ended, or (a half-made one) untouched for
    `older_than_s`."""
    now = time.time()
    for name in os.listdir(folder):
        if not name.startswith("claims-") or name == keep:
            continue
        path = os.path.join(folder, name)
        with contextlib.suppress(FileNotFoundError, ValueError):
            if now - os.lstat(path).st_mtime > older_than_s or _all_ranks_ended(path):
                os.unlink(path)


def _all_ranks_ended(path):
    """Whether a counter's registered ranks (its pids after the count) have all ended."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        words = np.frombuffer(fh.read(1 << 20), dtype=np.int64)
    pids = [int(pid) for pid in words[1:] if pid > 0]
    return bool(pids) and not any(map(_alive, pids))


def _create_once(path, content):
    """`path` with `content`, created whole by the first of several processes (a full
    file linked into place); the others find it there."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, content)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


class _Claim:
    """One outstanding fetch-and-add on a remote counter."""

    def __init__(self, request, result, timeout_s):
        self.request, self.result, self.timeout_s = request, result, timeout_s

    def wait(self) -> int:
        """The chunk claimed. A rank 0 that stopped answering (hung, or its node lost)
        must not leave this rank waiting until the walltime: past `timeout_s` the job
        is aborted, as at the gather's barrier."""
        from mpi4py import MPI
        t0 = time.time()
        while not self.request.Test():
            waited = time.time() - t0
            if waited > self.timeout_s:
                print(f"analyze rank {MPI.COMM_WORLD.Get_rank()}: rank 0 did not answer a "
                      f"claim for a chunk within {self.timeout_s:.0f} s; aborting the job",
                      file=sys.stderr, flush=True)
                abort_mpi_job(COLLECTIVE_TIMEOUT)
            if waited > 0.005:  # answered at once, as a rule; else do not hold a core
                time.sleep(0.0002)
        return int(self.result[0])


class RemoteCounter:
    """The counter in an MPI window on rank 0, for ranks on several nodes.

    A claim is MPI_Rget_accumulate(+1, SUM): the old value is the chunk claimed.
    Passive-target RMA needs the target to make MPI progress unless the network
    does the atomic itself (InfiniBand, Slingshot); over TCP and shared memory
    MPICH waits for rank 0's next MPI call (a claim waited 1.9 s while rank 0
    computed, measured). So rank 0 runs a thread that pokes MPI's progress
    engine every POKE_S (`MPI_Iprobe`) while the window is open: a claim then
    takes 1-5 ms, and is made while the previous chunk is analysed. The thread
    needs MPI_THREAD_MULTIPLE (mpi4py asks for it; an MPI without it is named on
    stderr, and claims then wait for rank 0's chunks). A rank 0 that is itself
    throttled pokes late, and the others' claims wait for it.
    """
    POKE_S = 0.0005
    round_trip = True

    def __init__(self, comm, timeout_s):
        from mpi4py import MPI
        self.MPI, self.comm, self.timeout_s = MPI, comm, timeout_s
        rank = comm.Get_rank()
        self.buffer = np.zeros(1, dtype=np.int64)
        self.win = MPI.Win.Create(self.buffer if rank == 0 else None, disp_unit=8, comm=comm)
        self.win.Lock_all()
        self.one = np.ones(1, dtype=np.int64)
        self.poking = None
        if rank != 0:
            return
        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            print("analyze: this MPI gives no MPI_THREAD_MULTIPLE: the other ranks' claims of "
                  "chunks wait for rank 0's own (--schedule static avoids the wait)",
                  file=sys.stderr, flush=True)
            return
        self.stop = threading.Event()
        self.poking = threading.Thread(target=self._poke, name="trajflow-mpi-progress",
                                       daemon=True)
        self.poking.start()

    def _poke(self):
        while not self.stop.wait(self.POKE_S):
            self.comm.Iprobe(self.MPI.ANY_SOURCE, _NO_TAG)

    def claim(self) -> _Claim:
        result = np.zeros(1, dtype=np.int64)
        request = self.win.Rget_accumulate(self.one, result, 0, op=self.MPI.SUM)
        return _Claim(request, result, self.timeout_s)

    def close(self):
        """Collective, after every rank's last claim (the caller's barrier)."""
        self.win.Unlock_all()
        self.abandon()
        self.win.Free()

    def abandon(self):
        """Stop poking (the window is left to MPI_Abort)."""
        if self.poking is not None:
            self.stop.set()
            self.poking.join()
            self.poking = None


_NO_TAG = 32000  # a tag no message of trajflow's uses: the probe only drives progress


SCHEDULES: Dict[str, Schedule] = {s.name: s for s in (Static(), Dynamic())}
