"""The analyze task: chunks of frames per process, then gather (MPI) or hand over (tasks).

  MPI mode:   mpiexec -n N python -m trajflow.tasks.analyze --plan PLAN
              each rank analyses the chunks its schedule gives it (schedules.py:
              block r on a static schedule; chunks claimed from a shared counter on a
              dynamic one); the rows reach the rank that analysed the most frames by
              Gatherv or by one-sided puts into an MPI window (Khoshlessan et al.
              2019's Global Arrays), are put back in chunk order there, and it writes
              one part file, then publishes result.h5 from it as the reduce task would
              (reduce.publish: no reduce stage follows an MPI analyze).
  tasks mode: python -m trajflow.tasks.analyze --plan PLAN --block B
              writes that block's part file (on a dynamic schedule, first claiming
              it and, when idle, copying a late block: block_claims.py); the reduce
              task joins them.

A frame's way: reader -> kernel (analyses.py) -> gather -> part -> reduce.
"""
import argparse
import os
import signal
import sys
import time
import traceback

import numpy as np

from . import faults, kernels, mda_analyses, parts, reduce
from .exit_codes import ANALYSIS_RAISED, COLLECTIVE_TIMEOUT
from .fast_exit import abort_mpi_job
from .modes import MpiMode, TasksMode
from .analyses import ANALYSIS_CLASSES
from .plan import RunPlan, chunk_size, decode_path_arg
from .rundir import mark_started
from .block_claims import BlockClaims
from .cpu_neighbours import CpuNeighbours
from .launch_env import MPI_INIT_FIRST, this_launch
from .schedules import Chunk, CounterUnavailable, LaunchCounter
from .dcd import open_dcd
from .xtc import xtc_readable
from .h5md import COLLECTIVE, is_h5md
from .readers import SelectedFrames, open_block_reader
from .timing import MPI_INIT_PART, RankTimer


class FrameSources:
    """The readers one task's chunks come from, each opened once (a rank of a dynamic
    schedule analyses chunks of several blocks).

    A chunk of block b is read from b's files as the plan's io strategy says;
    a run of chosen frames reads them from the inputs by number
    (SelectedFrames), or from trajflow's copies, which hold just those frames.
    The reference is frame 0 of the trajectory, as MDAnalysis' references are,
    whatever frames the run analyses.
    """

    def __init__(self, plan, analysis, timer, comm=None):
        self.plan, self.timer = plan, timer
        self.idx, self.boxes = analysis.atom_indices, analysis.need_boxes
        self.comm = comm if plan.io_strategy.one_file else None
        self.readers = {}
        self.chosen = plan.frame_selection is not None
        self.selected = None
        # collective MPI-IO reads where every rank reads one file in spans whose number it
        # can say ahead (chosen frames are read sparsely, and from two files: independent)
        self.collective = (plan.mpi_reads == COLLECTIVE and self.comm is not None
                           and not self.chosen)
        self.agreed_reads = None
        # a file every rank reads is opened by all at once (MPI-IO opens collectively)
        self.reference()
        if self.comm is not None:
            self.span(Chunk(0, 0, *plan.blocks[0]))

    def _reader(self, files, frame_offset):
        key = (tuple(files), frame_offset)
        if key not in self.readers:
            self.readers[key] = open_block_reader(
                files, self.idx, self.boxes, self.timer, self.comm, frame_offset=frame_offset,
                collective=self.collective, keywords=self.plan.reader_keywords(files))
        return self.readers[key]

    def span(self, chunk):
        """(source, start, stop): the chunk's frames are [start, stop) of `source`."""
        plan = self.plan
        if self.chosen and plan.io_strategy.reads_input_as_is(plan):
            if self.selected is None:
                self.selected = SelectedFrames(self._reader(plan.trajectories, 0),
                                               plan.frame_numbers())
            return self.selected, chunk.start, chunk.stop
        files, first = plan.io_strategy.block_files(plan, chunk.block)
        b_start = plan.blocks[chunk.block][0]
        shift = first - b_start  # the block's first frame is `first` of its files
        return self._reader(files, -shift), chunk.start + shift, chunk.stop + shift

    def reference(self):
        """A source whose frame 0 is the trajectory's frame 0."""
        if self.chosen:
            return self._reader(self.plan.trajectories, 0)
        return self._reader(self.plan.io_strategy.block_files(self.plan, 0)[0], 0)

    def agree_on_collective_reads(self, chunk, frames_per_chunk):
        """Collective MPI-IO reads: before its first chunk, every rank says how many reads
        of the positions it will have made after `chunk`, and all take the most. This is
        agreed ahead because a rank that finished early and then waited in any other
        collective call would hang the others, still in their last reads."""
        if not self.collective:
            return
        from mpi4py import MPI
        source, start, stop = self.span(chunk)
        h5 = getattr(source, "h5", None)
        if h5 is None or not h5.collective:  # not H5MD, or h5py without MPI: the same on all
            self.collective = False
            return
        mine = h5.position_reads + -(-(stop - start) // frames_per_chunk)
        self.agreed_reads = self.comm.allreduce(mine, op=MPI.MAX)

    def even_up_collective_reads(self):
        """After its chunks, a rank with fewer reads than agreed pads (no other call)."""
        if not self.collective:
            return
        for reader in self.readers.values():
            reader.h5.pad_collective(self.agreed_reads)
            self.timer.info["h5md_mpio_mode"] = reader.h5.mpio_mode
            if reader.h5.position_reads != self.agreed_reads:
                raise RuntimeError(f"collective MPI-IO reads: this rank made "
                                   f"{reader.h5.position_reads}, {self.agreed_reads} were agreed")

    def close(self):
        for reader in self.readers.values():
            reader.close()


class BuiltinChunks:
    """A built-in analysis (analyses.py) over chunks: `analyze(chunk)` -> its arrays."""

    def __init__(self, plan, timer, comm=None):
        self.plan, self.timer = plan, timer
        with timer.phase("open_topology"):  # the atoms, resolved on the workstation
            selected = plan.load_selection()
        self.analysis = ANALYSIS_CLASSES[plan.analysis](selected, plan.selection, plan.repeat)
        self.sources = FrameSources(plan, self.analysis, timer, comm)
        with timer.phase("io"):  # frame 0, the reference
            self.analysis.prepare(self.sources.reference())
        self.frames_per_chunk = chunk_size(plan.chunk_frames, len(self.analysis.atom_indices))

    def analyze(self, chunk):
        with self.timer.phase("compute"):  # what the reads and the kernel leave of it
            return self._analyze(chunk)

    def _analyze(self, chunk):
        plan = self.plan
        source, start, stop = self.sources.span(chunk)
        arrays = self.analysis.run_block(source, start, stop, self.frames_per_chunk, self.timer)
        expected = plan.frame_numbers(chunk.start, chunk.stop)
        if plan.frame_selection is not None and not plan.io_strategy.reads_input_as_is(plan):
            arrays["frame"] = expected  # a copy of chosen frames counts its rows, not frames
        elif not np.array_equal(arrays["frame"], expected):  # reduce checks them again
            raise RuntimeError(f"block {chunk.block}: the reader gave frames "
                               f"{arrays['frame'][:3]}... where the plan has {expected[:3]}...")
        return arrays

    def attrs(self):
        return self.analysis.attrs()

    def agree_on_collective_reads(self, chunk):
        self.sources.agree_on_collective_reads(chunk, self.frames_per_chunk)

    def even_up_collective_reads(self):
        self.sources.even_up_collective_reads()

    def close(self):
        self.sources.close()


def chunk_analysis(plan, timer, comm=None, one_chunk=True):
    """The object that analyses this task's chunks (`one_chunk`: just one): trajflow's
    kernels for a built-in analysis, MDAnalysis' own machinery for a user's."""
    with timer.phase("setup"):  # what its open and io phases leave of it
        if not plan.builtin:
            return mda_analyses.UserChunks(plan, timer, one_chunk)
        return BuiltinChunks(plan, timer, comm)


def analyze_chunks(work, claims, timer):
    """Analyse the chunks as they are claimed; each chunk's arrays, by chunk id,
    and its span and times in the rank's record (`chunks`: id, block, first and
    last position + 1, start and end time)."""
    pieces = []
    record = timer.info.setdefault("chunks", [])
    timer.info.setdefault("frames", 0)  # a rank that claimed no chunk analysed none
    for chunk in claims:
        t0 = time.time()
        pieces.append((chunk.id, work.analyze(chunk)))
        record.append([chunk.id, chunk.block, chunk.start, chunk.stop, t0, time.time()])
    return pieces


def join_pieces(pieces, layout):
    """One rank's chunks as one array per key (in the order analysed), and the rows
    each chunk has in each (for putting them back in chunk order after the gather).
    `layout`: {key: (dtype, row shape)} every rank agreed on (a rank may have no chunk)."""
    arrays = {key: np.concatenate([p[key] for _, p in pieces]) if pieces
              else np.empty((0,) + shape, dtype=dtype) for key, (dtype, shape) in layout.items()}
    rows = [(chunk_id, {key: len(p[key]) for key in layout}) for chunk_id, p in pieces]
    return arrays, rows


def agreed_layout_of(pieces):
    """{key: (dtype, row shape)} of one rank's arrays; None if it analysed no chunk."""
    return {k: (v.dtype, v.shape[1:]) for k, v in pieces[0][1].items()} if pieces else None


def agreed_layout(comm, pieces):
    """The arrays' layout, from any rank that analysed a chunk."""
    return next(layout for layout in comm.allgather(agreed_layout_of(pieces))
                if layout is not None)


def chunk_order(rows_by_rank):
    """The gather's root: where each chunk's rows lie in the gathered arrays (every rank's
    rows, rank after rank, each rank's chunks in the order it analysed them), as
    {key: [(start, stop)]} in chunk order, i.e. frame order; None if they are in order
    already. The part is written in that order straight from the gathered arrays, with no
    reordered copy (a dynamic run's 67 MB of dihedral features took 0.13 s to copy)."""
    ids = [chunk_id for rows in rows_by_rank for chunk_id, _ in rows]
    if ids == sorted(ids):  # static blocks, or chunks that fell in order
        return None
    keys = rows_by_rank[next(i for i, rows in enumerate(rows_by_rank) if rows)][0][1]
    order = {}
    for key in keys:
        spans, offset = [], 0
        for rows in rows_by_rank:
            for chunk_id, counts in rows:
                spans.append((chunk_id, offset, offset + counts[key]))
                offset += counts[key]
        order[key] = [(start, stop) for _, start, stop in sorted(spans)]
    return order


def analyze_block(plan, block, timer, comm=None):
    """Run the analysis over one whole block; returns (arrays, attrs)."""
    faults.maybe_fail(plan.workdir, block)
    work = chunk_analysis(plan, timer, comm)
    pieces = analyze_chunks(work, [Chunk(block, block, *plan.blocks[block])], timer)
    with timer.phase("finalize"):
        work.close()
    return pieces[0][1], work.attrs()


def part_attrs(plan, analysis_attrs, blocks):
    return {**analysis_attrs, "blocks": [list(plan.blocks[b]) for b in blocks],
            "block_ids": list(blocks), "input_checksum": plan.input_checksum,
            "n_frames_total": plan.n_frames}


def check_inputs(plan, setup_marks):
    """The io strategy's check of the inputs against the plan (shared io: their size and
    modification time), timed as the set-up part "inputs"."""
    setup_marks.append(("inputs", time.time()))
    plan.io_strategy.check_before_analysing(plan)


def run_tasks_mode(plan, block, setup_marks=None):
    setup_marks = list(setup_marks or [])
    check_inputs(plan, setup_marks)
    timer = RankTimer("analyze", rank=0, size=1, block=block, mode=TasksMode.name, setup_marks=setup_marks,
                      schedule=plan.schedule, progress_path=plan.progress_path(block),
                      neighbours=CpuNeighbours.for_rank(0, plan.workdir))
    faults.maybe_slow_down(block)
    if plan.schedule_strategy.copies_late_blocks:
        run_claimed_blocks(plan, block, timer)
    else:
        arrays, attrs = analyze_block(plan, block, timer)
        # tasks mode hands its block to reduce through a part file: its "gather"
        with timer.phase("comm"):
            parts.write_part(plan.block_part_path(block), arrays,
                             part_attrs(plan, attrs, [block]))
    timer.finish(plan.profile_path(f"analyze.block_{block:05d}"))


def run_claimed_blocks(plan, block, timer):
    """Tasks mode, dynamic: claim the block, analyse it chunk by chunk until it is
    published (by this task, or by a backup copy elsewhere), then analyse backup
    copies of late blocks while there are any (block_claims.py). A backup is extra
    work: its failure is recorded, never the task's."""
    claims = BlockClaims(plan, task=f"analyze.block_{block:05d}")
    runs = timer.info.setdefault("block_copies", [])
    part = plan.block_part_path(block)
    if parts.is_whole(part):  # a retry of a block a backup copy has published
        timer.frames_done = _block_frames(plan, block)
        return
    if os.path.exists(part):  # damaged since (reduce said so): --resume analyses it again
        os.remove(part)
    claims.claim(block)
    faults.maybe_fail(plan.workdir, block)
    work = chunk_analysis(plan, timer, one_chunk=False)
    runs.append(publish_block_copy(plan, work, block, claims, timer, backup=False))
    # the block is done, by this copy or another: its progress is whole
    timer.frames_done = _block_frames(plan, block)
    timer.counting = False  # a backup's frames are its block's, counted for that block
    while True:
        with timer.phase("wait"):  # idle: looking for a late block
            late = claims.next_backup()
        if late is None:
            break
        try:
            runs.append(publish_block_copy(plan, work, late, claims, timer, backup=True))
        except Exception as exc:  # noqa: BLE001 - the block's own task still runs it
            runs.append({"block": late, "backup": True, "won": False,
                         "error": f"{type(exc).__name__}: {exc}"})
            break
    with timer.phase("finalize"):
        work.close()


def _block_frames(plan, block):
    start, stop = plan.blocks[block]
    return stop - start


def publish_block_copy(plan, work, block, claims, timer, backup):
    """Analyse `block` chunk by chunk, stopping as soon as another copy has published
    it; publish it unless another copy did first. What this copy did, for the record."""
    t0 = time.time()
    chunks = plan.schedule_strategy.block_chunks(plan, block)

    if not backup:  # the block's copy has started: idle tasks judge its pace from here
        claims.progressed(block, t0, 0)

    def until_published():
        done = 0
        for chunk in chunks:
            if claims.published(block):
                return
            yield chunk
            done += chunk.stop - chunk.start
            if not backup:  # the pace an idle task judges this block by
                claims.progressed(block, t0, done)

    pieces = analyze_chunks(work, until_published(), timer)
    won = False
    if len(pieces) == len(chunks):
        arrays, _ = join_pieces(pieces, agreed_layout_of(pieces))
        with timer.phase("comm"):  # tasks mode hands its block to reduce as a file
            won = parts.write_part(plan.block_part_path(block), arrays,
                                   part_attrs(plan, work.attrs(), [block]), first_wins=True)
    if won:
        claims.finished(block, time.time() - t0)
        if backup:  # the block's own task stops at its next chunk: its progress is whole
            claims.whole_progress(block, _block_frames(plan, block))
    return {"block": block, "backup": backup, "won": won, "t_start": t0, "t_stop": time.time(),
            "chunks_done": len(pieces), "chunks": len(chunks)}


def run_mpi_mode(plan, setup_marks=None):
    """`setup_marks`: [(what, when it began)] of the rank's set-up in main(). This
    rank's number where it is the gather's root (it has written the gathered part), else
    None."""
    setup_marks = list(setup_marks or [])
    schedule = plan.schedule_strategy
    early = claims_before_mpi_init(plan)
    if early is not None:  # MPI_Init after the chunks: no wait for the launch's last rank
        launch, counter = early
        comm, rank, size = None, launch.rank, launch.size
        EARLY_START.update(launch=launch, counter=counter, timeout_s=plan.collective_timeout_s)
    else:
        setup_marks.append((MPI_INIT_PART, time.time()))
        comm, rank, size = mpi_world()
        counter = None
        agree_on_the_start(comm, early=False)
    # here, not in main(): a rank that fails it ends the others as any failed rank does
    # (MPI_Init, then MPI_Abort; before MPI_Init it also empties the chunk counter)
    check_inputs(plan, setup_marks)
    if size != plan.analyze_ranks or (size < plan.n_blocks and schedule.one_chunk_per_rank):
        need = plan.analyze_ranks if size != plan.analyze_ranks else plan.n_blocks
        raise SystemExit(f"analyze: {size} MPI ranks for {plan.n_blocks} blocks "
                         f"({plan.schedule} schedule); start it with mpiexec -n {need}")
    timer = RankTimer("analyze", rank=rank, size=size, block=rank, mode=MpiMode.name,
                      setup_marks=setup_marks, mpi_init_after_chunks=early is not None,
                      gather=plan.gather, schedule=plan.schedule,
                      progress_path=plan.progress_path(rank),
                      neighbours=CpuNeighbours.for_rank(rank, plan.workdir))
    faults.maybe_fail(plan.workdir, rank)
    faults.maybe_slow_down(rank)
    work = chunk_analysis(plan, timer, comm, schedule.one_chunk_per_rank)
    with timer.phase("setup"):
        chunks = schedule.chunks(plan)
        if schedule.one_chunk_per_rank:  # static: rank r's chunk is block r
            work.agree_on_collective_reads(chunks[rank])
    with schedule.claims(comm, chunks, timer, plan.collective_timeout_s, counter) as claims:
        faults.maybe_kill(rank)
        pieces = analyze_chunks(work, claims, timer)  # a failure: initialise_after_a_failure
        if comm is None:
            comm = late_mpi_init(timer, rank, size, plan.collective_timeout_s, counter)
            agree_on_the_start(comm, early=True)
            check_claims(comm, counter, pieces, len(chunks))
        work.even_up_collective_reads()
        with timer.phase("wait"):  # the straggler signal of Jakupovic and Beckstein 2021
            barrier_or_abort(comm, plan.collective_timeout_s)
    with timer.phase("finalize"):
        work.close()
    with timer.phase("comm"):
        arrays, rows = join_pieces(pieces, agreed_layout(comm, pieces))
        # the rank that analysed the most frames gathers and writes: rank 0 unless a
        # dynamic schedule found it slower than another (a throttled rank 0 took 1.3 s
        # to gather 134 MB of dihedral features that a healthy rank took 0.4 s for)
        root = int(np.argmax(comm.allgather(len(arrays["frame"]))))
        timer.info["gather_root"] = root
        gather = gather_rma if plan.gather == "rma" else gather_gatherv
        gathered = {key: gather(comm, value, root) for key, value in arrays.items()}
        rows_by_rank = comm.gather(rows, root=root)
    if rank == root:
        with timer.phase("write"):
            parts.write_part(plan.gathered_part_path(), gathered,
                             part_attrs(plan, work.attrs(), list(range(size))),
                             row_order=chunk_order(rows_by_rank))
    timer.finish(plan.profile_path(f"analyze.block_{rank:05d}"))
    return rank if rank == root else None


# where this rank claims before MPI_Init: what main() needs to end a failed one as the
# others end (MPI_Init, then MPI_Abort with its code), filled by run_mpi_mode
EARLY_START = {}


def initialise_after_a_failure():
    """A rank that failed before its MPI_Init: no chunk is left for the others (they stop
    at their next claim), and it joins their MPI_Init, watched, so that its MPI_Abort
    ends the job with its exit code."""
    counter, launch = EARLY_START["counter"], EARLY_START["launch"]
    counter.exhaust(1 << 40)
    watcher = watch_mpi_init(launch.rank, counter, EARLY_START["timeout_s"])
    try:
        mpi_world()
    finally:
        os.kill(watcher, signal.SIGKILL)
        os.waitpid(watcher, 0)


def mpi_world(expected=None):
    """(COMM_WORLD, rank, size), MPI initialised by the import; `expected`: the (rank,
    size) the launcher's environment said, which MPI must confirm."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if expected is not None and (rank, size) != expected:
        raise RuntimeError(f"MPI says rank {rank} of {size} where the launcher's environment "
                           f"said {expected[0]} of {expected[1]}: chunks were claimed as the "
                           f"wrong rank; run with {MPI_INIT_FIRST}=1 and report it")
    return comm, rank, size


def claims_before_mpi_init(plan):
    """(launch, its counter) where this rank may claim chunks before MPI_Init: a dynamic
    schedule, every rank on this node, a launch named for sure (launch_env.py) and of the
    plan's size, reads that do not go through MPI-IO, a counter this user alone can
    write; else None (MPI first)."""
    if os.environ.get(MPI_INIT_FIRST, "") not in ("", "0"):
        return None
    if plan.schedule_strategy.one_chunk_per_rank or faults.remote_counter_forced():
        return None
    if plan.builtin and plan.io_strategy.one_file:
        files, _ = plan.io_strategy.block_files(plan, 0)
        if len(files) == 1 and is_h5md(files[0]):
            import h5py
            if h5py.get_config().mpi:  # opened collectively by every rank, through MPI-IO
                return None
    launch = this_launch()
    if launch is None or not launch.one_node or launch.size != plan.analyze_ranks:
        return None
    try:
        return launch, LaunchCounter(launch, plan.workdir, launch.rank)
    except (CounterUnavailable, OSError) as exc:
        print(f"analyze rank {launch.rank}: {exc}; MPI is initialised first",
              file=sys.stderr, flush=True)
        return None


def late_mpi_init(timer, rank, size, timeout_s, counter):
    """MPI_Init after this rank's chunks, timed as `wait` (it waits for the launch's
    other ranks). A rank lost before its own MPI_Init must not leave this one there
    until the walltime: a watcher process (MPI_Init holds the interpreter: no thread of
    this one runs meanwhile) ends this one once a rank that started has ended (`counter`
    holds their pids), or after `timeout_s`."""
    t0, cpu0 = time.time(), time.process_time()
    with timer.phase("wait"):  # the watcher's fork and end too (a few ms of a large process)
        watcher = watch_mpi_init(rank, counter, timeout_s)
        try:
            comm, _, _ = mpi_world(expected=(rank, size))
        finally:
            os.kill(watcher, signal.SIGKILL)
            os.waitpid(watcher, 0)
    timer.info.setdefault("setup_parts", {})[MPI_INIT_PART] = time.time() - t0
    timer.info["setup_cpu_s"] = timer.info.get("setup_cpu_s", 0.0) + time.process_time() - cpu0
    return comm


def watch_mpi_init(rank, counter, timeout_s, every_s=0.25):
    """Fork the watcher of this rank's late MPI_Init; its pid."""
    rank_pid = os.getpid()
    watcher = os.fork()
    if watcher:
        return watcher
    try:  # the watcher: polls, and never returns into the rank's code
        deadline = time.time() + timeout_s
        while True:
            time.sleep(every_s)
            if os.getppid() != rank_pid:
                os._exit(0)  # the rank has ended
            gone = counter.ranks_gone()
            if gone or time.time() > deadline:
                why = (f"rank(s) {gone} ended before MPI_Init" if gone else
                       f"the other ranks did not reach MPI_Init within {timeout_s:.0f} s")
                os.write(2, f"analyze rank {rank}: {why}; ending this rank\n".encode())
                os.kill(rank_pid, signal.SIGKILL)
                os._exit(0)
    finally:
        os._exit(0)


def agree_on_the_start(comm, early):
    """Every rank's first collective: all claimed before MPI_Init, or none did (the
    choice is each rank's own; ranks that differ would wait in different collectives)."""
    if len(set(comm.allgather(bool(early)))) > 1:
        raise RuntimeError(f"some ranks claimed chunks before MPI_Init and some did not; run "
                           f"with {MPI_INIT_FIRST}=1 and report it")


def check_claims(comm, counter, pieces, n_chunks):
    """After claims made before MPI_Init: every rank used the same counter, and the
    chunks claimed are each chunk once. Otherwise the part would hold rows twice or
    miss some: the run fails here, naming why."""
    mine = [chunk_id for chunk_id, _ in pieces]
    seen = comm.allgather((counter.identity, mine))
    files = {identity for identity, _ in seen}
    claimed = sorted(chunk_id for _, ids in seen for chunk_id in ids)
    if len(files) > 1 or claimed != list(range(n_chunks)):
        raise RuntimeError(f"the ranks' claims before MPI_Init do not cover the {n_chunks} "
                           f"chunks once ({len(files)} counter file(s), {len(claimed)} claims): "
                           f"run with {MPI_INIT_FIRST}=1 and report it")


def barrier_or_abort(comm, timeout_s):
    """A barrier that gives up: a rank that died or hangs must not leave the
    others waiting until the walltime; after `timeout_s` the job is aborted."""
    request = comm.Ibarrier()
    t0 = time.time()
    while not request.Test():
        waited = time.time() - t0
        if waited > timeout_s:
            print(f"analyze rank {comm.Get_rank()}: the other ranks did not reach the gather "
                  f"within {timeout_s:.0f} s; aborting the job", file=sys.stderr, flush=True)
            abort_mpi_job(COLLECTIVE_TIMEOUT)
        # poll without pause for the first few ms (the last rank in is done at
        # once), then sleep so a long straggler wait does not hold a core
        if waited > 0.005:
            time.sleep(0.0005)


def _row_layout(comm, value):
    """Per-rank element counts and displacements for a block's array, and the row
    shape. Rows per rank are exchanged, not derived from the blocks: some arrays
    are one row per frame, others (a user analysis' pickled results) are not."""
    row_shape = value.shape[1:]
    width = int(np.prod(row_shape)) if row_shape else 1
    counts = np.array(comm.allgather(len(value)), dtype=np.int64) * width
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return row_shape, counts, displs


def gather_gatherv(comm, value, root):
    """Collect every rank's rows on `root` with MPI_Gatherv, rank after rank."""
    row_shape, counts, displs = _row_layout(comm, value)
    send = np.ascontiguousarray(value).reshape(-1)
    recv = None
    if comm.Get_rank() == root:
        recv = np.empty(int(counts.sum()), dtype=send.dtype)
    comm.Gatherv(send, [recv, (counts, displs)] if recv is not None else None, root=root)
    return recv.reshape((-1,) + row_shape) if recv is not None else None


def gather_rma(comm, value, root):
    """Each rank puts its rows into a window on `root` (one-sided, like ga_put)."""
    from mpi4py import MPI
    row_shape, counts, displs = _row_layout(comm, value)
    send = np.ascontiguousarray(value).reshape(-1)
    rank = comm.Get_rank()
    itemsize = send.dtype.itemsize
    buf = np.zeros(int(counts.sum()) if rank == root else 0, dtype=send.dtype)
    win = MPI.Win.Create(buf if rank == root else None, disp_unit=itemsize, comm=comm)
    win.Fence()
    if send.size:
        win.Put(send, root, target=int(displs[rank]))
    win.Fence()
    win.Free()
    return buf.reshape((-1,) + row_shape) if rank == root else None


def needs_mdanalysis(plan):
    """Whether this task's path uses MDAnalysis (its trajectory readers, a user's
    analysis, the box conversion of an H5MD file that is not trajflow's copy).
    The built-in analyses over H5MD and over plain DCD or one XTC file mostly do
    not, and skip its import: 0.65 s of every rank's start-up."""
    if not plan.builtin:
        return True
    need_boxes = ANALYSIS_CLASSES[plan.analysis].need_boxes
    files, _ = plan.io_strategy.block_files(plan, 0)
    if plan.reader_keywords(files):  # a format, dt, ...: MDAnalysis' own reader
        return True
    if len(files) == 1 and is_h5md(files[0]):  # the user's own H5MD: boxes from edges
        return need_boxes and plan.io_strategy.reads_input_as_is(plan)
    return open_dcd(files, need_boxes) is None and not xtc_readable(files, need_boxes)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.analyze",
                                description="Analyse blocks of a trajectory (runs inside the pilot).")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    p.add_argument("--block", type=int, help="tasks mode: the block to analyse")
    marks = [("plan", time.time())]  # the rank's clock starts here: its set-up is its time
    args = p.parse_args(argv)
    plan = RunPlan.load(decode_path_arg(args.plan))
    mark_started(plan.workdir, "analyze")
    marks.append(("imports", time.time()))
    if needs_mdanalysis(plan):
        import MDAnalysis  # noqa: F401
    marks.append(("kernels", time.time()))
    kernels.warm_up()
    parts.warm_up()
    if not plan.execution.collective:
        if args.block is None or not 0 <= args.block < plan.n_blocks:
            p.error(f"tasks mode needs --block between 0 and {plan.n_blocks - 1}")
        try:
            run_tasks_mode(plan, args.block, marks)
        except mda_analyses.AnalysisRaised as exc:
            mda_analyses.print_users_traceback(exc)
            return ANALYSIS_RAISED
        return 0
    try:
        root = run_mpi_mode(plan, marks)
    except BaseException as exc:
        # One failed rank must not leave the others waiting at a collective.
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        if isinstance(exc, mda_analyses.AnalysisRaised):
            code = ANALYSIS_RAISED
            mda_analyses.print_users_traceback(exc)
        elif isinstance(exc, SystemExit):
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)  # its reason (the abort would lose it)
        else:
            traceback.print_exc()
        sys.stderr.flush()
        if "mpi4py.MPI" not in sys.modules and EARLY_START:
            initialise_after_a_failure()
        # mpiexec forwards a rank's stderr asynchronously and the abort ends the
        # forwarding with the job: give it a moment, or the reason is lost (seen)
        time.sleep(0.2)
        abort_mpi_job(code)
    # the collective is over (no rank waits for this one): the root publishes result.h5
    # as the reduce task would, and fails the task as it would where it cannot
    if root is None or not plan.execution.publishes:
        return 0
    return reduce.publish(plan, within_task="analyze", rank=root)


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
