"""Turn what the user asked for into a checked RunPlan, before any pilot is requested.

Everything that can be wrong with the input is found here, on the workstation,
in seconds: each problem raises `InputError` with what is wrong and how to fix
it, and the CLI exits 2. Nothing is written until every check has passed.
"""
import contextlib
import dataclasses
import difflib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import sys
import time
import warnings
from typing import List, Optional

import numpy as np

from trajflow.tasks import mda_analyses
from trajflow.tasks.analyses import ANALYSES, ANALYSIS_CLASSES, MERGED_ANALYSES
from trajflow.tasks.h5md import COLLECTIVE, missing_box
from trajflow.tasks.inputs import input_stats
from trajflow.tasks.modes import MODES
from trajflow.tasks.plan import balanced_blocks, chosen_frames, PlanError, RunPlan
from trajflow.tasks.rundir import (ANALYSIS_DIR, FOLDERS, foreign_entries, keep_room, LOCK, MARKER,
                                   open_in_run, PLAN, remove_entry, replaced_whole, RESERVE,
                                   RESERVE_BYTES, SELECTION)
from trajflow.workflows.errors import InputError
from trajflow.workflows.run import integrity, local_trial, user_code
from trajflow.workflows.run.rundir_lock import RunLock
from trajflow.workflows.run.progress import eta_text
from trajflow.workflows.run.spec import PilotSpec, RunSpec, resolved_schedule, spelled

log = logging.getLogger(__name__)




def _check_readable(path, what):
    if not os.path.exists(path):
        raise InputError(f"{what} {path!r} does not exist: check the path")
    if not os.path.isfile(path):
        raise InputError(f"{what} {path!r} is not a file: give the file itself")
    if not os.access(path, os.R_OK):
        raise InputError(f"{what} {path!r} is not readable: fix its permissions (chmod u+r)")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{what} {path!r}: its name is not UTF-8, and MDAnalysis' readers open "
                         "files by UTF-8 names only (MDAnalysis itself fails on it): rename it, "
                         "or link it under a UTF-8 name (ln -s)") from None


def open_inputs(topology, trajectories, damages=None, universe=None):
    """Open the inputs with MDAnalysis as the tasks will (with the run's Universe
    keywords `universe`); InputError if it cannot. `damages`: a list that gets each
    input file's Damage (integrity.py), if any."""
    import MDAnalysis as mda
    from trajflow.tasks.offsets_cache import keep_offsets_in_cache
    from trajflow.tasks.universe_args import topology_keywords, trajectory_keywords
    read_as = trajectory_keywords(universe)
    keep_offsets_in_cache()  # a read-only dataset folder: offsets in trajflow's cache
    _check_readable(topology, "topology")
    for t in trajectories:
        _check_readable(t, "trajectory")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            u = mda.Universe(topology, **topology_keywords(universe))
        except Exception as exc:
            raise InputError(f"MDAnalysis cannot read topology {topology!r} ({exc}); "
                             "give a topology format MDAnalysis reads (PSF, PDB, GRO, TPR, ...), "
                             f"or name its format ({spelled('topology_format', 'FMT')})")
        # one topology parse: each trajectory is loaded into the same Universe
        # in turn (a large topology costs seconds to parse)
        for t in trajectories:
            try:
                u.load_new(t, **read_as)
            except ValueError as exc:
                if "atoms" in str(exc).lower():
                    raise InputError(f"trajectory {t!r} does not match topology {topology!r}: "
                                     f"{exc}; give the topology this trajectory was written with")
                raise InputError(f"MDAnalysis cannot read trajectory {t!r} ({exc}); "
                                 f"{_format_advice()}")
            except Exception as exc:
                raise InputError(f"MDAnalysis cannot read trajectory {t!r} ({exc}); "
                                 f"{_format_advice()}")
            problem = integrity.unreadable(t)
            if problem:
                raise InputError(f"trajectory {t!r} cannot be analysed: {problem}")
            if damages is not None:
                damage = integrity.whole_frames(u.trajectory)
                if damage is not None:
                    damages.append(damage)
        if len(trajectories) > 1:
            u.load_new(list(trajectories), **read_as)
    return u


def _format_advice():
    return ("give a format MDAnalysis reads (DCD, XTC, TRR, H5MD, ...), or name the file's "
            f"format when its name does not say it ({spelled('format', 'FMT')}, e.g. "
            "LAMMPSDUMP for a .lammpstrj)")


def check_boxes(trajectories, analysis):
    """Refuse an H5MD input that lost its box for an analysis that applies the
    minimum image: it would run, and silently give another answer."""
    from MDAnalysis.lib.util import guess_format
    if not ANALYSIS_CLASSES[analysis].need_boxes:
        return
    for t in trajectories:
        try:
            is_h5md = guess_format(t) == "H5MD"
        except (TypeError, ValueError):
            is_h5md = False
        problem = missing_box(t) if is_h5md else None
        if problem:
            raise InputError(f"trajectory {t!r} has no periodic box: {problem}. {analysis} "
                             "applies the minimum image, so without the box molecules broken "
                             "across the box give wrong results. Write the H5MD with its box "
                             "(MDAnalysis' H5MDWriter writes it when the frames have "
                             "dimensions), give the original trajectory instead, or, if the "
                             "system is not periodic, set the box group's boundary attribute "
                             "to 'none'")


def input_checksum(paths):
    """A fingerprint of the inputs: size, mtime and sha256 of the first and last MiB.

    Hashing terabytes would take longer than the analysis; this catches a
    replaced or rewritten file, which is what resume and reduce must refuse.
    """
    h = hashlib.sha256()
    for p in paths:
        st = os.stat(p)
        h.update(f"{os.path.abspath(p)}|{st.st_size}|{st.st_mtime_ns}|".encode())
        with open(p, "rb") as fh:
            h.update(fh.read(1 << 20))
            if st.st_size > 1 << 20:
                fh.seek(max(st.st_size - (1 << 20), 1 << 20))
                h.update(fh.read(1 << 20))
    return h.hexdigest()


def check_outdir(out):
    """RUNDIR must be new (or empty); never write into a user's folder or an old run."""
    out = os.path.abspath(out)
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise InputError(f"{spelled('out', out)} exists and is not a folder: choose a new folder name")
        entries = [e for e in os.listdir(out) if e != LOCK]  # a lock: see RunLock
        if not entries and not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"{spelled('out', out)} exists and is not writable: choose a folder "
                             "you can write to")
        if entries and not os.path.exists(os.path.join(out, MARKER)):
            raise InputError(f"{spelled('out', out)} exists, is not empty and is not a trajflow run: "
                             "choose a new folder (trajflow never writes into other files)")
        if entries:
            raise InputError(f"{spelled('out', out)} holds an earlier trajflow run: choose a new folder, "
                             "or remove the old run first")
    parent = os.path.dirname(out)
    probe = parent
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise InputError(f"{spelled('out', out)} cannot be created: {probe!r} is a file, not a folder; "
                         "choose a folder you can write to")
    if not os.access(probe, os.W_OK):
        raise InputError(f"{spelled('out', out)} cannot be created: {probe!r} is not writable; "
                         "choose a folder you can write to")
    return out


@dataclasses.dataclass
class Inputs:
    """What the inputs are, read once: a campaign plans many runs from one reading."""
    topology: str
    trajectories: List[str]
    analysis: str
    selection: str
    selected: dict
    n_frames: int
    n_atoms: int
    checksum: str
    stats: list = dataclasses.field(default_factory=list)  # tasks.inputs.input_stats
    analysis_args: dict = dataclasses.field(default_factory=dict)
    factory: Optional[dict] = None  # a user analysis: where its factory is (see check_factory)
    factory_pickle: Optional[bytes] = None  # a callable handed over by a script, pickled
    truncated: Optional[dict] = None  # see check_whole
    trial: Optional[dict] = None  # a user analysis tried here: frames, seconds (local_trial.py)
    universe: dict = dataclasses.field(default_factory=dict)  # Universe keywords it was read with


ANALYSIS_FORMS = ("rmsd, dihedrals, rmsf, pca, FILE.py:NAME (a function NAME(universe, **args) in that "
                  "file returning an MDAnalysis analysis) or package.module:NAME")


def callable_name(function):
    """A script's analysis function as `runs` and the summary name it: its qualified name,
    or for a lambda where it is written (`lambda at script.py:12`, not `<lambda>`)."""
    name = getattr(function, "__qualname__", type(function).__name__)
    code = getattr(function, "__code__", None)
    if "<lambda>" in name and code is not None:
        return f"lambda at {os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    return name


def check_analysis_spec(analysis, analysis_args=None):
    """(kind, source, name) of a user analysis, None for rmsd/dihedrals; InputError if malformed.

    `analysis` may also be a Python callable f(universe, **args) (the API's
    trajflow.run): kind "pickle", the callable itself as its source."""
    if callable(analysis):
        _check_json_args(analysis_args)
        return "pickle", analysis, callable_name(analysis)
    if analysis in ANALYSES:
        if analysis_args:
            raise InputError(f"{spelled('args')} applies to your own analyses, not {analysis}: "
                             "drop it")
        return None
    try:
        kind, source, name = mda_analyses.parse_spec(str(analysis))
    except ValueError as exc:
        near = [name for name in ANALYSES if name == str(analysis).lower()] or \
            difflib.get_close_matches(str(analysis).lower(), ANALYSES, n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise InputError(f"unknown {spelled('analysis')}: {exc}; {hint}give {ANALYSIS_FORMS}")
    _check_json_args(analysis_args)
    return kind, source, name


def _check_json_args(analysis_args):
    try:
        if json.loads(json.dumps(analysis_args or {})) != (analysis_args or {}):
            raise TypeError("values change in JSON")
    except (TypeError, ValueError) as exc:
        raise InputError(f"{spelled('args')} must be plain JSON values (numbers, strings, lists, "
                         f"objects): {exc}")
    if not isinstance(analysis_args or {}, dict):
        raise InputError(f"{spelled('args')} must be a JSON object of keyword arguments, "
                         'e.g. \'{"nbins": 75}\'')


def check_factory(u, spec, analysis, analysis_args):
    """Load the user's factory, build the analysis on the workstation's Universe and check
    MDAnalysis can split it; (the factory's record for the plan, the pickled
    callable or None), or InputError."""
    kind, source, name = spec
    if kind == "file":
        source = os.path.abspath(source)
        _check_readable(source, "factory file")
        if not source.endswith(".py"):
            raise InputError(f"{spelled('analysis', analysis)}: {source!r} is not a Python file "
                             "(its name does not end in .py): give FILE.py:NAME, a function "
                             "NAME(universe, **args) in that file")
    path = list(sys.path)  # loading a factory file puts its folder on the path: for it only
    try:
        return _check_factory(u, kind, source, name, analysis, analysis_args)
    finally:
        sys.path[:] = path


def _check_factory(u, kind, source, name, analysis, analysis_args):
    try:
        factory = source if kind == "pickle" else mda_analyses.load_factory(kind, source, name)
    except Exception as exc:
        raise InputError(f"{spelled('analysis', analysis)}: cannot load the factory ({type(exc).__name__}: "
                         f"{exc}); give FILE.py:NAME or module:NAME naming a function "
                         "NAME(universe, **args)")
    try:
        analysis_object = mda_analyses.build_analysis(factory, u, analysis_args)
    except mda_analyses.AnalysisRefused as exc:
        raise InputError(f"{spelled('analysis', analysis)}: {exc}")
    except Exception as exc:
        raise InputError(f"{spelled('analysis', analysis)}: the factory failed on your inputs "
                         f"({type(exc).__name__}: {exc}); run it once in Python on the same "
                         "Universe to see why")
    record = {"kind": kind, "source": None if kind == "pickle" else source, "name": name,
              "class": f"{type(analysis_object).__module__}.{type(analysis_object).__name__}"}
    if kind == "file":
        record.update(copy=os.path.join(ANALYSIS_DIR, os.path.basename(source)),
                      checksum=mda_analyses.file_checksum(source),
                      modules=user_code.modules_beside(source))
        return record, None
    if kind == "pickle":
        pickled = _pickle_factory(factory, analysis)
        record.update(copy=os.path.join(ANALYSIS_DIR, "factory.pickle"),
                      checksum=hashlib.sha256(pickled).hexdigest())
        return record, pickled
    return record, None


def _pickle_factory(factory, analysis):
    """The callable by value (cloudpickle: a lambda or a function of the script travels
    with its code, and so does the user's own code it uses: user_code.py); whether it
    loads where the tasks run is the local trial's to find out."""
    try:
        pickled = user_code.pickle_callable(factory)
    except Exception as exc:
        raise InputError(f"analysis {analysis!r}: the function cannot be sent to the tasks "
                         f"({type(exc).__name__}: {exc}); make it a plain function of your "
                         "script that builds everything it needs from the Universe")
    return pickled


def check_whole(u, trajectories, damages, allow_truncated):
    """(frames to analyse, the truncation record or None); InputError for a damaged
    input unless `allow_truncated` and it is the last file (its whole frames are used)."""
    n_seen = int(u.trajectory.n_frames)
    if not damages:
        return n_seen, None
    damage = damages[0]
    if not allow_truncated:
        raise InputError(f"{damage.describe()}. Restore the file, or pass "
                         f"{spelled('allow_truncated', True)} to analyse its {damage.whole_frames} whole "
                         "frame(s); the result then says so")
    if damage.file != trajectories[-1] or len(damages) > 1:
        raise InputError(f"{damage.describe()}. Only the last trajectory file may be truncated: "
                         "the frames after a damaged file would be numbered wrongly")
    n_frames = n_seen - (damage.frames_seen - damage.whole_frames)
    if n_frames < 1:
        raise InputError(f"{damage.describe()}: no whole frame to analyse")
    return n_frames, dict(dataclasses.asdict(damage), frames_in_files=n_seen, analysed=n_frames)


def read_inputs(topology, trajectories, analysis, selection=None, analysis_args=None,
                allow_truncated=False, trial=True, frames=None, universe=None) -> Inputs:
    """Open the inputs with MDAnalysis as the tasks will and resolve the atoms (or
    build the user's analysis and try it on the run's first frames in a fresh Python:
    `trial` False, only load it there); InputError if not. `frames`: what chooses the
    run's frames (a RunSpec's start, stop, step, frames), for the trial. `universe`:
    MDAnalysis Universe keywords for the files (universe_args.py)."""
    if analysis in MERGED_ANALYSES and selection:  # its factory's own keyword
        analysis_args, selection = {**(analysis_args or {}), "select": selection}, None
    spec = check_analysis_spec(analysis, analysis_args)
    if spec is not None and selection:
        raise InputError(f"{spelled('select')} applies to the built-in analyses; your own "
                         f"analysis selects its atoms in its factory: drop {spelled('select')}")
    if isinstance(trajectories, str):
        trajectories = [trajectories]
    if not trajectories:
        raise InputError(f"no trajectory given: give {spelled('trajectory')} (one file or several)")
    topology = os.path.abspath(topology)
    trajectories = [os.path.abspath(t) for t in trajectories]
    damages = []
    universe = dict(universe or {})
    # before the inputs are read: a file that changes while they are counted is refused
    # by the tasks, not taken with the old count
    try:
        stats = input_stats([topology] + trajectories)
    except OSError:  # open_inputs says which input is missing, and what to do
        stats = []
    u = open_inputs(topology, trajectories, damages, universe)
    try:
        n_frames, truncated = check_whole(u, trajectories, damages, allow_truncated)
        common = dict(n_frames=n_frames, n_atoms=len(u.atoms), truncated=truncated,
                      checksum=input_checksum([topology] + trajectories),
                      stats=stats, universe=universe)
        if spec is not None:
            # a script's callable is named by its qualified name
            label = f"python:{spec[2]}" if spec[0] == "pickle" else analysis
            factory, pickled = check_factory(u, spec, label, dict(analysis_args or {}))
            inputs = Inputs(topology, trajectories, label, "", {}, **common,
                            analysis_args=dict(analysis_args or {}), factory=factory,
                            factory_pickle=pickled)
            chosen = chosen_frames(*select_frames(frames or RunSpec(), n_frames))
            tried = local_trial.try_analysis(inputs, label, write_analysis_code, chosen,
                                             local_trial.TRIAL_FRAMES if trial else 0)
            if tried is not None and tried.frames:
                inputs.trial = dataclasses.asdict(tried)
                log.info("%s: tried on this machine: %d frame(s) in %.2f s (with its "
                         "_prepare); all %d frames: about %s on one core", label, tried.frames,
                         tried.seconds, len(chosen),
                         eta_text(tried.seconds_per_frame * len(chosen)))
            return inputs
        check_boxes(trajectories, analysis)
        selection = selection or ANALYSIS_CLASSES[analysis].default_selection
        return Inputs(topology, trajectories, analysis, selection,
                      resolve_selection(u, selection, analysis), **common)
    finally:
        u.trajectory.close()  # an HDF5 file left open would block its writers


def resolve(spec: RunSpec, pilot: Optional[PilotSpec] = None, *, cores: Optional[int] = None,
            resume: Optional[str] = None, new_out=True, inputs=None) -> RunPlan:
    """The checked plan of a run (nothing written): the one place its shape is decided.

    For a pilot of its own (`pilot`, a PilotSpec) or a running one of `cores` (a kept or
    held Pilot, a campaign's resource): its blocks as asked, else one per core (`cores`,
    the pilot's cpus, or this machine's); one MPI rank per block, and on `cores` fewer
    than the blocks the ranks share them (fit_to_cores); its schedule and MPI reads as
    asked, `auto` resolved by mode and analysis (resolved_schedule). `resume`: that
    interrupted run's plan instead, fitted to `cores`. The pilot of its own is then
    sized by own_pilot(). InputError naming the problem."""
    if resume:
        plan = plan_for_resume(resume)
    else:
        blocks_default = cores or pilot.cpus or pilot.blocks_for(spec)
        plan = make_plan(spec, blocks_default, new_out=new_out, inputs=inputs)
    return plan if cores is None else fit_to_cores(plan, cores)


def own_pilot(plans, pilot: PilotSpec, path=None) -> PilotSpec:
    """The pilot of the runs' own: `pilot` with its cpus as asked, else as many as the
    largest run's execution mode needs (RunPlan.execution.cores_for), and its session in
    `path` where it has none."""
    cpus = pilot.cpus or max(pilot.cores_for(plan) for plan in plans)
    return dataclasses.replace(pilot, cpus=cpus, path=pilot.path or path)


def make_plan(spec: RunSpec, cpus: int, *, new_out=True, inputs=None) -> RunPlan:
    """Check everything and return the plan of `spec` (not yet written), for a pilot of
    `cpus` cores (the blocks' default; MPI ranks must fit). `new_out=False`: the caller
    owns `spec.out` (a campaign's experiment folder) and has checked it. `inputs`: the
    inputs already read (read_inputs), for many plans of one input."""
    asked_at = time.time()
    missing = spec.missing()
    if missing:
        raise InputError(f"missing {', '.join(missing)}: a new run needs "
                         f"{', '.join(spelled(n) for n in ('topology', 'trajectory', 'analysis'))}")
    builtin = check_analysis_spec(spec.analysis, spec.args) is None
    if spec.repeat != 1 and not builtin:
        raise InputError(f"{spelled('repeat')} applies to the built-in analyses (the papers' "
                         "workload multiplier): drop it")
    if spec.mpi_reads == COLLECTIVE and not builtin:
        raise InputError(f"{spelled('mpi_reads', COLLECTIVE)} applies to the built-in analyses "
                         "(your own reads its frames through MDAnalysis): drop it")
    if cpus < 1:
        raise InputError(f"{spelled('cpus', cpus)}: ask for at least 1 cpu")
    out = spec.out if spec.out is not None else default_out(spec.analysis)

    def plan_in(rundir):
        read = inputs or read_inputs(spec.topology, spec.trajectory, spec.analysis, spec.select,
                                     spec.args, spec.allow_truncated, spec.trial, spec,
                                     spec.universe)
        plan = _make_plan(rundir, read, spec, cpus)
        plan.asked_at = asked_at
        return plan
    if not new_out:
        return plan_in(os.path.abspath(out))
    lock = RunLock(check_outdir(out)).acquire()  # before anything is read or written
    try:
        plan = plan_in(lock.rundir)
    except BaseException:
        lock.release(remove_dir=True)  # refused: nothing left behind
        raise
    plan.lock = lock
    return plan


def plan_from_options(topology, trajectory, analysis, cpus, *, new_out=True, inputs=None,
                      **options) -> RunPlan:
    """make_plan of the RunSpec these keyword options make (benchmarks' and tests' way)."""
    spec = RunSpec(topology=topology, trajectory=trajectory, analysis=analysis, **options)
    return make_plan(spec, cpus, new_out=new_out, inputs=inputs)


def default_out(analysis, parent=None):
    """A new folder (under `parent`, default the current folder) named after the
    analysis and the time."""
    if callable(analysis):
        label = getattr(analysis, "__name__", "analysis")
    else:
        label = str(analysis).rpartition(":")[2]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "", label) or "analysis"
    base = os.path.join(os.path.abspath(parent or os.getcwd()),
                        f"trajflow-{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    path, k = base, 1
    while os.path.exists(path):
        k += 1
        path = f"{base}-{k}"
    return path


def select_frames(spec, n_input):
    """(the plan's frame_selection or None, how many frames it analyses) of `spec`'s
    start/stop/step or frames over `n_input` frames, normalised as MDAnalysis does;
    InputError when they pick no frame or one that is not there."""
    if spec.frames is not None:
        frames = np.asarray(spec.frames)
        if frames.dtype == bool:
            if len(frames) != n_input:
                raise InputError(f"{spelled('frames')} as booleans needs one per frame: "
                                 f"{len(frames)} given, the trajectory has {n_input}")
            frames = np.flatnonzero(frames)
        bad = frames[(frames >= n_input) | (frames < -n_input)]
        if len(bad):
            raise InputError(f"{spelled('frames')}: frame {int(bad[0])} is not in the "
                             f"trajectory (frames 0 to {n_input - 1})")
        numbers = np.arange(n_input)[frames]  # negative numbers count from the end
        if not len(numbers):
            raise InputError(f"{spelled('frames')} selects no frame: give at least one")
        return {"frames": numbers.tolist()}, len(numbers)
    if spec.start is None and spec.stop is None and spec.step is None:
        return None, n_input
    start, stop, step = slice(spec.start, spec.stop, spec.step).indices(n_input)
    n = len(range(start, stop, step))
    if n == 0:
        given = ", ".join(spelled(k, getattr(spec, k)) for k in ("start", "stop", "step")
                          if getattr(spec, k) is not None)
        raise InputError(f"{given} selects no frame of the trajectory's {n_input}: choose a "
                         "range inside it")
    return {"start": start, "stop": stop, "step": step}, n


def _make_plan(out, inputs, spec, cpus):
    selection, n_frames = select_frames(spec, inputs.n_frames)
    n_blocks = cpus if spec.blocks is None else spec.blocks
    if n_blocks > n_frames:
        chosen = "frames chosen" if selection else "trajectory's frames"
        raise InputError(f"{spelled('blocks', n_blocks)} is more than the {n_frames} "
                         f"{chosen}: use at most {n_frames} blocks")
    if MODES[spec.mode].collective and n_blocks > cpus:
        raise InputError(f"{spelled('mode', spec.mode)} runs one rank per block: {n_blocks} ranks do "
                         f"not fit in {spelled('cpus', cpus)}; ask for {spelled('cpus', n_blocks)} "
                         f"or fewer {spelled('blocks')}")
    plan = RunPlan(workdir=out, topology=inputs.topology, trajectories=inputs.trajectories,
                   analysis=inputs.analysis, selection=inputs.selection, io=spec.io,
                   mode=spec.mode, gather=spec.gather,
                   schedule=resolved_schedule(spec, builtin=inputs.factory is None),
                   n_frames=n_frames, n_atoms=inputs.n_atoms,
                   frame_selection=selection, input_frames=inputs.n_frames if selection else 0,
                   blocks=balanced_blocks(n_frames, n_blocks), repeat=spec.repeat,
                   chunk_frames=spec.chunk, compression=spec.compression,
                   mpi_reads=spec.mpi_reads, input_checksum=inputs.checksum,
                   input_stats=inputs.stats, analysis_args=inputs.analysis_args,
                   truncated=inputs.truncated, trial=inputs.trial,
                   factory=inputs.factory, universe=inputs.universe)
    plan.selected = inputs.selected
    plan.factory_pickle = inputs.factory_pickle
    check_space(plan)
    return plan


RADICAL_SESSION_BYTES = 3 << 20  # a run's RADICAL session folder in RUNDIR: ~1-2 MB seen


def space_needed(plan) -> dict:
    """Bytes this run will still write into RUNDIR, by what: the H5MD copy or the
    segments of the split stage (whatever of them is not there yet), and the
    parts plus result.h5 of the built-in analyses (each holds every frame's
    result; a user's analysis' results are not known before it runs)."""
    need = plan.io_strategy.space_needed(plan)
    need["RADICAL's session folder (logs, profiles)"] = RADICAL_SESSION_BYTES
    need["room kept for outcome.json"] = RESERVE_BYTES
    if plan.builtin and not os.path.exists(plan.result_path()):
        row = ANALYSIS_CLASSES[plan.analysis].bytes_per_frame(plan.selected or {})
        need["the parts and result.h5"] = 2 * plan.n_frames * (row + 16)
    return need


def full_disk_note(plan, floor=4 << 20):
    """"" or, when RUNDIR's file system is (nearly) full, a sentence saying so and
    what the run still needs: why a run failed is then plain."""
    try:
        free = shutil.disk_usage(plan.workdir).free
    except OSError:
        return ""
    if free >= max(floor, sum(space_needed(plan).values())):
        return ""
    return (f"the disk of {plan.workdir!r} is full ({free / 1e6:.1f} MB free; the run still "
            f"needs about {sum(space_needed(plan).values()) / 1e6:.1f} MB): free space there, "
            f"then `trajflow run --resume {shlex.quote(plan.workdir)}`")


def check_space(plan, margin=1.1):
    """InputError before any pilot when RUNDIR's file system has not the room the
    run needs (a full disk once hung a run and left half-written files)."""
    need = space_needed(plan)
    total = int(sum(need.values()) * margin)
    probe = plan.workdir
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    free = shutil.disk_usage(probe).free
    if total > free:
        parts = ", ".join(f"{what} {n / 1e6:.1f} MB" for what, n in need.items())
        raise InputError(f"not enough disk space for {plan.workdir!r}: the run needs about "
                         f"{total / 1e6:.1f} MB ({parts}, +10 %) and its file system has "
                         f"{free / 1e6:.1f} MB free: free space there or choose another {spelled('out')}")


def resolve_selection(u, selection, analysis) -> dict:
    """The analysis' atoms, resolved here once (the tasks get them from selection.npz)."""
    try:
        return ANALYSIS_CLASSES[analysis].select(u, selection)
    except ValueError as exc:
        raise InputError(f"{spelled('select')}: {exc}; change the selection")
    except Exception as exc:  # MDAnalysis' SelectionError for a malformed selection
        raise InputError(f"{spelled('select', selection)} is not a valid MDAnalysis selection ({exc}); "
                         "see the MDAnalysis selection language")


def plan_for_resume(rundir) -> RunPlan:
    """The plan of an interrupted run, if its inputs are still the ones it was made from."""
    rundir = os.path.abspath(rundir)
    path = os.path.join(rundir, PLAN)
    if not os.path.exists(os.path.join(rundir, MARKER)) or not os.path.exists(path):
        raise InputError(f"--resume {rundir!r} is not a trajflow run (no {PLAN}): give the "
                         "--out folder of an earlier trajflow run")
    foreign = foreign_entries(rundir)
    if foreign:
        raise InputError(f"--resume {rundir!r}: {', '.join(foreign)} in it is a symbolic link "
                         "or not a plain file, which trajflow never writes through or reads "
                         "(the run's files would land elsewhere): replace it by the file or "
                         "folder itself, or start a new run")
    lock = RunLock(rundir).acquire("--resume")  # refused while the run still goes
    try:
        try:
            plan = RunPlan.load(path)
        except PlanError as exc:
            raise InputError(f"--resume: {exc}") from None
        if os.path.realpath(plan.workdir) != os.path.realpath(rundir):
            log.warning("--resume %s: its plan was made in %s; the run resumes where it is now "
                        "(a moved or copied run), and writes nothing there", rundir, plan.workdir)
            plan.workdir = rundir
            plan.shared_h5md = None  # a campaign's copy beside the old place: its own now
        plan = _resumable(plan, rundir)
        check_space(plan)
        keep_room(rundir)  # used up if the attempt before failed on a full disk
        plan.asked_at = time.time()  # this resume's time counts from now
        plan.save(path)
    except BaseException:
        lock.release()
        raise
    plan.lock = lock
    return plan


def _resumable(plan, rundir):
    """The plan, if its inputs and code are unchanged and it is not complete; else InputError."""
    for p in [plan.topology] + list(plan.trajectories):
        if not os.path.exists(p):
            raise InputError(f"--resume: input {p!r} of that run is gone; restore it or start "
                             "a new run")
    if input_checksum([plan.topology] + list(plan.trajectories)) != plan.input_checksum:
        raise InputError(f"--resume: the inputs of {rundir!r} changed since it was planned "
                         "(checksums differ); its parts cannot be mixed with new ones: start "
                         "a new run with another --out")
    if os.path.exists(plan.result_path()):
        raise InputError(f"--resume: {plan.result_path()!r} exists, the run is complete; "
                         "nothing to resume")
    factory = plan.factory or {}
    if factory.get("kind") in ("file", "pickle"):
        for path in (factory["source"], plan.path(factory["copy"])):
            if path and os.path.exists(path) and mda_analyses.file_checksum(path) != factory["checksum"]:
                raise InputError(f"--resume: the analysis code {path!r} changed since the run "
                                 "was planned; its parts cannot be mixed with new ones: start "
                                 "a new run with another --out")
    return plan


def fit_to_cores(plan: RunPlan, cores: int) -> RunPlan:
    """The plan for a pilot of `cores`: unchanged when its MPI ranks fit; else
    its blocks shared by `cores` ranks through the dynamic schedule (the result
    is the same, in the same order: bit for bit for the built-in analyses, up
    to rounding in a user analysis' aggregation), which is how a run resumed on the nodes
    left after one was lost goes on. Tasks mode and an MDAnalysis run() (tasks
    of one core each, which queue for a core) stay as they are."""
    if not plan.execution.collective or plan.n_blocks <= cores:
        return dataclasses.replace(plan, mpi_ranks=0) if plan.mpi_ranks else plan
    if plan.mpi_ranks == cores and plan.schedule == "dynamic":
        return plan  # fitted already (resolve, then the pilot it meets): said once
    log.warning("%s: the pilot has %d cores for %d blocks: %d MPI ranks share the blocks "
                "(dynamic schedule%s%s)", os.path.basename(plan.workdir), cores, plan.n_blocks,
                cores, "" if plan.schedule == "dynamic" else f", instead of {plan.schedule}",
                ", independent MPI-IO reads" if plan.mpi_reads == COLLECTIVE else "")
    # collective reads need every rank in each read, which the dynamic schedule cannot promise
    return dataclasses.replace(plan, mpi_ranks=cores, schedule="dynamic",
                               mpi_reads="independent")


def write_plan(plan: RunPlan) -> str:
    """Create RUNDIR and its folders and write plan.json; returns the plan's path. A
    write that fails half-way (a full disk, a quota) takes back what it wrote: the
    folder is left as the run's lock found it, never a run folder without its plan."""
    os.makedirs(plan.workdir, exist_ok=True)
    written = [name for name in FOLDERS + (MARKER, RESERVE, SELECTION, ANALYSIS_DIR, PLAN)
               if not os.path.lexists(plan.path(name))]
    try:
        for sub in FOLDERS:
            os.makedirs(plan.path(sub), exist_ok=True)
        with open_in_run(plan.path(MARKER), "w") as fh:
            fh.write("This folder is a trajflow run.\n")
        keep_room(plan.workdir)
        plan.save_selection(plan.selected)
        write_analysis_code(plan)
        return plan.save(plan.path(PLAN))
    except BaseException:
        for name in written:  # the write's own error is the one to raise
            with contextlib.suppress(OSError):
                remove_entry(plan.path(name))
        raise


def write_analysis_code(plan):
    """RUNDIR/analysis/: the user's analysis as the tasks load it (the factory file's
    copy and the modules beside it, or the pickled callable)."""
    if not (plan.factory and plan.factory.get("copy")):
        return
    os.makedirs(plan.path(ANALYSIS_DIR), exist_ok=True)
    if plan.factory_pickle is not None:
        with open_in_run(plan.path(plan.factory["copy"]), "wb") as fh:
            fh.write(plan.factory_pickle)
    else:
        with replaced_whole(plan.path(plan.factory["copy"])) as tmp:
            shutil.copyfile(plan.factory["source"], tmp)
        user_code.copy_modules(plan.factory.get("modules") or {}, plan.path(ANALYSIS_DIR))
