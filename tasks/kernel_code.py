"""The compiled inner loops of kernels.py, and their ahead-of-time build.

Numba-compatible Python. Where a C compiler is available the pilot compiles
them once, ahead of time, into an extension module (numba.pycc) that tasks
load without importing numba: numba's import and the loading of its cached
code were 1.0 s of every task's 1.4 s start-up (measured). Elsewhere they run
through numba's JIT with its on-disk cache. Only kernels.py imports this module.
"""
import os
import shutil
import sys
import tempfile

import numpy as np
from numba import njit

from .kernels import PRECISIONS

# Newton-Raphson on the QCP characteristic polynomial converges quadratically
# from the upper bound E0; 50 iterations is a safety net, not the norm.
_QCP_MAX_ITER = 50


# reassociation lets the compiler vectorise the atom sums; every sum is float64
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _qcp_frames(xt, ref_t, w, g_ref, out):
    """One pass per frame: sum w x, sum w |x|^2 and the correlation sum w x ref_c.

    The reference is centred (sum w ref_c = 0), so the frame's centre drops
    out of the correlation, and G = sum w |x|^2 - |sum w x|^2 / W.
    """
    n_frames, n_atoms = xt.shape[0], xt.shape[2]
    sum_w = 0.0
    for n in range(n_atoms):
        sum_w += w[n]
    r0, r1, r2 = ref_t[0], ref_t[1], ref_t[2]
    for f in range(n_frames):
        x0, x1, x2 = xt[f, 0], xt[f, 1], xt[f, 2]
        s0 = s1 = s2 = g = 0.0
        sxx = sxy = sxz = syx = syy = syz = szx = szy = szz = 0.0
        for n in range(n_atoms):
            wn = w[n]
            a0, a1, a2 = np.float64(x0[n]), np.float64(x1[n]), np.float64(x2[n])
            g += wn * (a0 * a0 + a1 * a1 + a2 * a2)
            a0, a1, a2 = wn * a0, wn * a1, wn * a2
            s0 += a0
            s1 += a1
            s2 += a2
            sxx += a0 * r0[n]
            sxy += a0 * r1[n]
            sxz += a0 * r2[n]
            syx += a1 * r0[n]
            syy += a1 * r1[n]
            syz += a1 * r2[n]
            szx += a2 * r0[n]
            szy += a2 * r1[n]
            szz += a2 * r2[n]
        g -= (s0 * s0 + s1 * s1 + s2 * s2) / sum_w
        e0 = 0.5 * (g + g_ref)
        lam = _qcp_max_eigenvalue(sxx, sxy, sxz, syx, syy, syz, szx, szy, szz, e0)
        out[f] = np.sqrt(abs(2.0 * (e0 - lam) / n_atoms))


@njit(cache=True, nogil=True)
def _qcp_max_eigenvalue(sxx, sxy, sxz, syx, syy, syz, szx, szy, szz, e0):
    """Largest eigenvalue of the QCP key matrix by Newton-Raphson (MDAnalysis' qcprot terms)."""
    sxx2, syy2, szz2 = sxx * sxx, syy * syy, szz * szz
    sxy2, syz2, sxz2 = sxy * sxy, syz * syz, sxz * sxz
    syx2, szy2, szx2 = syx * syx, szy * szy, szx * szx
    syzszymsyyszz2 = 2.0 * (syz * szy - syy * szz)
    sxx2syy2szz2syz2szy2 = syy2 + szz2 - sxx2 + syz2 + szy2
    c2 = -2.0 * (sxx2 + syy2 + szz2 + sxy2 + syx2 + sxz2 + szx2 + syz2 + szy2)
    c1 = 8.0 * (sxx * syz * szy + syy * szx * sxz + szz * sxy * syx
                - sxx * syy * szz - syz * szx * sxy - szy * syx * sxz)
    sxzpszx, syzpszy, sxypsyx = sxz + szx, syz + szy, sxy + syx
    syzmszy, sxzmszx, sxymsyx = syz - szy, sxz - szx, sxy - syx
    sxxpsyy, sxxmsyy = sxx + syy, sxx - syy
    sxy2sxz2syx2szx2 = sxy2 + sxz2 - syx2 - szx2
    c0 = (sxy2sxz2syx2szx2 * sxy2sxz2syx2szx2
          + (sxx2syy2szz2syz2szy2 + syzszymsyyszz2) * (sxx2syy2szz2syz2szy2 - syzszymsyyszz2)
          + (-sxzpszx * syzmszy + sxymsyx * (sxxmsyy - szz))
          * (-sxzmszx * syzpszy + sxymsyx * (sxxmsyy + szz))
          + (-sxzpszx * syzpszy - sxypsyx * (sxxpsyy - szz))
          * (-sxzmszx * syzmszy - sxypsyx * (sxxpsyy + szz))
          + (sxypsyx * syzpszy + sxzpszx * (sxxmsyy + szz))
          * (-sxymsyx * syzmszy + sxzpszx * (sxxpsyy + szz))
          + (sxypsyx * syzmszy + sxzmszx * (sxxmsyy - szz))
          * (-sxymsyx * syzpszy + sxzmszx * (sxxpsyy - szz)))
    lam = e0
    for _ in range(_QCP_MAX_ITER):
        x2 = lam * lam
        b = (x2 + c2) * lam
        a = b + c1
        denom = 2.0 * x2 * lam + b + a
        if denom == 0.0:
            break
        delta = (a * lam + c0) / denom
        lam -= delta
        if abs(delta) <= 1e-15 * abs(lam):
            break
    return lam


@njit(cache=True, nogil=True)
def _dihedral_rows(x, chain, cells, kinds, out):
    n_frames, n_rows, n_idx = x.shape[0], chain.shape[0], chain.shape[1]
    b = np.empty((n_idx - 1, 3))
    for f in range(n_frames):
        for r in range(n_rows):
            for k in range(n_idx - 1):
                i, j = chain[r, k], chain[r, k + 1]
                for d in range(3):
                    # the difference in the input precision, as MDAnalysis' C code
                    b[k, d] = x[f, j, d] - x[f, i, d]
                if kinds[f] == 1:
                    for d in range(3):
                        length = cells[f, d, d]
                        b[k, d] -= length * np.round(b[k, d] / length)
                elif kinds[f] == 2:
                    _minimum_image_triclinic(b[k], cells[f])
            for k in range(n_idx - 3):
                cs = _cos_sin(b[k], b[k + 1], b[k + 2])
                out[f, r, k, 0] = cs[0]
                out[f, r, k, 1] = cs[1]


@njit(cache=True, nogil=True)
def _cos_sin(b1, b2, b3):
    """MDAnalysis: angle = atan2((n1 x n2).b2 / |b2|, n1.n2), n1 = b1 x b2, n2 = b2 x b3.
    Since n1 x n2 = b2 (n1.b3), the y term is |b2| (n1.b3); cos and sin come
    from the two projections directly, no angle is formed."""
    n1x = b1[1] * b2[2] - b1[2] * b2[1]
    n1y = b1[2] * b2[0] - b1[0] * b2[2]
    n1z = b1[0] * b2[1] - b1[1] * b2[0]
    n2x = b2[1] * b3[2] - b2[2] * b3[1]
    n2y = b2[2] * b3[0] - b2[0] * b3[2]
    n2z = b2[0] * b3[1] - b2[1] * b3[0]
    xp = n1x * n2x + n1y * n2y + n1z * n2z
    yp = np.sqrt(b2[0] * b2[0] + b2[1] * b2[1] + b2[2] * b2[2]) * (n1x * b3[0] + n1y * b3[1] + n1z * b3[2])
    norm = np.sqrt(xp * xp + yp * yp)
    if norm > 0.0:
        return xp / norm, yp / norm
    return 1.0, 0.0


@njit(cache=True, nogil=True)
def _minimum_image_triclinic(dx, vec):
    """LAMMPS-style triclinic minimum image of one vector, as MDAnalysis' C code."""
    for axis in (2, 1, 0):
        s = np.round(dx[axis] / vec[axis, axis])
        for d in range(3):
            dx[d] -= s * vec[axis, d]
    best0, best1, best2 = dx[0], dx[1], dx[2]
    best_sq = np.inf
    for ix in (-1, 0, 1):
        for iy in (-1, 0, 1):
            for iz in (-1, 0, 1):
                c0 = dx[0] + ix * vec[0, 0] + iy * vec[1, 0] + iz * vec[2, 0]
                c1 = dx[1] + ix * vec[0, 1] + iy * vec[1, 1] + iz * vec[2, 1]
                c2 = dx[2] + ix * vec[0, 2] + iy * vec[1, 2] + iz * vec[2, 2]
                sq = c0 * c0 + c1 * c1 + c2 * c2
                if sq < best_sq:
                    best_sq = sq
                    best0, best1, best2 = c0, c1, c2
    dx[0], dx[1], dx[2] = best0, best1, best2


def qcp_frames(xt, ref_t, w, g_ref, out):
    _qcp_frames(xt, ref_t, w, g_ref, out)


def dihedral_rows(x, chain, cells, kinds, out):
    _dihedral_rows(x, chain, cells, kinds, out)


SIGNATURES = {  # of kernels.ENTRY_POINTS, {x} the input's precision
    "qcp_frames": (qcp_frames, "void({x}[:, :, ::1], float64[:, ::1], float64[::1], float64, "
                               "float64[::1])"),
    "dihedral_rows": (dihedral_rows, "void({x}[:, :, ::1], int64[:, ::1], float64[:, :, ::1], "
                                     "int64[::1], float64[:, :, :, ::1])"),
}


def jit_entry_points():
    """The entry points through numba's JIT (cached on disk), by their AOT names."""
    jitted = {name: njit(cache=True, nogil=True)(fn) for name, (fn, _) in SIGNATURES.items()}
    return {f"{name}_{p}": jitted[name] for name in SIGNATURES for p in PRECISIONS}


def build_extension(module_name, path):
    """Compile the entry points into the extension module `path` (atomically:
    several pilots may build the same file at once), for this node's CPU: nodes
    with other CPUs find no build under their name and use the JIT until their
    own pilot builds one."""
    from numba.pycc import CC
    build_dir = tempfile.mkdtemp(prefix="trajflow-kernels-")
    try:
        cc = CC(module_name)
        cc.output_dir = build_dir
        cc.verbose = False
        cc.target_cpu = "host"
        for name, (fn, signature) in SIGNATURES.items():
            for p, dtype in PRECISIONS.items():
                cc.export(f"{name}_{p}", signature.format(x=dtype))(fn)
        cc.compile()
        built = [f for f in os.listdir(build_dir) if f.startswith(module_name + ".")]
        if len(built) != 1:
            raise RuntimeError(f"numba.pycc left {os.listdir(build_dir)} in {build_dir}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        shutil.copyfile(os.path.join(build_dir, built[0]), tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    print(f"trajflow: kernels compiled ahead of time into {path}", file=sys.stderr)
