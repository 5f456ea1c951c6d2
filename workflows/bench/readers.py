"""`trajflow bench --readers`: trajflow's readers against the fastest peers, side by side.

XTC: the first frames of the large solvated AdK XTC (`--large-gb`, built once in
the cache) decoded whole by trajflow, MDAnalysis (xdrfile), mdtraj, chemfiles and
molly (a small Rust program built with `cargo` from crates.io into the cache),
in ns per decoded atom-frame; and trajflow's selective path (CA atoms, each frame
decoded up to the last one) in us per frame. Every peer's coordinates are checked
against trajflow's before any number is kept (float32 rounding: chemfiles gives
float64). A peer that is not installed is null, with the reason in the table.

H5MD: the same frames as one-frame chunks (1, atoms, 3) and as trajflow's copies
are laid out for the selection (h5md.chunk_shape), each uncompressed, gzip:1 and
lzf, read for the CA atoms by trajflow's block reader in us per frame, against
the DCD's rows; and, on every frame in the selection layout (written once into
the cache), one process against two side by side: E(2).
"""
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np

from trajflow.tasks.h5md import chunk_shape, H5MDWriter
from trajflow.tasks.readers import open_block_reader
from trajflow.tasks.xtc import XTCFile
from trajflow.workflows.bench.large import build_large
from trajflow.workflows.datasets import cache_dir

FRAMES = 50          # decoded by every XTC reader (47,681 atoms each)
H5MD_FRAMES = 400    # in each H5MD layout (a 230 MB file each)
READ_CHUNK = 50      # frames per read, as an analyze rank reads them
MOLLY_VERSION = "0.4"

_MOLLY_CARGO = f"""[package]
name = "trajflow-molly-bench"
version = "0.1.0"
edition = "2021"

[dependencies]
molly = "{MOLLY_VERSION}"

[profile.release]
lto = true
codegen-units = 1
"""

_MOLLY_MAIN = """// trajflow bench --readers: molly decoding the first N frames of an XTC, whole.
// Args: PATH N REPEATS OUT. Prints the best time in seconds; writes the positions
// (nm, f32, native endian) to OUT for trajflow's equality check.
use std::io::Write;
use std::time::Instant;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (path, n, repeats, out) = (&args[1], args[2].parse::<usize>().unwrap(),
                                   args[3].parse::<usize>().unwrap(), &args[4]);
    let mut best = f64::INFINITY;
    let mut frames: Vec<molly::Frame> = Vec::new();
    for _ in 0..repeats {
        let mut reader = molly::XTCReader::open(path)?;
        let mut got: Vec<molly::Frame> = Vec::with_capacity(n);
        let t = Instant::now();
        for _ in 0..n {
            let mut frame = molly::Frame::default();
            reader.read_frame(&mut frame)?;
            got.push(frame);
        }
        best = best.min(t.elapsed().as_secs_f64());
        frames = got;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    for frame in &frames {
        for v in &frame.positions {
            file.write_all(&v.to_ne_bytes())?;
        }
    }
    println!("{best}");
    Ok(())
}
"""


class PeerMissing(Exception):
    """A peer that cannot be measured here; the message says why."""


def _best(fn, launches):
    """(best seconds, the last value) of `launches` calls."""
    best, value = float("inf"), None
    for _ in range(launches):
        t = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t)
    return best, value


# --- XTC: one function per reader, each (seconds, coords (F, A, 3) Å) ---------------
def _ours(path, n, launches):
    xtc = XTCFile.open(path)
    return _best(lambda: xtc.read(np.arange(xtc.n_atoms), 0, n)[0], launches)


def _xdrfile(path, n, launches):
    from MDAnalysis.lib.formats.libmdaxdr import XTCFile as XDRFile

    def read():
        with XDRFile(path) as f:
            return np.stack([f.read().x for _ in range(n)])
    seconds, nm = _best(read, launches)
    return seconds, nm * np.float32(10.0)  # as MDAnalysis converts them


def _mdtraj(path, n, launches):
    try:
        from mdtraj.formats import XTCTrajectoryFile
    except ImportError as exc:
        raise PeerMissing(f"mdtraj is not installed ({exc}): pip install mdtraj")

    def read():
        with XTCTrajectoryFile(path, "r") as f:
            return f.read(n_frames=n)[0]
    seconds, nm = _best(read, launches)
    return seconds, nm * np.float32(10.0)


def _chemfiles(path, n, launches):
    try:
        import chemfiles
    except ImportError as exc:
        raise PeerMissing(f"chemfiles is not installed ({exc}): pip install chemfiles")
    chemfiles.set_warnings_callback(lambda message: None)

    def frame_positions(traj):
        frame = traj.read()  # alive while its positions (a view of its memory) are copied
        return np.array(frame.positions, dtype=np.float64)

    def read():
        with chemfiles.Trajectory(path) as traj:
            return np.stack([frame_positions(traj) for _ in range(n)])
    return _best(read, launches)  # float64 Å


def molly_binary(say=print):
    """The molly reader program, built with cargo into the cache once; PeerMissing
    where cargo is not installed or the build fails."""
    folder = os.path.join(cache_dir(), "molly-bench")
    binary = os.path.join(folder, "target", "release", "trajflow-molly-bench")
    if os.path.exists(binary):
        return binary
    cargo = shutil.which("cargo") or next(
        (p for p in [os.path.expanduser("~/.cargo/bin/cargo")] if os.path.exists(p)), None)
    if cargo is None:
        raise PeerMissing("cargo is not installed (https://rustup.rs): molly is a Rust crate")
    os.makedirs(os.path.join(folder, "src"), exist_ok=True)
    with open(os.path.join(folder, "Cargo.toml"), "w", encoding="utf-8") as fh:
        fh.write(_MOLLY_CARGO)
    with open(os.path.join(folder, "src", "main.rs"), "w", encoding="utf-8") as fh:
        fh.write(_MOLLY_MAIN)
    say(f"building molly {MOLLY_VERSION} from crates.io with cargo, once, into {folder}")
    proc = subprocess.run([cargo, "build", "--release", "-q"], cwd=folder, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0 or not os.path.exists(binary):
        raise PeerMissing(f"cargo build of molly failed: {proc.stderr.strip()[-300:]}")
    return binary


def _molly(path, n, launches, n_atoms):
    binary = molly_binary()
    out = os.path.join(cache_dir(), "molly-bench", f"positions.{os.getpid()}.f32")
    try:
        proc = subprocess.run([binary, path, str(n), str(launches), out], capture_output=True,
                              text=True, timeout=900)
        if proc.returncode != 0:
            raise PeerMissing(f"molly failed: {proc.stderr.strip()[-300:]}")
        nm = np.fromfile(out, np.float32).reshape(n, n_atoms, 3)
    finally:
        if os.path.exists(out):
            os.remove(out)
    return float(proc.stdout.split()[-1]), nm * np.float32(10.0)


def check_same(ours, theirs, who):
    """Bit for bit for float32 readers; within float32 rounding for a float64 one."""
    if theirs.shape != ours.shape:
        raise AssertionError(f"{who} read {theirs.shape}, trajflow {ours.shape}")
    if theirs.dtype == np.float32:
        if not np.array_equal(ours, theirs):
            raise AssertionError(f"{who}'s coordinates differ from trajflow's by up to "
                                 f"{np.abs(ours - theirs).max():.3g} Å")
        return
    tolerance = 2 * np.finfo(np.float32).eps * max(1.0, float(np.abs(ours).max()))
    worst = float(np.abs(ours.astype(np.float64) - theirs).max())
    if worst > tolerance:
        raise AssertionError(f"{who}'s coordinates differ from trajflow's by up to {worst:.3g} Å")


def xtc_readers(files, launches, n=FRAMES, say=print):
    """ns per decoded atom-frame of each reader, trajflow's selective us per frame."""
    import MDAnalysis as mda
    path = files["xtc"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ca = mda.Universe(files["top"]).select_atoms("name CA").indices
    xtc = XTCFile.open(path)
    n = min(n, xtc.n_frames)
    atoms = xtc.n_atoms
    seconds, ours = _ours(path, n, launches)
    row = {"ours_full_ns_per_atom": seconds / (n * atoms) * 1e9, "frames": n, "atoms": atoms,
           "selected_atoms": int(len(ca)), "last_selected_atom": int(ca.max())}
    xtc.read(ca, 0, n)  # learns how many bytes of each frame the CA atoms take
    sel_s, sel = _best(lambda: xtc.read(ca, 0, n)[0], launches)
    np.testing.assert_array_equal(sel, ours[:, ca])
    row["ours_selective_us_per_frame"] = sel_s / n * 1e6
    missing = {}
    peers = {"xdrfile": _xdrfile, "mdtraj": _mdtraj, "chemfiles": _chemfiles,
             "molly": lambda p, k, la: _molly(p, k, la, atoms)}
    for name, read in peers.items():
        key = f"{name}_ns_per_atom"
        try:
            seconds, theirs = read(path, n, launches)
            check_same(ours, theirs, name)  # a peer that differs is not timed, and said
            row[key] = seconds / (n * atoms) * 1e9
        except (PeerMissing, AssertionError) as exc:
            row[key], missing[name] = None, str(exc)
        say(f"  xtc {name}: " + (f"{row[key]:.1f} ns per atom" if row[key] is not None
                                 else missing[name]))
    return row, missing


# --- H5MD: the layouts side by side ---------------------------------------------------
def _write_layout(path, coords, times, selection_end, compression):
    """An H5MD of these frames as trajflow writes it; without a selection's end, its
    chunks are whole frames: one frame each at this size (572 KB a frame)."""
    tmp = f"{path}.tmp{os.getpid()}"
    w = H5MDWriter(tmp, coords.shape[1], len(coords), compression, selection_end=selection_end)
    for s in range(0, len(coords), READ_CHUNK):
        w.write(times[s:s + READ_CHUNK], coords[s:s + READ_CHUNK])
    w.close()
    os.replace(tmp, path)


def _read_span(path, idx, lo, hi):
    """Seconds to read frames [lo, hi) of the atoms idx as an analyze rank reads them."""
    reader = open_block_reader([path], idx, False)
    try:
        t = time.perf_counter()
        for _ in reader.chunks(lo, hi, READ_CHUNK):
            pass
        return time.perf_counter() - t
    finally:
        reader.close()


def _whole_copy(files, end, say):
    """Every frame of the large XTC in the selection's layout, once, in the cache: E(2)
    over a few hundred frames measured the CPU's caches (1.32 seen), not the reads."""
    path = files["xtc"][:-len(".xtc")] + f"_selection{end}.h5md"
    if os.path.exists(path):
        return path
    xtc = XTCFile.open(files["xtc"])
    say(f"writing every frame in the selection's layout once: {path}")
    tmp = f"{path}.tmp{os.getpid()}"
    w = H5MDWriter(tmp, xtc.n_atoms, xtc.n_frames, selection_end=end)
    for s in range(0, xtc.n_frames, 500):
        coords, times, _ = xtc.read(np.arange(xtc.n_atoms), s, min(s + 500, xtc.n_frames))
        w.write(times, coords)
    w.close()
    os.replace(tmp, path)
    return path


def _efficiency_2(path, idx):
    """(E(2), us per frame): one process reading every frame of `path` against two
    processes side by side reading half each (the slower of the two)."""
    import h5py
    with h5py.File(path, "r") as f:
        n = f["particles/trajectory/position/value"].shape[0]
    one = _read_span(path, idx, 0, n)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        two = max(pool.starmap(_read_span, [(path, idx, 0, n // 2), (path, idx, n // 2, n)]))
    return one / (2 * two), one / n * 1e6


MPIO_READ = """
import json, sys, time
import numpy as np
from mpi4py import MPI
from trajflow.tasks.readers import open_block_reader
path, way, n, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
idx = np.array([int(i) for i in sys.argv[5].split(",")])
comm = MPI.COMM_WORLD
lo, hi = n * comm.rank // comm.size, n * (comm.rank + 1) // comm.size
reader = open_block_reader([path], idx, False, comm=None if way == "sec2" else comm,
                           collective=way == "collective")
# agreed before the first read: a collective read waits for every rank
agreed = comm.allreduce(-(-(hi - lo) // chunk), op=MPI.MAX)
comm.Barrier()
t = time.perf_counter()
for _ in reader.chunks(lo, hi, chunk):
    pass
reader.h5.pad_collective(agreed)
seconds = comm.allreduce(time.perf_counter() - t, op=MPI.MAX)
driver = reader.h5.file.driver  # on every rank: for mpio, h5py's answer is a collective call
if comm.rank == 0:
    print(json.dumps({"seconds": seconds, "driver": driver, "mode": reader.h5.mpio_mode}))
reader.close()
"""
MPIO_WAYS = ("sec2", "independent", "collective")
COLLECTIVE_MODES = ("chunk collective", "chunk mixed", "contiguous collective")


def mpio_rows(path, idx, n, launches, chunk=READ_CHUNK):
    """us per frame of `path` read by 2 MPI ranks (half each, the slower's time), each
    opening the file on its own (sec2) and together through MPI-IO with independent
    and with collective reads; ({way: us}, None) or (None, why not) where this Python's
    h5py has no MPI (the parallel HDF5 environment of `make test-parallel-hdf5` has)."""
    import h5py
    if not h5py.get_config().mpi:
        return None, ("this Python's h5py is built without MPI; run the bench with the parallel "
                      "HDF5 environment's python (tests/parallel_hdf5/env.sh build prints it)")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    rows = {}
    for way in MPIO_WAYS:
        best = None
        for _ in range(launches):
            out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", MPIO_READ, path, way,
                                  str(n), str(chunk), ",".join(map(str, idx))],
                                 capture_output=True, text=True, check=True, timeout=600)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            if got["driver"] != ("sec2" if way == "sec2" else "mpio"):
                raise RuntimeError(f"{way}: the file was opened with driver {got['driver']}")
            if way == "collective" and got["mode"] not in (None,) + COLLECTIVE_MODES:
                raise RuntimeError(f"collective reads asked, HDF5 did: {got['mode']}")
            best = got["seconds"] if best is None else min(best, got["seconds"])
        rows[way] = best / n * 1e6
    return rows, None


def h5md_layouts(files, launches, n=H5MD_FRAMES, say=print):
    """us per frame of each layout and compression, DCD rows, E(2) of the selection layout."""
    import MDAnalysis as mda
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ca = mda.Universe(files["top"]).select_atoms("name CA").indices
    xtc = XTCFile.open(files["xtc"])
    n = min(n, xtc.n_frames)
    coords, times, _ = xtc.read(np.arange(xtc.n_atoms), 0, n)
    folder = os.path.join(cache_dir(), "h5md-layouts")
    os.makedirs(folder, exist_ok=True)
    rows = {}
    for layout, end in (("one_frame_chunks", None), ("selection_layout", int(ca.max()) + 1)):
        for compression in ("none", "gzip:1", "lzf"):
            chunks = "x".join(map(str, chunk_shape(xtc.n_atoms, n, end)))
            path = os.path.join(folder, f"solvated_{n}_{layout}_{chunks}_"
                                        f"{compression.replace(':', '')}.h5md")
            if not os.path.exists(path):
                _write_layout(path, coords, times, end, None if compression == "none"
                              else compression)
            seconds, _ = _best(lambda: _read_span(path, ca, 0, n), launches)
            rows[(layout, compression)] = seconds / n * 1e6
            say(f"  h5md {layout} {compression}: {rows[(layout, compression)]:.1f} us per frame")
    whole = _whole_copy(files, int(ca.max()) + 1, say)
    _read_span(whole, ca, 0, xtc.n_frames)  # from the page cache, as the others are
    efficiency, whole_us = max(_efficiency_2(whole, ca) for _ in range(launches))
    say(f"  h5md selection_layout, all {xtc.n_frames} frames: {whole_us:.1f} us per frame, "
        f"E(2) {efficiency:.2f}")
    dcd_s, _ = _best(lambda: _read_span(files["dcd"], ca, 0, n), launches)
    mpio, no_mpio = mpio_rows(whole, ca, xtc.n_frames, launches)
    say("  h5md selection_layout, 2 MPI ranks: " + (", ".join(
        f"{way} {us:.1f}" for way, us in mpio.items()) + " us per frame" if mpio else no_mpio))
    return {"mpio_2_ranks_us_per_frame": mpio, "mpio_missing": no_mpio,
            "one_frame_chunks_us_per_frame": rows[("one_frame_chunks", "none")],
            "selection_layout_us_per_frame": rows[("selection_layout", "none")],
            "dcd_rows_us_per_frame": dcd_s / n * 1e6,
            "selection_layout_efficiency_2": efficiency,
            "selection_layout_all_frames_us_per_frame": whole_us,
            "all_frames": xtc.n_frames,
            "frames": n,
            "compressed_us_per_frame": {f"{layout} {c}": v for (layout, c), v in rows.items()
                                        if c != "none"}}


def run_readers(gb=2.0, launches=3, say=print):
    """{"xtc": {...}, "h5md": {...}, "missing": {peer: why}}: the numbers of --json."""
    files = build_large(gb, say)
    xtc, missing = xtc_readers(files, launches, say=say)
    return {"xtc": xtc, "h5md": h5md_layouts(files, launches, say=say), "missing": missing,
            "xtc_file": files["xtc"], "xtc_bytes": files["bytes"]["xtc"]}


def format_readers(result):
    """The printed table, with ratios to trajflow."""
    x, h, missing = result["xtc"], result["h5md"], result["missing"]
    ours = x["ours_full_ns_per_atom"]
    lines = [f"XTC readers, {x['frames']} frames of {x['atoms']:,} atoms decoded whole "
             f"({result['xtc_file']}):",
             f"  {'reader':12s} {'ns/atom':>8s} {'their time':>12s}",
             f"  {'trajflow':12s} {ours:8.1f} {'1.00x':>12s}"]
    for peer in ("xdrfile", "mdtraj", "chemfiles", "molly"):
        v = x[f"{peer}_ns_per_atom"]
        lines.append(f"  {peer:12s} " + (f"{v:8.1f} {v / ours:11.2f}x" if v is not None
                                         else f"{'-':>8s}  not measured: {missing[peer]}"))
    lines.append(f"  trajflow selective ({x['selected_atoms']} CA, decoded up to atom "
                 f"{x['last_selected_atom']}): {x['ours_selective_us_per_frame']:.1f} us per "
                 f"frame")
    dcd = h["dcd_rows_us_per_frame"]
    lines += [f"H5MD layouts, CA of {h['frames']} frames, us per frame (vs DCD rows):",
              f"  one frame per chunk      {h['one_frame_chunks_us_per_frame']:8.1f} "
              f"({h['one_frame_chunks_us_per_frame'] / dcd:.2f}x)",
              f"  laid out for selection   {h['selection_layout_us_per_frame']:8.1f} "
              f"({h['selection_layout_us_per_frame'] / dcd:.2f}x); all "
              f"{h['all_frames']} frames: {h['selection_layout_all_frames_us_per_frame']:.1f}, "
              f"E(2) {h['selection_layout_efficiency_2']:.2f}",
              f"  DCD rows                 {dcd:8.1f}"]
    lines += [f"  {name:24s} {v:8.1f} ({v / dcd:.2f}x)"
              for name, v in sorted(h["compressed_us_per_frame"].items())]
    mpio = h.get("mpio_2_ranks_us_per_frame")
    if mpio:
        own = mpio["sec2"]
        lines.append(f"H5MD selection layout, all {h['all_frames']} frames, 2 MPI ranks, us per "
                     "frame: " + "; ".join(f"{way} {us:.1f} ({us / own:.2f}x)"
                                           for way, us in mpio.items())
                     + " (sec2: each rank opens the file on its own)")
    else:
        lines.append(f"H5MD through MPI-IO, 2 ranks: not measured: {h.get('mpio_missing')}")
    return "\n".join(lines)
