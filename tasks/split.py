"""The split task: prepare the trajectory for the analyze stage, per io strategy,
after checking the inputs still have the frames and atoms the plan counted
(shared io has no split stage: it reads the inputs as they are).

  split:  write one trajectory segment per block (H5MD: the input's float32 data, exact) (Khoshlessan et al. 2019, section 6.5.1),
          blocks shared round-robin over the MPI ranks or one block per task;
  h5md:   convert to one H5MD file chunked for the selection (h5md.chunk_shape).
Every output is written under a temporary name and renamed when whole.
"""
import argparse
import json
import os

from .rundir import MANIFEST, mark_started
from .plan import RunPlan, decode_path_arg
from .readers import open_universe
from .timing import RankTimer


def check_inputs(plan, timer):
    u = open_universe(plan.topology, plan.trajectories, timer, plan.universe,
                      plan.reader_keywords(plan.trajectories))
    n_frames, n_atoms = u.trajectory.n_frames, len(u.atoms)
    planned = plan.truncated["frames_in_files"] if plan.truncated else (
        plan.input_frames or plan.n_frames)
    if (n_frames, n_atoms) != (planned, plan.n_atoms):
        raise SystemExit(f"split: inputs changed since the run was planned: {n_frames} frames "
                         f"and {n_atoms} atoms now, {planned} and {plan.n_atoms} planned; "
                         "plan the run again")
    return u


def my_blocks(plan, block, rank, size):
    if block is not None:
        return [block]
    return list(range(rank, plan.n_blocks, size))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.tasks.split",
                                description="Prepare the trajectory for analysis (runs inside the pilot).")
    p.add_argument("--plan", required=True, help="the run's plan.json")
    p.add_argument("--block", type=int, help="split io, tasks mode: the block to write")
    p.add_argument("--mpi", action="store_true", help="share the blocks over MPI ranks")
    args = p.parse_args(argv)
    plan = RunPlan.load(decode_path_arg(args.plan))
    mark_started(plan.workdir, "split")
    rank, size = 0, 1
    if args.mpi:
        from mpi4py import MPI
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    os.makedirs(plan.path("split"), exist_ok=True)
    name = f"split.{plan.io}" + (f".block_{args.block:05d}" if args.block is not None else f".rank_{rank:05d}")
    # a tasks-mode split task writes one block's segment: its record says which
    timer = RankTimer("split", rank=rank, size=size, io=plan.io,
                      **({} if args.block is None else {"segment": args.block}))
    u = check_inputs(plan, timer)
    plan.io_strategy.prepare(plan, u, my_blocks(plan, args.block, rank, size), rank, timer)
    if rank == 0 and args.block in (None, 0):
        manifest = {"io": plan.io, "n_frames": plan.n_frames, "n_atoms": plan.n_atoms}
        with open(plan.path(MANIFEST), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
    timer.finish(plan.profile_path(name))
    return 0


if __name__ == "__main__":
    from .fast_exit import run_and_exit
    run_and_exit(main)
