"""The run plan: the one contract between the workstation and the tasks.

The client writes RUNDIR/plan.json once; every split, analyze and reduce task
reads it and derives its paths from it, so a task's command line only says
which plan and which block. Plain JSON keeps it readable by people and by
tasks that must not import the client.
"""
import base64
import dataclasses
import functools
import json
import os
import re
import typing
from typing import List, Optional, Tuple

import numpy as np

from .modes import BACKEND, MODES
from .rundir import (BACKEND_RESULT, is_finite_number, PLAN, RESULT, SELECTION, replaced_whole,
                     write_text)



def balanced_blocks(n_frames: int, n_blocks: int) -> List[Tuple[int, int]]:
    """Split frames 0..n_frames-1 into n_blocks contiguous [start, stop) ranges.

    The first n_frames % n_blocks blocks get one frame more; none is empty.
    (The papers' ceil(n/N) blocks leave the last one short or empty.)
    """
    if n_blocks < 1:
        raise ValueError(f"blocks must be at least 1, got {n_blocks}")
    if n_blocks > n_frames:
        raise ValueError(f"{n_blocks} blocks for {n_frames} frames: "
                         f"use at most {n_frames} blocks")
    base, extra = divmod(n_frames, n_blocks)
    ranges, start = [], 0
    for i in range(n_blocks):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def chosen_frames(selection: Optional[dict], n_frames: int) -> np.ndarray:
    """The global frame numbers a plan's frame_selection names (None: 0..n_frames-1)."""
    if selection is None:
        return np.arange(n_frames, dtype=np.int64)
    if "frames" in selection:
        return np.asarray(selection["frames"], dtype=np.int64)
    return np.arange(selection["start"], selection["stop"], selection["step"], dtype=np.int64)


@dataclasses.dataclass
class RunPlan:
    """Everything a task needs to know; paths are absolute."""
    workdir: str
    topology: str
    trajectories: List[str]
    analysis: str
    selection: str
    io: str
    mode: str
    gather: str
    n_frames: int
    n_atoms: int
    blocks: List[Tuple[int, int]]
    repeat: int = 1
    chunk_frames: int = 0        # 0: sized by bytes, see chunk_size()
    compression: Optional[str] = None
    input_checksum: str = ""
    # each input's [size, modification time in ns] when planned: tasks refuse changed
    # inputs by them (inputs.check_unchanged; [] in older plans: not checked)
    input_stats: List[Tuple[int, int]] = dataclasses.field(default_factory=list)
    collective_timeout_s: float = 1800.0  # an MPI rank waits this long for the others
    schedule: str = "static"  # how ranks or tasks share the frames (schedules.py; older
    # plans, which have none, ran static blocks)
    mpi_reads: str = "independent"  # H5MD through MPI-IO: each rank's own reads, or
    # "collective" (h5md.COLLECTIVE: every rank in each read, the static schedule)
    mpi_ranks: int = 0  # 0: a rank per block; fewer (dynamic schedule) on a pilot with
    # fewer cores than blocks, e.g. a resume on the nodes left after one was lost
    created_by: str = "trajflow"
    # a user's MDAnalysis analysis (analysis = "FILE.py:NAME" or "module:NAME"):
    # the factory's keyword arguments, and where its code is (see mda_analyses)
    analysis_args: dict = dataclasses.field(default_factory=dict)
    factory: Optional[dict] = None
    # an MDAnalysis run() through trajflow.Backend: its parts are MDAnalysis' own
    # computation groups (tasks/backend_part.py), not the blocks' frames
    backend: bool = False
    # a truncated last input analysed by its whole frames (--allow-truncated): the
    # damage as found, and how many frames MDAnalysis counts in the files
    truncated: Optional[dict] = None
    # a user analysis tried on the workstation before the run: {"frames", "seconds"}
    trial: Optional[dict] = None
    # the frames analysed when not all: {"start", "stop", "step"} (whole numbers, as
    # MDAnalysis normalises run(start, stop, step)) or {"frames": [global frame numbers]}
    # (run(frames=)); n_frames then counts the frames analysed (the blocks share them out)
    # and input_frames those of the inputs they are chosen from (0: n_frames)
    frame_selection: Optional[dict] = None
    input_frames: int = 0
    # when the user asked for it (planning began; a resume sets it anew): the summary
    # counts the run's time from there, as the user waited
    asked_at: float = 0.0
    # io h5md in a campaign: one H5MD copy of the inputs for all its experiments,
    # made by the first split task that needs it (the others wait and reuse it)
    shared_h5md: Optional[str] = None
    # MDAnalysis Universe keywords for the user's files (universe_args.py): a format,
    # continuous, dt, guessing options; {}: MDAnalysis' defaults
    universe: dict = dataclasses.field(default_factory=dict)
    # the workstation's, never in plan.json: the resolved atoms (kept in selection.npz
    # beside it), the RUNDIR lock held while the run goes (workflows/run/rundir_lock.py),
    # a script's analysis function pickled (written into RUNDIR/analysis/)
    selected: Optional[dict] = dataclasses.field(default=None, repr=False, compare=False)
    lock: Optional[object] = dataclasses.field(default=None, repr=False, compare=False)
    factory_pickle: Optional[bytes] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks)

    @property
    def analyze_ranks(self) -> int:
        """The analyze task's MPI ranks (mpi mode)."""
        return self.mpi_ranks or self.n_blocks

    @property
    def execution(self):
        """The ExecutionMode object of `mode` (modes.py); an MDAnalysis run() has its own."""
        return BACKEND if self.backend else MODES[self.mode]

    @property
    def n_workers(self) -> int:
        """The analyze stage's N as scaling counts it: its MPI ranks, or its tasks."""
        return self.execution.workers(self)

    def frame_numbers(self, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
        """The global frame numbers of the analysed frames [start, stop) (positions in
        the run's frames, as the blocks count them)."""
        return chosen_frames(self.frame_selection, self.n_frames)[start:stop]

    def mda_frames(self) -> dict:
        """The run's frames as MDAnalysis' run() and _setup_frames take them."""
        return dict(self.frame_selection) if self.frame_selection else {"stop": self.n_frames}

    def frames_per_chunk(self, n_atoms: int) -> int:
        """Frames read at a time for `n_atoms` atoms (chunk_size)."""
        return chunk_size(self.chunk_frames, n_atoms)

    @property
    def io_strategy(self):
        """The IOStrategy object of `io` (io_strategies.py)."""
        from .io_strategies import IO_STRATEGIES
        return IO_STRATEGIES[self.io]

    @property
    def schedule_strategy(self):
        """The Schedule object of `schedule` (schedules.py)."""
        from .schedules import SCHEDULES
        return SCHEDULES[self.schedule]

    @property
    def builtin(self) -> bool:
        """A built-in analysis (trajflow's kernels, analyses.py), not a user's
        MDAnalysis analysis (which has its factory) or an MDAnalysis run() (backend)."""
        return self.factory is None and not self.backend

    # --- where things live under the work directory -------------------------
    def path(self, *parts: str) -> str:
        return os.path.join(self.workdir, *parts)

    def segment_path(self, block: int) -> str:
        """The split stage's segment for one block: H5MD holding the input's own
        float32 positions, boxes and the whole trajectory's times (re-encoding XTC
        at another precision, or TRR through nm, changed the answers)."""
        return self.path("split", f"block_{block:05d}.h5md")

    @property
    def reads_h5md_input(self) -> bool:
        """io h5md over one H5MD input: the input is read as it is, never copied."""
        from .h5md import is_h5md  # h5py only where asked
        return self.io == "h5md" and len(self.trajectories) == 1 and is_h5md(self.trajectories[0])

    def reader_keywords(self, files) -> dict:
        """The Universe keywords for reading `files`: the run's trajectory keywords for the
        user's own files, none for trajflow's copies and segments (universe_args.py)."""
        from .universe_args import trajectory_keywords
        return trajectory_keywords(self.universe) if list(files) == list(self.trajectories) else {}

    def h5md_path(self) -> str:
        """io h5md: the input itself when it is H5MD, else the run's own copy in
        split/, or the campaign's shared one."""
        if self.reads_h5md_input:
            return self.trajectories[0]
        return self.shared_h5md or self.path("split", "trajectory.h5md")

    def block_part_path(self, block: int) -> str:
        """One block's result before reduce (tasks mode; an MPI rank's when it saves its
        blocks as it goes)."""
        return self.path("parts", f"block_{block:05d}.h5")

    def gathered_part_path(self) -> str:
        """The MPI ranks' gathered result before reduce."""
        return self.path("parts", "mpi.h5")

    def selection_path(self) -> str:
        """The atoms (and dihedral quadruplets) resolved once on the workstation."""
        return self.path(SELECTION)

    def save_selection(self, arrays: dict) -> str:
        with replaced_whole(self.selection_path()) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        return self.selection_path()

    def load_selection(self) -> dict:
        with np.load(self.selection_path()) as data:
            return {k: data[k] for k in data.files}

    def result_path(self) -> str:
        """The file whose presence means the run is complete."""
        return self.path(BACKEND_RESULT) if self.backend else self.path(RESULT)

    def progress_path(self, block: int) -> str:
        """An analyze rank's frames done so far (one number), for the progress bar."""
        return self.path("progress", f"analyze.block_{block:05d}")

    def profile_path(self, name: str) -> str:
        return self.path("profile", f"{name}.jsonl")

    def partial_files(self) -> List[str]:
        """Files a task was writing when it was killed or its disk filled: every file
        of the run is written under a temporary name (`X.tmpPID`, `X.tmpPID.ext`,
        `X.PID.RANDOM.tmp`, `X.tmp`) and renamed into place when whole."""
        found = []
        for folder in ("", "split", "parts", "progress", "profile"):
            try:
                names = os.listdir(self.path(folder))
            except OSError:
                continue
            found += [self.path(folder, n) for n in names if _PARTIAL.search(n)]
        return found

    # --- serialisation -------------------------------------------------------
    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in WORKSTATION_ONLY}
        d["blocks"] = [list(b) for b in self.blocks]
        d["trajectories"] = list(self.trajectories)
        return d

    def save(self, path: Optional[str] = None) -> str:
        path = path or self.path(PLAN)
        write_text(path, json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str) -> "RunPlan":
        """The plan in `path`; PlanError naming the file and the key when it is not a
        plan trajflow wrote (a run folder may come from anyone: never a traceback)."""
        d = load_json_record(path, PlanError, MAX_PLAN_BYTES)
        check_plan_dict(d, path)
        d["blocks"] = [tuple(b) for b in d["blocks"]]
        return cls(**d)


WORKSTATION_ONLY = ("selected", "lock", "factory_pickle")  # fields never written to plan.json
GATHERS = ("gatherv", "rma")
MPI_READS = ("independent", "collective")  # h5md.COLLECTIVE: every rank in each read
FACTORY_KINDS = ("file", "module", "pickle")
MAX_PLAN_BYTES = 256 << 20  # a run(frames=) of tens of millions of frames; beyond: not ours
MAX_BLOCKS = 1 << 20        # a million blocks: beyond any machine's cores


class PlanError(ValueError):
    """A plan.json that is not one trajflow wrote: its message names the file and the key."""


def load_json_record(path, error, max_bytes):
    """A JSON object from `path`, read without following a FIFO or a device and at most
    `max_bytes` long; `error` (an exception class) with one line saying why not."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{path}: cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a plain file")
        if st.st_size > max_bytes:
            raise error(f"{path}: {st.st_size} bytes, more than any trajflow record "
                        f"({max_bytes}): not one trajflow wrote")
        data = fh.read(max_bytes + 1)
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}): not one trajflow wrote, "
                    "or damaged") from None
    except RecursionError:
        raise error(f"{path}: nested too deeply: not one trajflow wrote") from None
    except ValueError as exc:
        raise error(f"{path}: not JSON ({exc}): damaged or cut short") from None
    if not isinstance(record, dict):
        raise error(f"{path}: holds a JSON {type(record).__name__}, not an object: "
                    "not one trajflow wrote")
    return record


def check_plan_dict(d: dict, path: str = PLAN) -> None:
    """Every key known, of its field's type, within sane bounds (PlanError otherwise)."""
    fields = {f.name: f for f in dataclasses.fields(RunPlan) if f.name not in WORKSTATION_ONLY}
    hint = "it is not a plan trajflow wrote, or was edited or damaged"
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise PlanError(f"{path}: unknown key {unknown[0]!r}: {hint}")
    blocks = d.get("blocks")
    if isinstance(blocks, list) and len(blocks) > MAX_BLOCKS:  # before checking each one
        raise PlanError(f"{path}: {len(blocks)} blocks, more than any run has ({MAX_BLOCKS}): "
                        f"{hint}")
    hints = typing.get_type_hints(RunPlan)
    for name, f in fields.items():
        if name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise PlanError(f"{path}: key {name!r} is missing: {hint}")
            continue
        why = _type_problem(d[name], hints[name])
        if why:
            raise PlanError(f"{path}: key {name!r}: {why}: {hint}")
    blocks, n_frames = d["blocks"], d["n_frames"]
    if not 1 <= len(blocks) <= MAX_BLOCKS or n_frames < 0 or d["n_atoms"] < 1:
        raise PlanError(f"{path}: {len(blocks)} blocks of {n_frames} frames, {d['n_atoms']} "
                        f"atoms: {hint}")
    # a Backend run's blocks are MDAnalysis' groups, by frame number (any order, or empty)
    if not d.get("backend") and any(not 0 <= a < b <= n_frames for a, b in blocks):
        raise PlanError(f"{path}: key 'blocks': a block outside the {n_frames} frames: {hint}")
    from .io_strategies import IO_STRATEGIES
    from .schedules import SCHEDULES
    for key, choices in (("io", IO_STRATEGIES), ("mode", MODES), ("gather", GATHERS),
                         ("schedule", SCHEDULES), ("mpi_reads", MPI_READS)):
        if key in d and d[key] not in choices:
            raise PlanError(f"{path}: key {key!r}: {d[key]!r:.40} is not one of "
                            f"{', '.join(choices)}: {hint}")
    truncated = d.get("truncated")
    if truncated is not None and _type_problem(truncated, typing.Dict[str, typing.Any]) is None \
            and [k for k, kind in (("file", str), ("analysed", int), ("frames_in_files", int),
                                   ("where", str)) if not isinstance(truncated.get(k), kind)]:
        raise PlanError(f"{path}: key 'truncated' lacks its file, analysed, frames_in_files or "
                        f"where: {hint}")
    stats = d.get("input_stats") or []
    if stats and len(stats) != 1 + len(d["trajectories"]):
        raise PlanError(f"{path}: key 'input_stats': {len(stats)} entries for "
                        f"{1 + len(d['trajectories'])} inputs: {hint}")
    if not os.path.isabs(d["workdir"]):
        raise PlanError(f"{path}: key 'workdir' is not an absolute path: {hint}")
    factory = d.get("factory")
    if factory is not None:
        _check_factory(factory, path, hint)
    from .universe_args import problem as universe_problem
    why = universe_problem(d.get("universe", {}))
    if why:
        raise PlanError(f"{path}: key 'universe': {why}: {hint}")


def _check_factory(factory, path, hint):
    """A user analysis' record: its kind, name, and for a file or a pickle the copy
    inside the run folder and its checksum."""
    kind, copy = factory.get("kind"), factory.get("copy")
    needed = ("name",) + (("copy", "checksum") if kind in ("file", "pickle") else ("source",))
    if kind not in FACTORY_KINDS or any(not isinstance(factory.get(k), str) for k in needed) \
            or not isinstance(factory.get("source"), (str, type(None))):
        raise PlanError(f"{path}: key 'factory': not a record of a {'/'.join(FACTORY_KINDS)} "
                        f"analysis with its name, source, copy and checksum: {hint}")
    if copy is not None and (not isinstance(copy, str) or os.path.isabs(copy)
                             or ".." in copy.split(os.sep)):
        raise PlanError(f"{path}: key 'factory': its copy {copy!r} is not a name inside the run "
                        f"folder: {hint}")


@functools.lru_cache(maxsize=None)
def _shape(kind):
    """(`kind` without Optional, its origin, its args, whether None is allowed): worked
    out once per annotation, not once per item of a list of a million."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is not typing.Union:
        return kind, origin, args, False
    kind = next(a for a in args if a is not type(None))
    return kind, typing.get_origin(kind), typing.get_args(kind), True


def _type_problem(value, kind):
    """Why `value` is not of the annotated `kind`, or None."""
    kind, origin, args, optional = _shape(kind)
    if optional and value is None:
        return None
    if kind is bool:
        return None if isinstance(value, bool) else f"{value!r:.40} is not true or false"
    if kind is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else \
            f"{value!r:.40} is not a whole number"
    if kind is float:
        return None if is_finite_number(value) else f"{value!r:.40} is not a finite number"
    if kind is str:
        return None if isinstance(value, str) else f"{value!r:.40} is not a string"
    if kind is dict or origin is dict:
        return None if isinstance(value, dict) else f"{value!r:.40} is not an object"
    if origin in (list, typing.List):
        if not isinstance(value, list):
            return f"{value!r:.40} is not a list"
        for item in value:
            why = _type_problem(item, args[0]) if args else None
            if why:
                return why
        return None
    if origin in (tuple, typing.Tuple):
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            return f"{value!r:.40} is not a list of {len(args)}"
        return next(filter(None, (_type_problem(v, a) for v, a in zip(value, args))), None)
    return None
_PARTIAL = re.compile(r"\.tmp\d*(\.[A-Za-z0-9]+)?$|\.\d+(\.[0-9a-f]+)?\.tmp$")
# coordinates read at a time per rank when --chunk is not given: a chunk that stays in
# the core's cache while the kernel reads it again (XTC CA-RMSD of AdK, 2 ranks: 8 MiB
# chunks 2.4 s, 1 MiB 1.9 s, measured side by side)
CHUNK_BYTES = 1 << 20


def chunk_size(chunk_frames: int, n_atoms: int) -> int:
    """Frames per chunk: as asked, or as many as fit CHUNK_BYTES of float32 xyz (16..4096)."""
    if chunk_frames > 0:
        return chunk_frames
    return int(min(4096, max(16, CHUNK_BYTES // (12 * max(1, n_atoms)))))


# RADICAL-Pilot wraps each argument in double quotes in the task's shell
# script, so `$`, backticks and backslashes in a path would be expanded. A
# path with any of those travels base64-encoded instead.
_SHELL_ACTIVE = set('$`\\"!')


def encode_path_arg(path: str) -> str:
    if _SHELL_ACTIVE & set(path):
        return "b64:" + base64.urlsafe_b64encode(path.encode()).decode()
    return path


def decode_path_arg(arg: str) -> str:
    if arg.startswith("b64:"):
        return base64.urlsafe_b64decode(arg[4:].encode()).decode()
    return arg
