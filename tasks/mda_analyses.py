"""Any parallelisable MDAnalysis analysis, run block by block through MDAnalysis' own machinery.

The user names a factory, `NAME(universe, **args) -> AnalysisBase` (in a file
or a module). Each analyze rank or task builds its own Universe and its own
analysis object with it, exactly as a serial script would, and runs its
block with `_compute` (what MDAnalysis' parallel backends run per worker);
reduce builds one more object, merges the blocks' `results` with the class'
own `_get_aggregator()` and calls `_conclude()`, as `AnalysisBase.run()`
does. So a result equals a serial `run()` of the same object.

Example factory file (`rdf.py`), run with `--analysis rdf.py:water_rdf`::

    from MDAnalysis.analysis.rdf import InterRDF

    def water_rdf(u, nbins=75):
        water = u.select_atoms("name OW")
        return InterRDF(water, water, nbins=nbins, exclusion_block=(1, 1))
"""
import contextlib
import hashlib
import importlib
import importlib.util
import io
import logging
import os
import pickle
import sys
import time
import warnings
from collections.abc import Mapping

import numpy as np

from .combine import FRAME_AXES, FRAME_ROWS

log = logging.getLogger(__name__)


# the name a factory file is imported under, in the workstation, the analyze
# tasks and reduce alike, so that results pickled by one unpickle in another
FACTORY_MODULE = "trajflow_user_analysis"
# how often (frames, or seconds) the per-frame reader and analysis times become intervals
INTERVAL_FRAMES = 64
INTERVAL_S = 2.0


def file_checksum(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def parse_spec(spec):
    """'FILE.py:NAME' or 'package.module:NAME' -> (kind, source, name), and a name of
    MERGED_ANALYSES as trajflow's own module; ValueError if neither."""
    from .analyses import MERGED_ANALYSES, MERGED_MODULE
    if spec in MERGED_ANALYSES:
        return "module", MERGED_MODULE, spec
    source, sep, name = spec.rpartition(":")
    if not sep or not source or not name.isidentifier():
        raise ValueError(f"{spec!r} is neither rmsd, dihedrals, rmsf, pca, FILE.py:NAME nor module:NAME")
    if source.endswith(".py") or os.sep in source:
        return "file", source, name
    if not all(part.isidentifier() for part in source.split(".")):
        raise ValueError(f"{source!r} in {spec!r} is neither a .py file nor a module name")
    return "module", source, name


def load_factory(kind, source, name):
    """The factory callable; ImportError/AttributeError/TypeError with the reason if not.

    kind "file" and "module" name it; kind "pickle" is a callable a Python
    script handed over (a function or lambda of the script, pickled by value
    with cloudpickle into `source`)."""
    if kind == "pickle":
        import cloudpickle
        with open(source, "rb") as fh:
            return cloudpickle.load(fh)
    if kind == "file":
        if not os.path.isfile(source):
            raise ImportError(f"factory file {source!r} does not exist")
        # its own modules beside it import as they do for the user (in RUNDIR/analysis/
        # they are copied beside the copy: workflows/run/user_code.py)
        folder = os.path.dirname(os.path.abspath(source))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_spec = importlib.util.spec_from_file_location(FACTORY_MODULE, source)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[FACTORY_MODULE] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(source)
    if not hasattr(module, name):
        raise AttributeError(f"{source!r} has no {name!r}")
    factory = getattr(module, name)
    if not callable(factory):
        raise TypeError(f"{source}:{name} is a {type(factory).__name__}, not a callable")
    return factory


class AnalysisRaised(Exception):
    """The analysis' own code raised (the factory, `_prepare`, `_single_frame`,
    `_conclude`, its aggregator), not the reader: the same input raises again, so
    the task exits with exit_codes.ANALYSIS_RAISED and is not retried."""


def print_users_traceback(exc, file=None):
    """An AnalysisRaised on stderr as the user's own error: the traceback of what their
    code raised (not trajflow's frames around it), then one line saying which code."""
    import traceback
    file = file or sys.stderr
    if exc.__cause__ is not None:
        traceback.print_exception(exc.__cause__, file=file)
    print(f"trajflow: {exc}", file=file, flush=True)


class ReaderFailed(Exception):
    """Reading a frame failed (a file-system error, a damaged file): what a retry,
    elsewhere or later, may cure."""


@contextlib.contextmanager
def users_code(what):
    """Turn an exception of the code inside into AnalysisRaised (the cause kept for the
    traceback); ReaderFailed, and the machine's own errors (memory, the file system: a
    retry elsewhere or later may cure them), pass as they are."""
    try:
        yield
    except (ReaderFailed, MemoryError, OSError):
        raise
    except Exception as exc:
        raise AnalysisRaised(f"{what} raised {type(exc).__name__}: {exc}") from exc


class AnalysisRefused(ValueError):
    """What a factory returned cannot run split over blocks; the message says why and what to do."""


def build_analysis(factory, universe, args):
    """Call the factory and check what it returns can be split over frames.

    AnalysisRefused with what is wrong and what to do (whatever the factory
    itself raises passes through), else the analysis object.
    """
    from MDAnalysis.analysis.base import AnalysisBase
    from .parallel_analyses import parallel_version
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = factory(universe, **args)
    if not isinstance(analysis, AnalysisBase):
        name = type(analysis).__name__
        raise AnalysisRefused(f"it returned {'an' if name[:1] in 'AEIOU' else 'a'} {name}, not an "
                              "MDAnalysis analysis (an AnalysisBase instance); return the "
                              "analysis object, unrun")
    analysis = parallel_version(analysis)  # MDAnalysis' RMSF and PCA, merged over blocks
    if getattr(analysis, "_trajectory", None) is not universe.trajectory:
        raise AnalysisRefused("the analysis it returned is not built on the Universe it was given; "
                         "select the atoms from the `universe` argument")
    cls = type(analysis).__name__
    if not analysis.parallelizable:
        raise AnalysisRefused(
            f"{cls} does not declare itself parallelisable (MDAnalysis: "
            f"{cls}._analysis_algorithm_is_parallelizable is False, its only backend is "
            f"{analysis.get_supported_backends()!r}): its frames cannot be split over blocks. "
            "Run it serially with MDAnalysis (analysis.run()), or, for your own class, make it "
            "parallel: set _analysis_algorithm_is_parallelizable = True, add a classmethod "
            "get_supported_backends() returning ('serial', 'multiprocessing', 'dask') and a "
            "_get_aggregator() returning a ResultsGroup that says how each result combines")
    return analysis


NOT_IMPORTED = {}  # MDAnalysis' analysis modules that parallelisable_classes could not import


def parallelisable_classes():
    """{class name: module} of the installed MDAnalysis' analyses that declare
    themselves parallelisable: the ones `--analysis FILE.py:NAME` can run."""
    import pkgutil
    import MDAnalysis.analysis as package
    from MDAnalysis.analysis.base import AnalysisBase
    skipped = (".legacy", ".tests", ".encore", ".hbonds")  # old, test or serial-only code

    def modules(path, prefix):
        """The modules under `path`; a skipped package is not even imported (its import
        warns about optional dependencies and moved modules)."""
        for info in pkgutil.iter_modules(path, prefix):
            if any(info.name.endswith(part) or part + "." in info.name for part in skipped):
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001 - optional dependencies missing
                NOT_IMPORTED[info.name] = f"{type(exc).__name__}: {exc}"
                log.warning("MDAnalysis' %s cannot be imported here (%s): its analyses are "
                            "not offered", info.name, NOT_IMPORTED[info.name])
                continue
            yield module
            if info.ispkg:
                yield from modules(module.__path__, info.name + ".")

    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for module in modules(package.__path__, package.__name__ + "."):
            for name, obj in vars(module).items():
                if (isinstance(obj, type) and issubclass(obj, AnalysisBase)
                        and obj.__module__ == module.__name__
                        and obj._analysis_algorithm_is_parallelizable):
                    found[name] = module.__name__
    return dict(sorted(found.items()))


class TimedFrames:
    """The frames `_compute` iterates, with the reader's time (io) and the time the
    analysis spends on each frame (compute) told apart.

    MDAnalysis' own per-frame timings do not separate the two. Every
    INTERVAL_FRAMES frames, or INTERVAL_S seconds for a slow analysis, the sums
    become one io and one compute interval of the rank's record (about 4 us per
    frame of overhead, measured on AdK DCD). The frames of each interval count to
    the rank's progress when it closes, so a slow analysis' bar moves at least
    every 2 s, and the per-frame loop does nothing more than time the frame.
    """

    def __init__(self, frames, timer, block):
        self.frames = frames
        self.timer = timer
        self.block = block

    def __len__(self):
        return len(self.frames)

    def __iter__(self):
        it = iter(self.frames)
        clock = time.time
        t_io = t_compute = 0.0
        span_start, n, flushed = clock(), 0, 0
        self.timer.inject("io")  # testing hooks (timing.py): within the first frame's times
        while True:
            t0 = clock()
            try:
                ts = next(it, None)
            except Exception as exc:
                raise ReaderFailed(f"reading frame {self.frames_read(n)} failed: "
                                   f"{type(exc).__name__}: {exc}") from exc
            t1 = clock()
            t_io += t1 - t0
            if ts is None:
                break
            if n == 0:
                self.timer.inject("compute")
            yield ts
            t2 = clock()
            t_compute += t2 - t1
            n += 1
            if n % INTERVAL_FRAMES == 0 or t2 - span_start >= INTERVAL_S:
                span_start, t_io, t_compute = self._flush(span_start, t_io, t_compute,
                                                          n - flushed)
                flushed = n
        self._flush(span_start, t_io, t_compute, n - flushed)

    def frames_read(self, n):
        """The global number of the block's `n`th frame, for messages."""
        try:
            return self.frames[n].frame
        except Exception:  # noqa: only a message depends on it
            return f"#{n} of the block"

    def _flush(self, span_start, t_io, t_compute, frames):
        """One io then one compute interval holding the sums since `span_start`, and the
        `frames` they covered counted to the rank's progress."""
        self.timer.add("io", span_start, span_start + t_io)
        self.timer.add("compute", span_start + t_io, span_start + t_io + t_compute)
        self.timer.progress(frames)
        return span_start + t_io + t_compute, 0.0, 0.0


class CopiedFrames:
    """A block's frames read from trajflow's own H5MD (a split segment or the H5MD
    copy), seen as the whole trajectory's frames.

    The analysis was built and prepared on the whole trajectory, as in a serial
    run, so positions taken when it was built and reference frames are a
    serial run's. Each frame it then iterates is read from the H5MD file (rows
    `first_row`...) and copied into the Universe's Timestep: the input's own
    float32 positions (velocities and forces where it had them), global frame
    number, time and exact box, the Universe's transformations applied as its
    own reader would.
    """

    def __init__(self, path, first_row, numbers, trajectory):
        """Rows first_row... of `path` are the global frames `numbers`."""
        self.path, self.first_row, self.numbers, self.n = path, first_row, numbers, len(numbers)
        self.trajectory = trajectory

    def __len__(self):
        return self.n

    def __iter__(self):
        import h5py
        from .h5md import DIMENSIONS, particle_group, WRITTEN_TIME
        with h5py.File(self.path, "r") as f:
            group = particle_group(f)
            data = {name: group[name]["value"] for name in ("position", "velocity", "force")
                    if name in group}
            rows = slice(self.first_row, self.first_row + self.n)
            boxes = f[DIMENSIONS][rows]  # the block's boxes and times in one read each
            # the time written in the frame's file, as MDAnalysis gives `ts.time` (a chain's
            # H5MD time is cumulative); a copy made before it was kept: the H5MD time
            copied = WRITTEN_TIME in f  # trajflow's copy: its times hold the reader's offset
            times = (f[WRITTEN_TIME] if copied else group["position/time"])[rows]
            for i in range(self.n):
                row = self.first_row + i
                ts = self.trajectory.ts  # a ChainReader swaps its Timestep between files
                ts.positions = data["position"][row]
                if "velocity" in data:
                    ts.velocities = data["velocity"][row]
                if "force" in data:
                    ts.forces = data["force"][row]
                ts.dimensions = boxes[i]
                ts.frame = int(self.numbers[i])
                # the Timestep adds its reader's time_offset to what is set; a copy's time has it
                ts.time = float(times[i]) - (float(ts.data.get("time_offset", 0.0))
                                               if copied else 0.0)
                yield self.trajectory._apply_transformations(ts)


def time_frame_loop(analysis, timer, block, block_frames=None):
    """Make `_compute` iterate its frames through TimedFrames (io and compute told
    apart). `block_frames()`: where the frames come from instead of the
    analysis' own sliced trajectory (a split segment)."""
    prepare_sliced = analysis._prepare_sliced_trajectory

    def timed_slices(slicer):
        prepare_sliced(slicer)
        frames = block_frames() if block_frames is not None else analysis._sliced_trajectory
        analysis._sliced_trajectory = TimedFrames(frames, timer, block)

    analysis._prepare_sliced_trajectory = timed_slices


def open_analysis(plan, topology_and_trajectory, timer=None):
    """A Universe on the given files and the user's analysis built on it."""
    from .readers import open_universe
    topology, files = topology_and_trajectory
    u = open_universe(topology, files, timer, plan.universe, plan.reader_keywords(files))
    with users_code("the analysis' factory"):
        factory = load_factory(*plan_factory(plan))
        return u, build_analysis(factory, u, plan.analysis_args)


def plan_factory(plan):
    """(kind, source, name) of the plan's factory: a file copied into RUNDIR, a module,
    or a pickled callable in RUNDIR."""
    if plan.factory.get("kind") == "pickle":
        return "pickle", plan.path(plan.factory["copy"]), plan.factory["name"]
    kind, source, name = parse_spec(plan.analysis)
    if kind == "file":
        source = plan.path(plan.factory["copy"])
    return kind, source, name


# a user analysis' part: its frames and times, and each chunk's pickled `results` with
# its size; the class' own rules (its aggregator) merge the results in reduce
PART_COMBINE = {**FRAME_AXES, "results_pickle": FRAME_ROWS, "results_pickle_size": FRAME_ROWS}


def shared_universe(universe):
    """deepcopy's memo for a copy of an analysis: its Universe and reader stay one (a
    fresh dict each copy: deepcopy fills it)."""
    return {id(universe): universe, id(universe.trajectory): universe.trajectory}


def merge_pieces(analysis, pieces):
    """The pieces' `results` merged by the class' declared rules (its aggregator, a
    ResultsGroup); AnalysisRaised naming a result that has no rule."""
    cls = type(analysis).__name__
    with users_code(f"{cls}._get_aggregator()"):
        aggregator = analysis._get_aggregator()
    keys = set(pieces[0]) if pieces else set()
    lookup = getattr(aggregator, "_lookup", None) or {}  # None: MDAnalysis' default, no rule
    if len(pieces) > 1 and isinstance(lookup, Mapping) and keys - set(lookup):
        missing = ", ".join(sorted(map(str, keys - set(lookup))))
        raise AnalysisRaised(
            f"{cls}'s results cannot be combined from pieces of frames: no rule for "
            f"results.{missing.replace(', ', ', results.')}; declare each in "
            f"{cls}._get_aggregator() (ResultsGroup(lookup={{name: "
            "ResultsGroup.ndarray_vstack, ...})), or compute it in _conclude()")
    with users_code(f"{cls}'s aggregator"):
        return aggregator.merge(pieces)


def run_in_pieces(analysis, universe, frames, n_pieces):
    """What MDAnalysis' run() does with a parallel backend, in this process: `frames`
    in `n_pieces` groups, each on its own copy of the analysis (the Universe shared),
    the pieces merged by the class' rules, then `_conclude()`. MDAnalysis' serial
    backend with n_parts > 1 would hand every group the same object instead."""
    import copy
    analysis._setup_frames(analysis._trajectory, frames=frames)
    groups = analysis._setup_computation_groups(n_parts=n_pieces, frames=frames)
    cls = type(analysis).__name__
    pieces = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for group in groups:
            with users_code(f"copying {cls} for a piece of frames"):
                piece = copy.deepcopy(analysis, shared_universe(universe))
            with users_code(cls):
                piece._compute(group)
            pieces.append(piece)
        analysis.frames = np.hstack([p.frames for p in pieces])
        analysis.times = np.hstack([p.times for p in pieces])
        analysis.results = merge_pieces(analysis, [p.results for p in pieces])
        with users_code(cls):
            analysis._conclude()
    return analysis


class UserChunks:
    """The user's analysis over chunks: `analyze(chunk)` -> its arrays for a part.

    Each chunk is one of MDAnalysis' computation groups: `_compute` on (position
    in the run's frames, frame number) pairs, on a fresh copy of the analysis as
    built and set up (MDAnalysis' parallel backends send each group a pickled
    copy; here the copy shares the Universe). Arrays: `frame` and `time`
    (global, one per frame, from the analysis itself), `results_pickle` (the
    chunk's `results`, pickled, as bytes) and `results_pickle_size` (one per
    chunk), so the gathers move it like any array.
    """

    def __init__(self, plan, timer, one_chunk):
        self.plan, self.timer, self.one_chunk = plan, timer, one_chunk
        # the whole trajectory: the factory sees frame 0 and the frame numbers of a
        # serial run; with split or h5md io a chunk's frames then come from
        # trajflow's own H5MD (CopiedFrames)
        files = [plan.h5md_path()] if plan.reads_h5md_input else plan.trajectories
        self.universe, self.template = open_analysis(plan, (plan.topology, files), timer)
        # the whole run's frames, as run() does (the whole frames of a truncated input)
        self.template._setup_frames(self.template._trajectory, **plan.mda_frames())

    def _fresh(self):
        """The analysis as set up, for one chunk: the object itself when the task has
        one chunk, else a copy each."""
        if self.one_chunk:
            return self.template
        import copy
        with users_code(f"copying {type(self.template).__name__} for a chunk of frames"):
            return copy.deepcopy(self.template, shared_universe(self.universe))

    def analyze(self, chunk):
        plan, timer = self.plan, self.timer
        frames = plan.frame_numbers(chunk.start, chunk.stop)
        analysis = self._fresh()
        copied = plan.io_strategy.copied_frames(plan, chunk.block)
        if copied is not None:
            path, first_row = copied
            copied = (path, first_row + chunk.start - plan.blocks[chunk.block][0])
        time_frame_loop(analysis, timer, chunk.block, None if copied is None else (
            lambda: CopiedFrames(*copied, frames, self.universe.trajectory)))
        with warnings.catch_warnings(), users_code(type(analysis).__name__):
            warnings.simplefilter("ignore")
            # (position in the run's frames, frame number), as MDAnalysis' computation groups
            analysis._compute(np.stack([np.arange(chunk.start, chunk.stop), frames], axis=1))
        blob = np.frombuffer(pickle.dumps(analysis.results, protocol=pickle.HIGHEST_PROTOCOL),
                             dtype=np.uint8)
        timer.count(frames=len(frames))
        return {"frame": np.asarray(analysis.frames, dtype=np.int64),
                "time": np.asarray(analysis.times, dtype=np.float64),
                "results_pickle": blob, "results_pickle_size": np.array([blob.size], np.int64)}

    def attrs(self):
        return {"analysis": self.plan.analysis, "selection": self.plan.selection,
                "analysis_class": type(self.template).__name__}

    def agree_on_collective_reads(self, chunk):
        """Nothing: MDAnalysis reads a user's frames, never collectively (planning refuses
        collective reads for them)."""

    def even_up_collective_reads(self):
        """Nothing, as above."""

    def close(self):
        self.universe.trajectory.close()


def conclude(plan, arrays):
    """One analysis object over the whole trajectory, the blocks' results merged by
    its class' aggregator, then `_conclude()`: what `AnalysisBase.run()` does."""
    u, analysis = open_analysis(plan, (plan.topology, plan.trajectories))
    analysis._setup_frames(analysis._trajectory, **plan.mda_frames())
    bounds = np.concatenate([[0], np.cumsum(arrays["results_pickle_size"])])
    blob = arrays["results_pickle"].tobytes()
    pieces = [pickle.loads(blob[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    analysis.frames = arrays["frame"]
    analysis.times = arrays["time"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis.results = merge_pieces(analysis, pieces)
        with users_code(type(analysis).__name__):
            analysis._conclude()
    u.trajectory.close()
    return analysis


# --- result.h5: MDAnalysis Results as HDF5 -----------------------------------
PICKLE_SUFFIX = ".pickle"


TEXT_DTYPE = "numpy_dtype"  # attribute of a dataset of text: the numpy dtype it came from


def write_results(group, results):
    """Arrays, numbers and text as datasets, nested Results/dicts as groups, anything
    else (objects, ragged lists) as a pickled blob `<name>.pickle` (read back only
    where the reader trusts the file's writer: see read_results)."""
    for key, value in results.items():
        key = str(key)
        if isinstance(value, Mapping):  # MDAnalysis' Results is a UserDict
            write_results(group.create_group(key), value)
            continue
        array = _as_plain_array(value)
        text = None if array is not None else _as_text_array(value)
        if array is not None:
            group.create_dataset(key, data=array)
        elif text is not None:  # DSSP's letters, names: UTF-8 bytes, the dtype kept
            ds = group.create_dataset(key, data=np.char.encode(text, "utf-8"))
            ds.attrs[TEXT_DTYPE] = "str" if isinstance(value, str) else text.dtype.str
        else:
            ds = group.create_dataset(key + PICKLE_SUFFIX,
                                      data=np.void(pickle.dumps(value, protocol=4)))
            ds.attrs["encoding"] = f"python pickle of a {type(value).__module__}.{type(value).__name__}"


def _as_text_array(value):
    """A numpy array of str for a str or a numpy array of str that UTF-8 can encode (a
    list stays a list, and text with lone surrogates is pickled); None otherwise."""
    if isinstance(value, np.ndarray) and value.dtype.kind == "U" or isinstance(value, str):
        array = np.asarray(value)
        try:
            np.char.encode(array, "utf-8")
        except UnicodeEncodeError:
            return None
        return array
    return None


def _as_plain_array(value):
    """A numeric/boolean numpy array for `value`, or None if it is not one."""
    if isinstance(value, (bool, int, float, complex, np.generic)) and not isinstance(value, str):
        return np.asarray(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        return value
    if isinstance(value, (list, tuple)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                array = np.asarray(value)
        except ValueError:  # ragged
            return None
        return array if array.dtype.kind in "biufc" else None
    return None


class PickledNotLoaded:
    """A result stored with pickle, left unread: unpickling runs whatever code the
    writer of the file put in it, so it is loaded only where the reader trusts them."""

    def __init__(self, key, stored_as):
        self.key, self.stored_as = key, stored_as

    def __repr__(self):
        return (f"<{self.key}: not loaded ({self.stored_as}); open_run(RUN, trust=True) if "
                "you trust who wrote the run>")


def read_results(group, trust=False):
    """The inverse of write_results: an MDAnalysis Results. Objects stored with pickle
    are unpickled only with `trust`; otherwise each is a PickledNotLoaded."""
    import h5py
    from MDAnalysis.analysis.results import Results
    out = Results()
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            out[key] = read_results(item, trust)
        elif key.endswith(PICKLE_SUFFIX):
            name = key[:-len(PICKLE_SUFFIX)]
            out[name] = pickle.load(io.BytesIO(item[()].tobytes())) if trust else \
                PickledNotLoaded(name, str(item.attrs.get("encoding", "a python pickle")))
        elif TEXT_DTYPE in item.attrs:
            text = np.char.decode(np.asarray(item[()]), "utf-8")
            kind = str(item.attrs[TEXT_DTYPE])
            out[key] = str(text) if kind == "str" else text.astype(np.dtype(kind))
        else:
            value = item[()]
            out[key] = value.item() if item.shape == () else value
    return out
