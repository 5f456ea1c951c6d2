"""The analyze task: one block per process, then gather (MPI) or hand over (tasks).

  MPI mode:   mpiexec -n N python -m trajflow.tasks.analyze --plan PLAN
              rank r analyses block r; results reach rank 0 by Gatherv or by
              one-sided puts into an MPI window (Khoshlessan et al. 2019's Global Arrays),
              and rank 0 writes one part file.
  tasks mode: python -m trajflow.tasks.analyze --plan PLAN --block B
              writes that block's part file; the reduce task joins them.

A frame's way: reader -> kernel (analyses.py) -> gather -> part -> reduce.
"""
import argparse
import sys
import time
import traceback

import numpy as np

from . import faults, kernels, mda_analyses, parts
from .exit_codes import ANALYSIS_RAISED, COLLECTIVE_TIMEOUT
from .analyses import ANALYSIS_CLASSES
from .plan import RunPlan, chunk_size, decode_path_arg
from .dcd import open_dcd
from .xtc import xtc_readable
from .h5md import is_h5md
from .readers import SelectedFrames, open_block_reader
from .timing import RankTimer


def open_block_source(plan, analysis, block, timer, comm=None):
    """Open this block's data as the plan's io strategy says.

    Returns (source, start, stop, reference_source): frames [start, stop) of
    `source` are the block; `reference_source` holds frame 0 (the trajectory's, as
    MDAnalysis' references are, whatever frames the run analyses). A run of chosen
    frames reads them from the inputs by number (SelectedFrames), or from trajflow's
    copies, which hold just those frames.
    """
    b_start, b_stop = plan.blocks[block]
    idx, boxes = analysis.atom_indices, analysis.need_boxes
    files, first = plan.io_strategy.block_files(plan, block)
    comm = comm if plan.io_strategy.one_file else None
    chosen = plan.frame_selection is not None
    if chosen and plan.io_strategy.reads_input_as_is(plan):
        source = SelectedFrames(open_block_reader(files, idx, boxes, timer, comm),
                                plan.frame_numbers(b_start, b_stop))
        first = 0
    else:
        source = open_block_reader(files, idx, boxes, timer, comm, frame_offset=b_start - first)
    # where frame 0 is: block 0's files, or the inputs when the run's frames are chosen
    reference_files = list(plan.trajectories) if chosen else plan.io_strategy.block_files(plan, 0)[0]
    reference = source if reference_files == files and not chosen else open_block_reader(
        reference_files, idx, boxes, timer, comm)
    return source, first, first + b_stop - b_start, reference


def analyze_block(plan, block, timer, comm=None):
    """Run the analysis over one block; returns (arrays, attrs)."""
    faults.maybe_fail(plan.workdir, block)
    if not plan.builtin:  # a user's MDAnalysis analysis, through MDAnalysis' own machinery
        return mda_analyses.analyze_block(plan, block, timer)
    with timer.phase("open_topology"):  # the atoms, resolved on the workstation
        selected = plan.load_selection()
    analysis = ANALYSIS_CLASSES[plan.analysis](selected, plan.selection, plan.repeat)
    source, start, stop, reference = open_block_source(plan, analysis, block, timer, comm)
    with timer.phase("io"):  # frame 0, the reference
        analysis.prepare(reference)
    frames_per_chunk = chunk_size(plan.chunk_frames, len(analysis.atom_indices))
    arrays = analysis.run_block(source, start, stop, frames_per_chunk, timer)
    expected = plan.frame_numbers(*plan.blocks[block])
    if plan.frame_selection is not None and not plan.io_strategy.reads_input_as_is(plan):
        arrays["frame"] = expected  # a copy of chosen frames counts its rows, not frames
    elif not np.array_equal(arrays["frame"], expected):  # reduce checks them again
        raise RuntimeError(f"block {block}: the reader gave frames {arrays['frame'][:3]}... "
                           f"where the plan has {expected[:3]}...")
    source.close()
    if reference is not source:
        reference.close()  # split io: block 0's segment, opened for frame 0 only
    return arrays, analysis.attrs()


def part_attrs(plan, analysis_attrs, blocks):
    return {**analysis_attrs, "blocks": [list(plan.blocks[b]) for b in blocks],
            "block_ids": list(blocks), "input_checksum": plan.input_checksum,
            "n_frames_total": plan.n_frames}


def run_tasks_mode(plan, block):
    timer = RankTimer("analyze", rank=0, size=1, block=block, mode="tasks",
                      progress_path=plan.progress_path(block))
    arrays, attrs = analyze_block(plan, block, timer)
    # tasks mode hands its block to reduce through a part file: its "gather"
    with timer.phase("comm"):
        parts.write_part(plan.part_path(f"block_{block:05d}"), arrays,
                         part_attrs(plan, attrs, [block]))
    timer.finish(plan.profile_path(f"analyze.block_{block:05d}"))


def run_mpi_mode(plan):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size != plan.n_blocks:
        raise SystemExit(f"analyze: {size} MPI ranks for {plan.n_blocks} blocks; "
                         f"start it with mpiexec -n {plan.n_blocks}")
    timer = RankTimer("analyze", rank=rank, size=size, block=rank, mode="mpi",
                      gather=plan.gather, progress_path=plan.progress_path(rank))
    arrays, attrs = analyze_block(plan, rank, timer, comm)
    with timer.phase("wait"):  # the straggler signal of Jakupovic and Beckstein 2021
        barrier_or_abort(comm, plan.collective_timeout_s)
    with timer.phase("comm"):
        gather = gather_rma if plan.gather == "rma" else gather_gatherv
        gathered = {key: gather(comm, value, plan) for key, value in arrays.items()}
    if rank == 0:
        with timer.phase("write"):
            parts.write_part(plan.part_path("mpi"), gathered,
                             part_attrs(plan, attrs, list(range(size))))
    timer.finish(plan.profile_path(f"analyze.block_{rank:05d}"))


def barrier_or_abort(comm, timeout_s):
    """A barrier that gives up: a rank that died or hangs must not leave the
    others waiting until the walltime; after `timeout_s` the job is aborted."""
    from mpi4py import MPI
    request = comm.Ibarrier()
    t0 = time.time()
    while not request.Test():
        waited = time.time() - t0
        if waited > timeout_s:
            print(f"analyze rank {comm.Get_rank()}: the other ranks did not reach the gather "
                  f"within {timeout_s:.0f} s; aborting the job", file=sys.stderr, flush=True)
            MPI.COMM_WORLD.Abort(COLLECTIVE_TIMEOUT)
        # poll without pause for the first few ms (the last rank in is done at
        # once), then sleep so a long straggler wait does not hold a core
        if waited > 0.005:
            time.sleep(0.0005)


def _row_layout(comm, value, plan):
    """Per-rank element counts and displacements for a block's array, and the row
    shape. Rows per rank are exchanged, not derived from the blocks: some arrays
    are one row per frame, others (a user analysis' pickled results) are not."""
    row_shape = value.shape[1:]
    width = int(np.prod(row_shape)) if row_shape else 1
    counts = np.array(comm.allgather(len(value)), dtype=np.int64) * width
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return row_shape, counts, displs


def gather_gatherv(comm, value, plan):
    """Collect every rank's block on rank 0 with MPI_Gatherv, in frame order."""
    row_shape, counts, displs = _row_layout(comm, value, plan)
    send = np.ascontiguousarray(value).reshape(-1)
    recv = None
    if comm.Get_rank() == 0:
        recv = np.empty(int(counts.sum()), dtype=send.dtype)
    comm.Gatherv(send, [recv, (counts, displs)] if recv is not None else None, root=0)
    return recv.reshape((-1,) + row_shape) if recv is not None else None


def gather_rma(comm, value, plan):
    """Each rank puts its block into a window on rank 0 (one-sided, like ga_put)."""
    from mpi4py import MPI
    row_shape, counts, displs = _row_layout(comm, value, plan)
    send = np.ascontiguousarray(value).reshape(-1)
    rank = comm.Get_rank()
    itemsize = send.dtype.itemsize
    buf = np.zeros(int(counts.sum()) if rank == 0 else 0, dtype=send.dtype)
    win = MPI.Win.Create(buf if rank == 0 else None, disp_unit=itemsize, comm=comm)
    win.Fence()
    if send.size:
        win.Put(send, 0, target=int(displs[rank]))
    win.Fence()
    win.Free()
    return buf.reshape((-1,) + row_shape) if rank == 0 else None


def needs_mdanalysis(plan):
    """Whether this task's path uses MDAnalysis (its trajectory readers, a user's
    analysis, the box conversion of an H5MD file that is not trajflow's copy).
    The built-in analyses over H5MD and over plain DCD or one XTC file mostly do
    not, and skip its import: 0.65 s of every rank's start-up."""
    if not plan.builtin:
        return True
    need_boxes = ANALYSIS_CLASSES[plan.analysis].need_boxes
    files, _ = plan.io_strategy.block_files(plan, 0)
    if len(files) == 1 and is_h5md(files[0]):  # the user's own H5MD: boxes from edges
        return need_boxes and plan.io_strategy.reads_input_as_is(plan)
    return open_dcd(files, need_boxes) is None and not xtc_readable(files, need_boxes)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.analyze",
                                description="Analyse blocks of a trajectory (runs inside the pilot).")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    p.add_argument("--block", type=int, help="tasks mode: the block to analyse")
    args = p.parse_args(argv)
    plan = RunPlan.load(decode_path_arg(args.plan))
    if needs_mdanalysis(plan):  # imported before the rank's clock starts: start-up, not open
        import MDAnalysis  # noqa: F401
    kernels.warm_up()
    parts.warm_up()
    if plan.mode == "tasks":
        if args.block is None or not 0 <= args.block < plan.n_blocks:
            p.error(f"tasks mode needs --block between 0 and {plan.n_blocks - 1}")
        try:
            run_tasks_mode(plan, args.block)
        except mda_analyses.AnalysisRaised as exc:
            mda_analyses.print_users_traceback(exc)
            return ANALYSIS_RAISED
        return 0
    try:
        run_mpi_mode(plan)
    except BaseException as exc:
        # One failed rank must not leave the others waiting at a collective.
        code = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
        if isinstance(exc, mda_analyses.AnalysisRaised):
            code = ANALYSIS_RAISED
            mda_analyses.print_users_traceback(exc)
        elif not isinstance(exc, SystemExit):
            traceback.print_exc()
        sys.stderr.flush()
        # mpiexec forwards a rank's stderr asynchronously and the abort ends the
        # forwarding with the job: give it a moment, or the reason is lost (seen)
        time.sleep(0.2)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
