"""Kernels: coordinates of a chunk of frames in, results out.

Pure functions over numpy arrays around compiled inner loops (kernel_code.py):
`trajflow bench` measured the best numpy formulation of QCP at 1.3-2.1 us per
frame against mdtraj's 0.3-0.4 us, and numpy dihedrals at 27 us per frame
against a 20 us target; one compiled pass per frame, with no temporary
arrays, meets both.

Every pilot compiles the loops once before its first task (`python -m
trajflow.tasks.kernels`, a pre_bootstrap_0 command trajflow adds) into an
extension module in the kernel cache ($TRAJFLOW_KERNEL_CACHE, else
~/.cache/trajflow/kernels), named by the code's hash, Python and numpy: tasks
load it in milliseconds and never import numba. Without it (no C compiler,
or tasks started outside a pilot) the loops run through numba's JIT and its
on-disk cache; TRAJFLOW_KERNELS=jit asks for that path.

They know nothing of files, MPI or MDAnalysis universes (the shared counter's
atomic add works on any int64 array).
"""
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import sys
from typing import NamedTuple

import numpy as np


class Reference(NamedTuple):
    """A reference structure prepared once for many chunks."""
    centred_t: np.ndarray   # (3, N) float64, centred at its weighted centre
    weights: np.ndarray     # (N,) float64, mean 1 (ones when unweighted)
    g: float                # sum w |ref_c|^2


def prepare_reference(reference, weights=None) -> Reference:
    """Centre a reference structure (N, 3) and normalise weights as MDAnalysis'
    `rms.rmsd` does (relative to their mean)."""
    if isinstance(reference, Reference):
        return reference
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != 3 or ref.shape[0] == 0:
        raise ValueError(f"reference must have shape (n_atoms >= 1, 3), got {ref.shape}")
    if weights is None:
        w = np.ones(ref.shape[0])
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (ref.shape[0],):
            raise ValueError("weights must have one value per atom")
        w = w / w.mean()
    ref_c = ref - w @ ref / w.sum()
    g_ref = float(w @ np.einsum("ij,ij->i", ref_c, ref_c))
    return Reference(np.ascontiguousarray(ref_c.T), w, g_ref)


def qcp_rmsd(chunk, reference, weights=None):
    """RMSD after optimal superposition of every frame of `chunk` onto `reference`.

    chunk: (n_frames, n_atoms, 3), float32 or float64; reference: (n_atoms, 3)
    or a `Reference`. Each frame is centred (weighted), its correlation matrix
    with the reference built in float64, and QCP (Theobald 2005; Liu et al.
    2010) solved for the largest eigenvalue. Matches MDAnalysis `rms.rmsd(...,
    center=True, superposition=True)` frame by frame.
    """
    x = np.asarray(chunk)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"chunk must have shape (n_frames, n_atoms, 3), got {x.shape}")
    ref = prepare_reference(reference, weights)
    if x.shape[1] != ref.centred_t.shape[1]:
        raise ValueError(f"chunk has {x.shape[1]} atoms, reference has {ref.centred_t.shape[1]}")
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    out = np.empty(x.shape[0], dtype=np.float64)
    # coordinate-major (F, 3, N): the atom loop then runs over contiguous memory
    _entry("qcp_frames", x.dtype)(np.ascontiguousarray(x.transpose(0, 2, 1)), ref.centred_t,
                                  ref.weights, ref.g, out)
    return out


def dihedral_cos_sin(chunk, quads, boxes=None):
    """cos and sin of the dihedral angles given by atom index quadruplets.

    chunk: (n_frames, n_atoms, 3); quads: (n_dihedrals, 4) indices into the
    chunk's atom axis; boxes: (n_frames, 6) unit cells or None. Returns two
    (n_frames, n_dihedrals) arrays in MDAnalysis' `calc_dihedrals` convention.
    """
    quads = np.ascontiguousarray(quads, dtype=np.int64)
    out = _chain_cos_sin(chunk, quads, boxes)
    return out[:, :, 0, 0], out[:, :, 0, 1]


def backbone_features(chunk, chain, boxes=None):
    """[cos φ, sin φ, cos ψ, sin ψ] per residue for every frame of a chunk.

    chain: (n_residues, 5) indices of C(i-1), N, CA, C, N(i+1): φ is the
    dihedral of the first four, ψ of the last four. Returns (n_frames, 4 * n_residues).
    """
    out = _chain_cos_sin(chunk, np.ascontiguousarray(chain, dtype=np.int64), boxes)
    return out.reshape(out.shape[0], -1)


def _chain_cos_sin(chunk, chain, boxes):
    """(F, rows, n_dihedrals_per_row, 2) cos/sin of consecutive dihedrals along each row."""
    x = np.asarray(chunk)
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float64)
    n_frames = x.shape[0]
    cells = np.zeros((n_frames, 3, 3))
    kinds = np.zeros(n_frames, dtype=np.int64)  # 0 none, 1 orthorhombic, 2 triclinic
    if boxes is not None:
        boxes = np.asarray(boxes, dtype=np.float64)
        has_box = np.all(boxes[:, :3] > 0, axis=1)
        ortho = has_box & np.all(boxes[:, 3:] == 90.0, axis=1)
        kinds[ortho] = 1
        kinds[has_box & ~ortho] = 2
        if has_box.any():
            cells[has_box] = triclinic_vectors(boxes[has_box])
    out = np.empty((n_frames, chain.shape[0], chain.shape[1] - 3, 2))
    _entry("dihedral_rows", x.dtype)(np.ascontiguousarray(x), chain, cells, kinds, out)
    return out


def atomic_fetch_add(counter, value=1) -> int:
    """counter[0] += value as one atomic instruction, seen at once by every process
    that maps `counter`'s memory (an MPI shared-memory window); the old value."""
    return int(_entry("atomic_fetch_add")(counter, value))


def triclinic_vectors(boxes):
    """(n_frames, 6) [a, b, c, alpha, beta, gamma] to (n_frames, 3, 3) box vectors.

    Computed in float32 like MDAnalysis, so that wrapped vectors match it.
    """
    b = np.asarray(boxes, dtype=np.float32)
    a_len, b_len, c_len = b[:, 0], b[:, 1], b[:, 2]
    alpha, beta, gamma = (np.deg2rad(b[:, i].astype(np.float64)) for i in (3, 4, 5))
    vec = np.zeros((b.shape[0], 3, 3), dtype=np.float64)
    vec[:, 0, 0] = a_len
    vec[:, 1, 0] = b_len * np.cos(gamma)
    vec[:, 1, 1] = b_len * np.sin(gamma)
    cx = c_len * np.cos(beta)
    cy = c_len * (np.cos(alpha) - np.cos(beta) * np.cos(gamma)) / np.sin(gamma)
    vec[:, 2, 0] = cx
    vec[:, 2, 1] = cy
    vec[:, 2, 2] = np.sqrt(c_len.astype(np.float64) ** 2 - cx * cx - cy * cy)
    return vec.astype(np.float32).astype(np.float64)


def kernel_cache_dir():
    return os.environ.get("TRAJFLOW_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trajflow", "kernels")


def _cpu_features():
    """The CPU's instruction sets (Linux: the first `flags` line of /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def compiled_module_path():
    """Where the ahead-of-time build of kernel_code.py lives: a changed kernel,
    another Python or numpy (its C ABI), or another CPU gets a build of its own
    (it is compiled for the CPU of the node that builds it, as the JIT is: 1.3
    against 2.3 us per RMSD frame for generic x86-64 code, measured)."""
    with open(os.path.join(os.path.dirname(__file__), "kernel_code.py"), "rb") as f:
        key = hashlib.sha1(f.read())
    key.update(f"{sys.version}|{np.__version__}|{platform.machine()}|{_cpu_features()}".encode())
    name = f"trajflow_kernels_{key.hexdigest()[:16]}"
    return name, os.path.join(kernel_cache_dir(), name + importlib.machinery.EXTENSION_SUFFIXES[0])


# the compiled loops kernel_code.py exports (_f4/_f8: for float32/float64 input)
ENTRY_POINTS = ("qcp_frames_f4", "qcp_frames_f8", "dihedral_rows_f4", "dihedral_rows_f8",
                "xtc_decode", "atomic_fetch_add")
_ENTRY_POINTS = {}  # name -> callable, once loaded
COMPILED = None     # how they were loaded: "ahead of time" or "numba JIT"


def _entry(name, dtype=None):
    """A compiled loop; with `dtype`, its version for that input precision."""
    if not _ENTRY_POINTS:
        _load_entry_points()
    if dtype is not None:
        name += "_f4" if dtype == np.float32 else "_f8"
    return _ENTRY_POINTS[name]


def _load_entry_points():
    global COMPILED
    name, path = compiled_module_path()
    if os.environ.get("TRAJFLOW_KERNELS") != "jit" and os.path.exists(path):
        try:
            spec = importlib.util.spec_from_file_location(
                name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _ENTRY_POINTS.update({e: getattr(module, e) for e in ENTRY_POINTS})
            COMPILED = "ahead of time"
            return
        except (ImportError, AttributeError) as exc:  # a damaged build: the JIT still works
            print(f"trajflow: {path} could not be loaded ({exc}); using numba's JIT",
                  file=sys.stderr)
    from . import kernel_code
    _ENTRY_POINTS.update(kernel_code.jit_entry_points())
    COMPILED = "numba JIT"


def build_ahead_of_time():
    """Compile the kernels into the cache unless they are there; False (and why,
    on stderr) where that cannot be done here, e.g. without a C compiler."""
    name, path = compiled_module_path()
    if os.path.exists(path):
        return True
    try:
        from . import kernel_code
        kernel_code.build_extension(name, path)
        return True
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the JIT path
        print(f"trajflow: the kernels could not be compiled ahead of time ({exc}); tasks "
              f"will use numba's JIT cache", file=sys.stderr)
        return False


def warm_up():
    """Load (or compile) the kernels for float32 and float64 input before any
    rank's clock starts: like imports, that is start-up, not analysis."""
    for dtype in (np.float32, np.float64):
        x = np.zeros((1, 5, 3), dtype=dtype) + np.arange(15, dtype=dtype).reshape(1, 5, 3) ** 1.5
        qcp_rmsd(x, x[0])
        qcp_rmsd(x, x[0], np.ones(5))
        backbone_features(x, np.arange(5).reshape(1, 5), np.array([[10.0, 10, 10, 90, 90, 90]]))
        backbone_features(x, np.arange(5).reshape(1, 5))
    atomic_fetch_add(np.zeros(1, dtype=np.int64))  # a dynamic schedule's claims


def compile_task_modules():
    """Byte-compile trajflow.tasks where the install lets us (an editable install
    has no .pyc until first imported: +1.8 s for every rank of a fresh install,
    all at once, measured)."""
    import compileall
    compileall.compile_dir(os.path.dirname(__file__), quiet=2)


if __name__ == "__main__":  # the pilot's bootstrapper: build the kernels before any task
    import time
    t0 = time.time()
    compile_task_modules()
    build_ahead_of_time()
    warm_up()  # loads the build, or fills numba's cache where there is none
    print(f"trajflow: kernels ready ({COMPILED}) in {time.time() - t0:.1f} s")
