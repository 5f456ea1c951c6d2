"""Every option of a run, of its pilot and of its cluster over SSH, defined once.

An option is a field of `RunSpec`, `PilotSpec` or `RemoteSpec`: its type, default, help text
and check live in the field. `trajflow.run`, `Pilot`, `Backend`, campaigns
(their TOML keys), remote runs (sent as JSON) and `trajflow run`'s flags
(cli/options.py builds them from the fields) all make a spec, so a default, a
choice or a message exists in one place. A message names an option as its
caller writes it: `io='h5'` in Python, `--io h5` on the command line
(`spelled`; the CLI says which inside `command_line()`).

    >>> spec = RunSpec(topology=PSF, trajectory=[DCD], analysis="rmsd", io="h5md")
    >>> PilotSpec(resource="local.localhost", cpus=4).cpus
    4
"""
import contextlib
import contextvars
import dataclasses
import difflib
import inspect
import json
import os
import typing
from typing import Any, Dict, List, Optional

from trajflow.tasks.analyses import ANALYSIS_CLASSES, MERGED_ANALYSES
from trajflow.tasks.h5md import COLLECTIVE, parse_compression
from trajflow.tasks.placement import node_cpus, split_cpus
from trajflow.tasks.modes import MODES, MpiMode
from trajflow.tasks.plan import CHUNK_BYTES, GATHERS, is_finite_number, MPI_READS
from trajflow.tasks.io_strategies import IO_STRATEGIES
from trajflow.tasks.schedules import SCHEDULES
from trajflow.workflows.errors import InputError
from trajflow.workflows.run import resources
from trajflow.workflows.run.heartbeat import DEFAULT_CLIENT_TIMEOUT_S
from trajflow.workflows.run.watchdog import parse_limits, PHASES

AUTO = "auto"  # the schedule chosen by the run's mode and analysis (resolved_schedule)

_NOTHING = object()


def _as_keyword(option, meta, value):
    return option if value is _NOTHING else f"{option}={value!r}"


def _as_flag(option, meta, value):
    flag = meta.get("flag") or "--" + option.replace("_", "-")
    return flag if value is _NOTHING else f"{flag} {value}"


def _as_toml_key(option, meta, value):
    key = meta.get("toml") or option
    return key if value is _NOTHING else f"{key} = {json.dumps(value, default=repr)}"


_SPELLING = contextvars.ContextVar("trajflow_spelling", default=_as_keyword)


@contextlib.contextmanager
def _spelling(how):
    token = _SPELLING.set(how)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def command_line():
    """Inside: messages spell options as flags (`--io h5`), not keywords (`io='h5'`)."""
    return _spelling(_as_flag)


def campaign_file():
    """Inside: messages spell options as a campaign file's keys (`io = "h5"`)."""
    return _spelling(_as_toml_key)


def on_command_line() -> bool:
    """Whether messages spell options as flags now (see command_line)."""
    return _SPELLING.get() is _as_flag


def spelled(option: str, value=_NOTHING) -> str:
    """`option` (a field name of a spec) as the caller writes it, with `value` if
    given: `--io h5` on the command line, `io='h5'` in Python, `io = "h5"` in a
    campaign file."""
    return _SPELLING.get()(option, _META.get(option, {}), value)


def option(default, help, *, flag=None, flag_help=None, metavar=None, choices=None,
           minimum=None, command_line=True, toml=None):
    """A field of a spec: `help` says what it is (without the default, which is
    added where it is shown); `flag` the CLI's name when not --NAME; `choices`
    the values allowed; `minimum` the least number allowed; `command_line`
    False: Python only; `toml` a campaign file's key when not NAME; `flag_help` the
    help of a flag that turns a True default off."""
    return dataclasses.field(default=default, metadata=dict(
        help=help, flag=flag, flag_help=flag_help, metavar=metavar, choices=choices, minimum=minimum,
        command_line=command_line, toml=toml))


def _analysis_help():
    builtin = "; ".join([f"{name}: {cls.help}" for name, cls in ANALYSIS_CLASSES.items()]
                        + [f"{name}: {text}" for name, text in MERGED_ANALYSES.items()])
    return (f"{builtin}; FILE.py:NAME or package.module:NAME: your own, a function "
            "NAME(universe, **args) returning a parallelisable MDAnalysis analysis; in Python "
            "also such a function itself (sent to the tasks by value with cloudpickle)")


def _io_help():
    return "; ".join(f"{s.name}: {s.help}" for s in IO_STRATEGIES.values())


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What to analyse and how: every option of one run (not of its pilot)."""
    topology: Optional[str] = option(
        None, "topology file MDAnalysis reads (PSF, PDB, GRO, TPR, ...); required", metavar="T")
    trajectory: Optional[List[str]] = option(
        None, "trajectory file(s); several are one continuous trajectory, in the order given; "
              "required", metavar="X")
    analysis: Any = option(None, _analysis_help() + "; required", metavar="SPEC")
    args: Optional[Dict[str, Any]] = option(
        None, "keyword arguments for your analysis' function (plain JSON values), "
              "e.g. {\"nbins\": 75}", flag="--analysis-args", metavar="JSON",
        toml="analysis_args")
    universe: Optional[Dict[str, Any]] = option(
        None, "MDAnalysis Universe keywords for your files, as a JSON object: format, "
              "topology_format, continuous, dt, time_offset, to_guess, ... (e.g. "
              "{\"format\": \"LAMMPSDUMP\"}, {\"continuous\": true}); used here and in "
              "every task alike", flag="--universe-args", metavar="JSON")
    format: Optional[str] = option(
        None, "the trajectory's format when its name does not say it (MDAnalysis' format=, "
              "e.g. LAMMPSDUMP); short for --universe-args '{\"format\": ...}'", metavar="FMT")
    topology_format: Optional[str] = option(
        None, "the topology's format when its name does not say it (MDAnalysis' "
              "topology_format=, e.g. DATA)", metavar="FMT")
    select: Optional[str] = option(
        None, "MDAnalysis selection, built-in analyses only (your own selects in its factory); "
              "none: " + ", ".join(f"{c.default_selection!r} for {n}"
                                   for n, c in ANALYSIS_CLASSES.items())
        + ", 'name CA' for rmsf, 'backbone' for pca", metavar="SEL")
    io: str = option("shared", _io_help(), choices=tuple(IO_STRATEGIES))
    mode: str = option(MpiMode.name, "; ".join(f"{m.name}: {m.help}" for m in MODES.values()),
                       choices=tuple(MODES))
    gather: str = option("gatherv", "mpi mode: collect results with Gatherv, or one-sided puts "
                                    "into an MPI window on rank 0", choices=GATHERS)
    schedule: str = option(AUTO, "how ranks or tasks share the frames; " + "; ".join(
        f"{s.name}: {s.help}" for s in SCHEDULES.values()) + f"; {AUTO}: dynamic for the "
        "built-in analyses in mpi mode (no slower on a clean run, 2.4x faster with one rank at "
        "a quarter of a core, measured), static otherwise (your own analysis pays a copy of "
        "itself and a pickled result per chunk: 3 to 20 per cent slower on a clean run)",
        choices=(AUTO,) + tuple(SCHEDULES))
    mpi_reads: str = option(
        "independent", "an H5MD file read through MPI-IO (where h5py is built against parallel "
        "HDF5; elsewhere each rank opens it on its own): independent, each rank reads when it "
        "will; collective, every rank takes part in each read, so MPI-IO can merge them (for "
        "parallel file systems: 4.4x slower on one node's page cache, measured; the static "
        "schedule, built-in analyses in mpi mode)", choices=MPI_READS)
    blocks: Optional[int] = option(None, "number of blocks (= ranks in mpi mode); balanced, none "
                                         "empty; none: the pilot's cpus", metavar="N", minimum=1)
    repeat: int = option(1, "repeat the per-frame computation K times to raise t_compute/t_IO "
                            "(the papers' workload multiplier)", metavar="K", minimum=1)
    chunk: int = option(0, "frames read and computed at a time, bounding memory per rank; 0: as "
                           f"many as fit {CHUNK_BYTES >> 20} MiB of coordinates (16 to 4096)",
                        metavar="F", minimum=0)
    compression: Optional[str] = option(None, "with io h5md: compress the H5MD copy",
                                        metavar="gzip:N|lzf")
    start: Optional[int] = option(None, "the first frame analysed, as MDAnalysis' run(start=) "
                                        "(negative: from the end); none: 0", metavar="F")
    stop: Optional[int] = option(None, "analyse the frames before this one, as MDAnalysis' "
                                       "run(stop=); none: to the end", metavar="F")
    step: Optional[int] = option(None, "analyse every S-th frame, as MDAnalysis' run(step=); "
                                       "none: 1", metavar="S", minimum=1)
    frames: Optional[List[int]] = option(
        None, "analyse just these frames, in this order, as MDAnalysis' run(frames=) (not with "
              "start, stop or step)", metavar="F")
    out: Optional[str] = option(None, "the run's new folder (result.h5, profiles, the plan); "
                                      "none: ./trajflow-ANALYSIS-DATE-TIME", metavar="RUNDIR")
    allow_truncated: bool = option(False, "analyse the whole frames of a truncated last "
                                          "trajectory file (without it a damaged input is "
                                          "refused); result.h5 and the summary say so")
    trial: bool = option(True, "your own analysis: run it on the first frames on this machine, "
                               "in a fresh Python, before any pilot (its errors show in "
                               "seconds); off: only load it there", flag="--no-trial",
                         flag_help="do not try your analysis on the first frames here (the "
                                   "data can only be read on the cluster); it is still loaded "
                                   "in a fresh Python")
    retries: int = option(1, "run a failed task again up to R times before the run fails; a "
                             "task whose analysis code raised a Python exception is not run "
                             "again (it would raise again)", metavar="R", minimum=0)
    env: Optional[Dict[str, str]] = option(None, "extra environment variables for this run's "
                                                 "tasks", command_line=False)
    progress: bool = option(True, "say what happens (each stage, the run's end) on stderr",
                            flag="--quiet", flag_help="no progress lines on stderr (the pilot, "
                                                      "each stage, each run's end)")

    def __post_init__(self):
        if isinstance(self.trajectory, (str, os.PathLike)):
            object.__setattr__(self, "trajectory", [self.trajectory])
        if self.trajectory is not None:
            object.__setattr__(self, "trajectory", [os.fspath(t) for t in self.trajectory])
        for name in ("topology", "out"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        if self.frames is not None:
            object.__setattr__(self, "frames", _frame_list(self.frames))
        _check_fields(self)
        for name in ("start", "stop"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{spelled(name, value)}: give a whole number of frames")
        if self.frames is not None and not (self.start is None and self.stop is None
                                            and self.step is None):
            raise InputError(f"{spelled('frames')} cannot be combined with {spelled('start')}, "
                             f"{spelled('stop')} or {spelled('step')} (as in MDAnalysis' run()): "
                             "give one or the other")
        try:
            parse_compression(self.compression)
        except ValueError as exc:
            raise InputError(f"{spelled('compression', self.compression)}: {exc}")
        if self.mpi_reads == COLLECTIVE and (not MODES[self.mode].collective
                                             or self.schedule == "dynamic"):
            raise InputError(f"{spelled('mpi_reads', COLLECTIVE)} needs every rank in each read: "
                             f"use it with {spelled('mode', MpiMode.name)} and the static schedule (not "
                             f"{spelled('mode', self.mode)}, {spelled('schedule', self.schedule)})")
        if self.compression and self.io != "h5md":
            raise InputError(f"{spelled('compression')} applies to {spelled('io', 'h5md')} only: "
                             "drop it or read the run's frames from an H5MD copy")
        object.__setattr__(self, "universe", self._universe_keywords())
        for name in ("args", "env"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                raise InputError(f"{spelled(name)} must be a dict of names and values, not "
                                 f"{type(getattr(self, name)).__name__}")
        for key, value in (self.env or {}).items():  # they reach the task's launch script
            for text in (key, value):
                if not isinstance(text, str):
                    raise InputError(f"{spelled('env')}: names and values are strings, not "
                                     f"{text!r:.40}")
                check_no_control(spelled("env"), text)

    def _universe_keywords(self) -> Optional[dict]:
        """`universe` with `format` and `topology_format` in it (the short forms); InputError
        naming a keyword that cannot be passed on, or the two forms disagreeing."""
        from trajflow.tasks import universe_args
        keywords = dict(self.universe) if isinstance(self.universe, dict) else self.universe
        why = None if keywords is None else universe_args.problem(keywords)
        if why:
            raise InputError(f"{spelled('universe')}: {why}")
        for name in ("format", "topology_format"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(keywords, dict) and keywords.get(name, value) != value:
                raise InputError(f"{spelled(name, value)} and {spelled('universe')}'s "
                                 f"{name} {keywords[name]!r} differ: give one")
            keywords = {**(keywords or {}), name: value}
        why = None if keywords is None else universe_args.problem(keywords)
        if why:
            raise InputError(f"{spelled('universe')}: {why}")
        return keywords

    def missing(self) -> List[str]:
        """The options a new run must have and this one lacks, spelled for the caller."""
        return [spelled(n) for n in ("topology", "trajectory", "analysis")
                if not getattr(self, n)]

    def to_json(self) -> str:
        """For a run planned on another machine; a Python function cannot travel."""
        if callable(self.analysis):
            raise InputError("a remote run's analysis is a name, FILE.py:NAME of a file on the "
                             "cluster or module:NAME: a function of this script cannot be sent")
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        return cls(**json.loads(text))


def resolved_schedule(spec: "RunSpec", builtin: bool) -> str:
    """The schedule a run's plan gets: as asked, or for `auto` dynamic where it was
    measured no slower (a built-in analysis in mpi mode), static elsewhere."""
    if spec.schedule != AUTO:
        return spec.schedule
    return ("dynamic" if builtin and MODES[spec.mode].collective and spec.mpi_reads != COLLECTIVE
            else "static")


def _frame_list(frames):
    """`frames` (a list, range or numpy array of frame numbers, or of booleans, one per
    frame) as a plain list; InputError if it is neither."""
    import numpy as np
    try:
        array = np.asarray(frames)
    except Exception:  # noqa: ragged or odd objects: the message below says what is wanted
        array = np.asarray([], dtype=object)
    if array.ndim != 1 or not (array.dtype.kind in "iu" or array.dtype == bool) or not len(array):
        raise InputError(f"{spelled('frames')}: give a non-empty list of frame numbers (or of "
                         "booleans, one per frame), as MDAnalysis' run(frames=) takes")
    return array.tolist()


@dataclasses.dataclass(frozen=True)
class PilotSpec:
    """Where and on what to run: the pilot's options."""
    resource: str = option("local.localhost", "RADICAL-Pilot resource label (`trajflow "
                                              "resources` lists them)", metavar="NAME")
    cpus: Optional[int] = option(None, "cores of the pilot; none: on this machine, what the run "
                                       "needs (all cores for a Pilot of several runs); elsewhere "
                                       "the run's blocks", metavar="N", minimum=1)
    walltime: int = option(30, "minutes the pilot may run", metavar="MIN", minimum=1)
    queue: Optional[str] = option(None, "the batch queue; none: the resource's", metavar="Q")
    project: Optional[str] = option(None, "the allocation to charge", metavar="P")
    access_schema: Optional[str] = option(
        None, "one of the resource config's access schemas; none: its default. batch: trajflow "
              "runs inside a batch job and the pilot uses its allocation", metavar="NAME")
    client_timeout: float = option(
        DEFAULT_CLIENT_TIMEOUT_S, "seconds: a guard running with the pilot ends it when this "
                                  "process has been gone this long (killed, its machine lost); "
                                  "0: no guard", metavar="S", minimum=0)
    limits: str = option(
        "", "bounds of the watched phases, NAME=SECONDS,... (0: none): session, submit, queue, "
            "start, task, stall; a phase past its bound fails the run, which --resume goes on "
            f"with (none given: {', '.join(f'{p.name}={p.default_s:g}' for p in PHASES.values())})",
        metavar="NAME=S,...")
    keep_sandbox: bool = option(False, "keep the pilot's RADICAL sandbox (by default removed at "
                                       "the end: the run's folder keeps every task's profile, "
                                       "stdout and stderr)")
    path: Optional[str] = option(None, "folder of the RADICAL session (logs, profiles); none: "
                                       "the run's folder, or ./trajflow-pilot-DATE-TIME for a "
                                       "Pilot", command_line=False)

    def __post_init__(self):
        _check_fields(self)
        self.check_anywhere(vars(self))
        try:
            object.__setattr__(self, "resource", resources.resolve_resource(self.resource))
            resources.check_resource(self.resource)
            if self.access_schema:
                resources.check_access_schema(self.resource, self.access_schema)
        except ValueError as exc:
            raise InputError(str(exc))

    @staticmethod
    def check_anywhere(values: dict):
        """The checks of a pilot's options that need no resource config of this machine
        (a campaign's resource for a cluster is checked so here, and there in whole)."""
        try:
            parse_limits(values.get("limits"))
        except ValueError as exc:
            raise InputError(f"{spelled('limits', values.get('limits'))}: {exc}")

    @property
    def local(self) -> bool:
        return resources.is_local(self.resource)

    def description(self) -> dict:
        """The pilot description EnTK's AppManager takes, from every option that shapes
        the pilot (its cpus must be known by now)."""
        if self.cpus is None:
            raise ValueError("a pilot's description needs its cpus: give cpus=N")
        return resources.resource_description(self.resource, self.walltime, self.cpus,
                                              self.queue, self.project, self.access_schema)

    def blocks_for(self, run: RunSpec) -> int:
        """How many blocks a run has: as asked, else the pilot's cpus, else (on
        this machine) its cores; InputError where nothing says."""
        if run.blocks is not None:
            return run.blocks
        if self.cpus is not None:
            return self.cpus
        if self.local:
            return self.local_cores()
        raise InputError(f"give {spelled('blocks')} or {spelled('cpus')} for a run on "
                         f"{self.resource}")

    def cores_for(self, plan) -> int:
        """A pilot's cores for one run: as asked, else a core per MPI rank; in tasks mode
        a core per task, at most this machine's on a local resource (the rest queue)."""
        if self.cpus is not None:
            return self.cpus
        return plan.execution.cores_for(plan, self.local_cores() if self.local else None)

    def local_cores(self) -> int:
        """This machine's cores that tasks may use: all this process may use, but those the
        resource keeps for RADICAL's agent."""
        cpus = node_cpus()
        return len(split_cpus(resources.agent_cores(self.resource), cpus)[1])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "PilotSpec":
        return cls(**json.loads(text))


REMOTE_SETTINGS = "~/.config/trajflow/remote.toml"  # a host's python, set once (remote/client.py)


@dataclasses.dataclass(frozen=True)
class RemoteSpec:
    """Where a run's client goes when not on this machine: a cluster reached over SSH.
    `trajflow run`'s --remote flags, `submit_remote`'s keywords and a campaign
    resource's remote keys are these fields."""
    remote: Optional[str] = option(
        None, "run on this cluster over SSH: every path given is a path there; the run goes on "
              "without this machine (see `trajflow status/follow/fetch/cancel`)",
        metavar="[USER@]HOST[:PORT]")
    remote_python: Optional[str] = option(
        None, "with --remote: the python of the cluster's trajflow virtualenv; none: the host's "
              f"entry in {REMOTE_SETTINGS}, else the resource's", metavar="PATH")
    remote_batch: bool = option(
        False, "with --remote: run the client in a batch job of its own (sbatch), its pilot in "
               "that job's allocation (RADICAL's batch access schema), for sites that end long "
               "processes on login nodes (default: the client stays on the login node, detached)")
    detach: bool = option(False, "with --remote: return as soon as the run has started")
    local: Optional[str] = option(
        None, "with --remote: this machine's folder for the run; none: ./NAME, NAME the last "
              "part of --out", metavar="DIR")

    def __post_init__(self):
        _check_fields(self)
        if self.remote:
            return
        if self.remote_batch:
            raise InputError(f"{spelled('remote_batch')} needs {spelled('remote')}: it submits "
                             "the run's client as a batch job there (here, run trajflow inside "
                             f"your own job with {spelled('access_schema', 'batch')})")
        given = [spelled(f.name) for f in dataclasses.fields(self) if getattr(self, f.name)]
        if given:
            raise InputError(f"{', '.join(given)} without {spelled('remote')}: "
                             f"{'it goes' if len(given) == 1 else 'they go'} with a run on a "
                             f"cluster over SSH; give {spelled('remote', '[USER@]HOST[:PORT]')} "
                             "or drop it")


SPECS = (RunSpec, PilotSpec, RemoteSpec)
_META = {f.name: dict(f.metadata) for spec in SPECS for f in dataclasses.fields(spec)}


def option_default(name):
    """The default of option `name` (a campaign's factor takes it as its one level)."""
    return next(f.default for spec in SPECS for f in dataclasses.fields(spec) if f.name == name)


def value_type(field):
    """int, float, str, bool, list or dict: what a field holds, Optional taken off."""
    return typing.get_origin(_unoptional(field.type)) or _unoptional(field.type)


def element_type(field):
    """What a list field holds (str for List[str], int for List[int])."""
    args = typing.get_args(_unoptional(field.type))
    return args[0] if args else str


def _unoptional(kind):
    if typing.get_origin(kind) is typing.Union:
        return next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def option_choices(name):
    return _META[name]["choices"]


def check_options(spec_class, options: dict):
    """`options` (keywords of `spec_class`) checked as its fields are, and by its
    check_anywhere if it has one, where the spec itself cannot be made here: a
    campaign's pilot options for a resource of another machine."""
    values = {f.name: f.default for f in dataclasses.fields(spec_class)} | options
    _check_fields(spec_class, values)
    check = getattr(spec_class, "check_anywhere", None)
    if check is not None:
        check(values)


def _check_fields(spec, values=None):
    """Choices, types and least values, with one message per kind of problem: the same
    check for the API, the CLI, campaign files and remote runs, since all make a spec.
    `values`: these (field name -> value) instead of the spec's own."""
    for f in dataclasses.fields(spec):
        value, meta = (values or vars(spec))[f.name], f.metadata
        if meta["choices"] and value not in meta["choices"]:
            raise InputError(f"unknown {spelled(f.name, value)}: choose one of "
                             f"{', '.join(meta['choices'])}")
        kind = value_type(f)
        if f.name not in FREE_TEXT:
            for text in (value if isinstance(value, list) else [value]):
                if isinstance(text, str):
                    check_no_control(spelled(f.name), text)
        if value is not None and kind in (int, float):
            _check_number(f.name, value, kind)
        elif value is not None and kind is str and not isinstance(value, str):
            raise InputError(f"{spelled(f.name, value)}: give a string")
        elif value is not None and kind is bool and not isinstance(value, bool):
            raise InputError(f"{spelled(f.name, value)}: give True or False")
        if meta["minimum"] is not None and value is not None and value < meta["minimum"]:
            raise InputError(f"{spelled(f.name, value)}: give {meta['minimum']} or more")


FREE_TEXT = ("select",)  # options never written into a script or a command line
CONTROL_CHARACTERS = ("\n", "\r", "\0")


def check_no_control(what, text):
    """InputError if `text` (a path or a name) holds a newline, carriage return or NUL:
    in a batch script or a task's shell line it would end the line and start a command
    of its own."""
    found = [repr(c) for c in CONTROL_CHARACTERS if c in text]
    if found:
        raise InputError(f"{what} {text!r} holds {' and '.join(found)}: paths and names that "
                         "reach a script or a shell line may not (rename the file or folder)")


def _check_number(name, value, kind):
    """A finite number, whole where the option counts things (NaN would pass every
    comparison and so disable a bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{spelled(name, value)}: give a number")
    if not is_finite_number(value):
        raise InputError(f"{spelled(name, value):.80}: give a finite number")
    if kind is int and not isinstance(value, int):
        raise InputError(f"{spelled(name, value)}: give a whole number")


def split_options(options: dict, *specs):
    """`options` (keyword arguments) shared out over `specs`' fields, each a dict;
    TypeError naming an unknown keyword and the nearest known one, as Python does."""
    out = [{} for _ in specs]
    for key, value in options.items():
        for i, spec in enumerate(specs):
            if key in {f.name for f in dataclasses.fields(spec)}:
                out[i][key] = value
                break
        else:
            known = [f.name for spec in specs for f in dataclasses.fields(spec)]
            near = difflib.get_close_matches(key, known, 1)
            raise TypeError(f"unexpected keyword argument {key!r}"
                            + (f"; did you mean {near[0]!r}?" if near else ""))
    return out


def takes_options(*specs, skip=()):
    """Give a function `f(..., **options)` the signature and a Parameters section made
    from `specs`' fields, so that help(f) lists every option with its default."""
    def decorate(func):
        sig = inspect.signature(func)
        params = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
        named = {p.name for p in params}
        fields = [f for spec in specs for f in dataclasses.fields(spec)
                  if f.name not in named and f.name not in skip]
        params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                     annotation=f.type) for f in fields]
        func.__signature__ = sig.replace(parameters=params)
        lines = [f"    {f.name} : default {f.default!r}\n        {f.metadata['help']}."
                 + (f" One of {', '.join(f.metadata['choices'])}." if f.metadata["choices"] else "")
                 for f in fields]
        func.__doc__ = (func.__doc__ or "").rstrip() + "\n\n    Options\n    -------\n" + \
            "\n".join(lines) + "\n"
        return func
    return decorate
