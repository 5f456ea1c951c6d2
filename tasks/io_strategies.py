"""How a run's blocks get their frames: one object per `io` value.

Each strategy owns everything that differs between them: the split stage's
tasks and their work, which files a block reads (and where its first frame is
in them), what a resumed run still has to prepare, the disk it needs, and
the advice when a run with it was I/O bound. Adding a strategy is one class
here, registered in IO_STRATEGIES; nothing else branches on `plan.io`.

    shared: every block reads the one trajectory (Khoshlessan et al. 2019's baseline);
            no split stage: each analyze task checks the inputs are the planned files;
    split:  one segment file per block (Khoshlessan et al. 2019, section 6.5.1);
    h5md:   one H5MD file chunked for the selection (h5md.chunk_shape).
"""
import os
from typing import Dict, List, Optional, Tuple

from .rundir import MANIFEST
from .copies import convert_h5md, write_segment
from .inputs import check_unchanged

GUIDELINES, H5MD_PAPER = "Khoshlessan et al. 2019", "Jakupovic and Beckstein 2021"
FRAME_BYTES = 80  # what a copied frame costs beside its coordinates (time, step, box)


class IOStrategy:
    """The default behaviour of a strategy that reads the trajectory as it is."""
    name = ""
    help = ""
    preparing = ""   # what its split stage does, for the advice ("" : nothing worth naming)
    one_file = True  # every rank reads the same file(s) (MPI-IO may open them collectively)

    def split_tasks(self, plan) -> List[Tuple[str, List[str], int]]:
        """The split stage as (task name, extra arguments, MPI ranks; 0: not MPI)."""
        return [(f"split.{self.name}", [], 0)]

    def remaining_split_tasks(self, plan, tasks):
        """Of `tasks` (as split_tasks gives them), those a resumed run still needs."""
        return [] if os.path.exists(plan.path(MANIFEST)) else tasks

    def check_before_analysing(self, plan):
        """What an analyze task checks before its first frame, a rank's failure handled as
        any other (the split stage checked the inputs against the plan as it read them:
        nothing more)."""

    def prepare(self, plan, universe, blocks, rank, timer):
        """The split task's work on this rank (`blocks`: the blocks it writes)."""

    def block_files(self, plan, block) -> Tuple[List[str], int]:
        """The files block `block` reads, and its first frame's index in them."""
        return list(plan.trajectories), plan.blocks[block][0]

    def reads_input_as_is(self, plan) -> bool:
        """Whether the analysis reads the user's own files (not trajflow's copy)."""
        return True

    def copied_frames(self, plan, block) -> Optional[Tuple[str, int]]:
        """Where a user analysis reads this block's frames, if not from the inputs:
        (trajflow's H5MD file, the block's first frame's index in it)."""
        return None

    def space_needed(self, plan) -> Dict[str, int]:
        """Bytes its split stage will still write into RUNDIR, by what."""
        return {}

    def io_bound_advice(self, strategy, ratio, prepared) -> str:
        raise NotImplementedError


class Shared(IOStrategy):
    """The inputs are read as they are: no split stage (a process start and a stage
    hand-off saved, ~0.9 s of a small run); each analyze task checks the inputs are the
    files the run was planned on."""
    name = "shared"
    help = "every block reads the one trajectory (no split stage)"
    preparing = "checking the inputs"  # what run folders from before 0.13.0 timed in a split

    def split_tasks(self, plan):
        return []

    def check_before_analysing(self, plan):
        check_unchanged(plan, "analyze")

    def io_bound_advice(self, strategy, ratio, prepared):
        return (f"I/O bound with {strategy} (t_compute/t_IO = {ratio:.2f}): every rank reads "
                "the one trajectory file; at scale, one segment per block (--io split) or one "
                f"H5MD file read with MPI-IO (--io h5md) removes that contention ({GUIDELINES}; "
                f"{H5MD_PAPER}). Measure them at your rank count: a campaign with "
                "io = [\"shared\", \"split\", \"h5md\"].")


class Split(IOStrategy):
    name = "split"
    help = "one segment file per block"
    preparing = "writing the segments"
    one_file = False

    def split_tasks(self, plan):
        return plan.execution.split_tasks_per_block(plan)

    def _missing(self, plan):
        return [b for b in range(plan.n_blocks) if not os.path.exists(plan.segment_path(b))]

    def remaining_split_tasks(self, plan, tasks):
        missing = self._missing(plan)
        if plan.execution.collective:  # one MPI task writes every segment
            return tasks if missing else []
        return [t for t in tasks if int(t[1][-1]) in missing]

    def prepare(self, plan, universe, blocks, rank, timer):
        for b in blocks:
            write_segment(plan, universe, b, timer)

    def block_files(self, plan, block):
        return [plan.segment_path(block)], 0

    def reads_input_as_is(self, plan):
        return False

    def copied_frames(self, plan, block):
        return plan.segment_path(block), 0

    def space_needed(self, plan):
        missing = len(self._missing(plan))
        if not missing:
            return {}
        # float32 positions (and velocities, forces) of every frame
        return {"the split segments":
                plan.n_frames * (plan.n_atoms * 12 + FRAME_BYTES) * missing // plan.n_blocks}

    def io_bound_advice(self, strategy, ratio, prepared):
        return (f"I/O bound with {strategy} (t_compute/t_IO = {ratio:.2f}): every block reads "
                f"its own segment already{prepared}; at scale one H5MD file with one-frame "
                f"chunks read with MPI-IO avoids writing the segments ({H5MD_PAPER}).")


class H5MD(IOStrategy):
    name = "h5md"
    help = "convert to H5MD chunked for the selection (an H5MD input is read as it is)"
    preparing = "converting to H5MD"

    def remaining_split_tasks(self, plan, tasks):
        return [] if os.path.exists(plan.h5md_path()) else tasks

    def prepare(self, plan, universe, blocks, rank, timer):
        if rank == 0 and not plan.reads_h5md_input:
            convert_h5md(plan, universe, timer)

    def block_files(self, plan, block):
        return [plan.h5md_path()], plan.blocks[block][0]

    def reads_input_as_is(self, plan):
        return plan.reads_h5md_input

    def copied_frames(self, plan, block):
        return None if plan.reads_h5md_input else (plan.h5md_path(), plan.blocks[block][0])

    def space_needed(self, plan):
        if os.path.exists(plan.h5md_path()):
            return {}
        return {"the H5MD copy of the trajectory": plan.n_frames * (plan.n_atoms * 12 + FRAME_BYTES)}

    def io_bound_advice(self, strategy, ratio, prepared):
        return (f"I/O bound with {strategy} (t_compute/t_IO = {ratio:.2f}): the ranks read "
                f"one H5MD file chunked for the selection{prepared}; the conversion pays off when the "
                "H5MD file is analysed again; on one shared disk, fewer ranks may read faster "
                f"({H5MD_PAPER}).")


IO_STRATEGIES: Dict[str, IOStrategy] = {s.name: s for s in (Shared(), Split(), H5MD())}
