"""The compiled inner loops of kernels.py and of the XTC reader, and their
ahead-of-time build.

Numba-compatible Python. Where a C compiler is available the pilot compiles
them once, ahead of time, into an extension module (numba.pycc) that tasks
load without importing numba: numba's import and the loading of its cached
code were 1.0 s of every task's 1.4 s start-up (measured). Elsewhere they run
through numba's JIT with its on-disk cache. Only kernels.py imports this module.

The XTC decoder is GROMACS' xdrfile xdr3dfcoord (the one MDAnalysis' XTC
reader runs), made selective: a frame is decoded only up to the last atom
wanted, and the rest of its bytes is never looked at.
"""
import os
import shutil
import sys
import tempfile

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from llvmlite import ir

from .rundir import replaced_whole


# Newton-Raphson on the QCP characteristic polynomial converges quadratically
# from the upper bound E0; 50 iterations is a safety net, not the norm.
_QCP_MAX_ITER = 50


# reassociation lets the compiler vectorise the atom sums; every sum is float64
@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _qcp_frames(xt, ref_t, w, g_ref, out):
    """Two passes per frame: its weighted centre, then sum w |x - c|^2 and the
    correlation sum w (x - c) ref_c.

    Centring first keeps the sums stable wherever the molecule is: the one-pass
    form sum w |x|^2 - |sum w x|^2 / W lost 8.8e-5 A of RMSD to cancellation at
    3,000 A from the origin (measured), where large membrane and virus systems
    sit. The reference is centred too (sum w ref_c = 0).
    """
    n_frames, n_atoms = xt.shape[0], xt.shape[2]
    sum_w = 0.0
    for n in range(n_atoms):
        sum_w += w[n]
    r0, r1, r2 = ref_t[0], ref_t[1], ref_t[2]
    for f in range(n_frames):
        x0, x1, x2 = xt[f, 0], xt[f, 1], xt[f, 2]
        s0 = s1 = s2 = 0.0
        for n in range(n_atoms):
            wn = w[n]
            s0 += wn * np.float64(x0[n])
            s1 += wn * np.float64(x1[n])
            s2 += wn * np.float64(x2[n])
        c0, c1, c2 = s0 / sum_w, s1 / sum_w, s2 / sum_w
        g = 0.0
        sxx = sxy = sxz = syx = syy = syz = szx = szy = szz = 0.0
        for n in range(n_atoms):
            wn = w[n]
            a0, a1, a2 = np.float64(x0[n]) - c0, np.float64(x1[n]) - c1, np.float64(x2[n]) - c2
            g += wn * (a0 * a0 + a1 * a1 + a2 * a2)
            a0, a1, a2 = wn * a0, wn * a1, wn * a2
            sxx += a0 * r0[n]
            sxy += a0 * r1[n]
            sxz += a0 * r2[n]
            syx += a1 * r0[n]
            syy += a1 * r1[n]
            syz += a1 * r2[n]
            szx += a2 * r0[n]
            szy += a2 * r1[n]
            szz += a2 * r2[n]
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


# --- XTC (xdrfile's xdr3dfcoord) ---------------------------------------------------
_MAGICINTS = np.array([
    0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 10, 12, 16, 20, 25, 32, 40, 50, 64, 80, 101, 128, 161, 203,
    256, 322, 406, 512, 645, 812, 1024, 1290, 1625, 2048, 2580, 3250, 4096, 5060, 6501, 8192,
    10321, 13003, 16384, 20642, 26007, 32768, 41285, 52015, 65536, 82570, 104031, 131072,
    165140, 208063, 262144, 330280, 416127, 524287, 660561, 832255, 1048576, 1321122, 1664510,
    2097152, 2642245, 3329021, 4194304, 5284491, 6658042, 8388607, 10568983, 13316085,
    16777216], dtype=np.int64)
_FIRSTIDX = 9


@njit(cache=True, nogil=True, inline="always")
def _receivebits(buf, cnt, lastbits, lastbyte, nbits):
    """The next `nbits` bits of `buf`, and the reader's new (cnt, lastbits, lastbyte):
    scalars, not an array, so that they stay in registers."""
    mask = (1 << nbits) - 1
    num = 0
    while nbits >= 8:
        lastbyte = ((lastbyte << 8) | buf[cnt]) & 0xFFFFFFFF
        cnt += 1
        num |= (lastbyte >> lastbits) << (nbits - 8)
        nbits -= 8
    if nbits > 0:
        if lastbits < nbits:
            lastbits += 8
            lastbyte = ((lastbyte << 8) | buf[cnt]) & 0xFFFFFFFF
            cnt += 1
        lastbits -= nbits
        num |= (lastbyte >> lastbits) & ((1 << nbits) - 1)
    return num & mask, cnt, lastbits, lastbyte


@njit(cache=True, nogil=True, inline="always")
def _receiveints(buf, cnt, lastbits, lastbyte, nbits, s0, s1, s2, work):
    """Three integers packed into `nbits` bits as a mixed-radix number of sizes
    (s0, s1, s2); (n0, n1, n2, cnt, lastbits, lastbyte)."""
    work[0] = work[1] = work[2] = work[3] = 0
    nbytes = 0
    while nbits > 8:
        work[nbytes], cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, 8)
        nbytes += 1
        nbits -= 8
    if nbits > 0:
        work[nbytes], cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, nbits)
        nbytes += 1
    n2 = _divide_out(work, nbytes, s2)
    n1 = _divide_out(work, nbytes, s1)
    n0 = work[0] | (work[1] << 8) | (work[2] << 16) | (work[3] << 24)
    return n0, n1, n2, cnt, lastbits, lastbyte


@njit(cache=True, nogil=True, inline="always")
def _divide_out(work, nbytes, size):
    """The remainder of the little-endian bytes work[:nbytes] by `size`; the bytes
    become the quotient (32-bit arithmetic: the numbers stay below 2**32)."""
    num = np.uint32(0)
    size = np.uint32(size)
    for j in range(nbytes - 1, -1, -1):
        num = (num << np.uint32(8)) | np.uint32(work[j])
        p = num // size
        work[j] = p
        num = num - p * size
    return np.int64(num)


@njit(cache=True, nogil=True)
def _sizeofint(size):
    num, bits = 1, 0
    while size >= num and bits < 32:
        bits += 1
        num <<= 1
    return bits


@njit(cache=True, nogil=True)
def _sizeofints(sizes):
    work = np.zeros(32, dtype=np.int64)
    work[0] = 1
    nbytes = 1
    for i in range(3):
        tmp = 0
        k = 0
        while k < nbytes:
            tmp = work[k] * sizes[i] + tmp
            work[k] = tmp & 0xFF
            tmp >>= 8
            k += 1
        while tmp != 0:
            work[k] = tmp & 0xFF
            k += 1
            tmp >>= 8
        nbytes = k
    num, bits = 1, 0
    nbytes -= 1
    while work[nbytes] >= num:
        bits += 1
        num *= 2
    return bits + nbytes * 8


_TEN = np.float32(10.0)


@njit(cache=True, nogil=True, inline="always")
def _put(out, i, n_wanted, x, y, z, inv):
    """Atom i's coordinates into out if it is wanted; the next atom's index. In Å
    as MDAnalysis gets them: xdrfile's float32 nm (x * 1/precision), then * 10 in
    float32 (two roundings, never fused)."""
    if i < n_wanted:
        out[i, 0] = (np.float32(x) * inv) * _TEN
        out[i, 1] = (np.float32(y) * inv) * _TEN
        out[i, 2] = (np.float32(z) * inv) * _TEN
    return i + 1


@njit(cache=True, nogil=True)
def _xtc_frame_bytewise(buf, start, nbytes, precision, minint, maxint, smallidx, n_wanted,
                        out):
    """xdrfile's own byte-wise decoding of one frame: the fallback of _xtc_frame for
    the rare frames holding an integer wider than 57 bits (boxes of 2**19 units or
    more per axis at the file's precision). Same arguments and codes."""
    sizeint = np.empty(3, dtype=np.int64)
    bitsizeint = np.zeros(3, dtype=np.int64)
    for k in range(3):
        sizeint[k] = maxint[k] - minint[k] + 1
        if sizeint[k] < 1:  # a damaged header (xdrfile's sizeofints would never end)
            return -1
    if (sizeint[0] | sizeint[1] | sizeint[2]) > 0xFFFFFF:
        for k in range(3):
            bitsizeint[k] = _sizeofint(sizeint[k])
        bitsize = 0
    else:
        bitsize = _sizeofints(sizeint)
    # xdrfile's compressor sets or steps the index one past its table's end on
    # large coordinates (its LASTIDX); valid as long as no run of atoms uses it
    if smallidx < _FIRSTIDX or smallidx > _MAGICINTS.size:
        return -1
    damaged = -2 if smallidx == _MAGICINTS.size else -1  # -2: the writer used junk
    smaller = _MAGICINTS[max(_FIRSTIDX, smallidx - 1)] // 2
    smallnum = _MAGICINTS[smallidx] // 2 if smallidx < _MAGICINTS.size else -1
    sizesmall = _MAGICINTS[smallidx] if smallidx < _MAGICINTS.size else -1  # for x, y and z
    inv = np.float32(1.0) / np.float32(precision)
    cnt, lastbits, lastbyte = start, 0, 0  # the bit reader: bytes from buf[start]
    work = np.zeros(32, dtype=np.int64)
    t0 = t1 = t2 = 0
    run = 0
    i = 0  # atoms decoded
    while i < n_wanted:
        if cnt - start > nbytes:  # an atom's bits (at most ~45 bytes) may run into the padding
            return damaged
        if bitsize == 0:
            t0, cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, bitsizeint[0])
            t1, cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, bitsizeint[1])
            t2, cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, bitsizeint[2])
        else:
            t0, t1, t2, cnt, lastbits, lastbyte = _receiveints(
                buf, cnt, lastbits, lastbyte, bitsize, sizeint[0], sizeint[1], sizeint[2], work)
        p0, p1, p2 = t0 + minint[0], t1 + minint[1], t2 + minint[2]
        flag, cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, 1)
        is_smaller = 0
        if flag == 1:
            run, cnt, lastbits, lastbyte = _receivebits(buf, cnt, lastbits, lastbyte, 5)
            is_smaller = run % 3
            run -= is_smaller
            is_smaller -= 1
        if run > 0:
            if sizesmall < 0:  # xdrfile would read past its table: no defined value
                return -2
            for j in range(0, run, 3):
                t0, t1, t2, cnt, lastbits, lastbyte = _receiveints(
                    buf, cnt, lastbits, lastbyte, smallidx, sizesmall, sizesmall, sizesmall, work)
                t0, t1, t2 = t0 + p0 - smallnum, t1 + p1 - smallnum, t2 + p2 - smallnum
                if j == 0:  # the first two atoms come swapped (water compresses better)
                    p0, t0 = t0, p0
                    p1, t1 = t1, p1
                    p2, t2 = t2, p2
                    i = _put(out, i, n_wanted, p0, p1, p2, inv)
                else:
                    p0, p1, p2 = t0, t1, t2
                i = _put(out, i, n_wanted, t0, t1, t2, inv)
        else:
            i = _put(out, i, n_wanted, p0, p1, p2, inv)
        smallidx += is_smaller
        if smallidx < _FIRSTIDX or smallidx > _MAGICINTS.size:  # damaged bits
            return damaged
        if smallidx == _MAGICINTS.size:
            damaged = -2
        if is_smaller < 0:
            smallnum = smaller
            smaller = _MAGICINTS[smallidx - 1] // 2 if smallidx > _FIRSTIDX else 0
        elif is_smaller > 0:
            smaller = smallnum
            smallnum = _MAGICINTS[smallidx] // 2 if smallidx < _MAGICINTS.size else -1
        sizesmall = _MAGICINTS[smallidx] if smallidx < _MAGICINTS.size else -1
    if cnt - start > nbytes:  # the last atom's bits ran past the bytes given
        return damaged
    return cnt - start


@intrinsic
def _load_be64(typingctx, array, index):
    """array[index:index + 8] as a big-endian uint64: one unaligned load and a
    byte swap, where xdrfile reads byte by byte."""
    def codegen(context, builder, signature, args):
        kind = signature.args[0]
        view = context.make_array(kind)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, kind, view, [args[1]])
        word = builder.load(builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)
        return builder.bswap(word)
    return types.uint64(array, index), codegen


@intrinsic
def _bswap64(typingctx, value):
    def codegen(context, builder, signature, args):
        return builder.bswap(args[0])
    return types.uint64(types.uint64), codegen


_U = np.uint64
WIDEST_WORD_READ = 57  # bits: a read from any bit of a byte fits one 8-byte load


@njit(cache=True, nogil=True, inline="always")
def _bits(buf, pos, nbits):
    """The `nbits` (1..57) bits of buf from bit `pos` on, in the stream's order."""
    return (_load_be64(buf, pos >> 3) << _U(pos & 7)) >> _U(64 - nbits)


@njit(cache=True, nogil=True, inline="always")
def _ints(buf, pos, nbits, s0, s1, s2):
    """xdrfile's receiveints from bit `pos` (nbits <= 57): three integers of sizes
    (s0, s1, s2) packed as one mixed-radix number, stored as bytes least significant
    first, the last one holding the nbits % 8 (or 8) bits left."""
    v = _bits(buf, pos, nbits)
    r = nbits & 7
    if r == 0:
        r = 8
    full = (nbits - r) >> 3
    num = v & ((_U(1) << _U(r)) - _U(1))
    if full > 0:  # the full bytes in reverse order, under the last one
        num = (num << _U(8 * full)) | _bswap64((v >> _U(r)) << _U(64 - 8 * full))
    q = num // _U(s2)
    n2 = num - q * _U(s2)
    n0 = q // _U(s1)
    n1 = q - n0 * _U(s1)
    return np.int64(n0 & _U(0xFFFFFFFF)), np.int64(n1), np.int64(n2)  # xdrfile keeps 4 bytes


@njit(cache=True, nogil=True)
def _xtc_frame(buf, start, nbytes, precision, minint, maxint, smallidx, n_wanted, out):
    """Decode one compressed frame (its `nbytes` bytes from buf[start]; buf has
    XTC_PADDING bytes more after the last frame) up to atom n_wanted - 1 into
    out[:n_wanted] (Å, float32, as MDAnalysis gets them); the bytes it took, or -1
    if its bytes end before (a damaged frame, or fewer bytes given), -2 where it
    uses xdrfile's small index past its table, -3 where an integer is wider than
    57 bits (_xtc_frame_bytewise's).

    xdrfile's algorithm, with its bit reader a word at a time: each integer is
    one unaligned 8-byte load, and a packed triple two 64-bit divisions, where
    xdrfile reads a byte at a time and divides each byte (1.7x as fast here; a
    byte-wise slow path inlined in this loop made all of it 2.3x slower, so wide
    integers leave it instead)."""
    sizeint = np.empty(3, dtype=np.int64)
    bitsizeint = np.zeros(3, dtype=np.int64)
    for k in range(3):
        sizeint[k] = maxint[k] - minint[k] + 1
        if sizeint[k] < 1:  # a damaged header (xdrfile's sizeofints would never end)
            return -1
    if (sizeint[0] | sizeint[1] | sizeint[2]) > 0xFFFFFF:
        for k in range(3):
            bitsizeint[k] = _sizeofint(sizeint[k])
        bitsize = 0
    else:
        bitsize = _sizeofints(sizeint)
        if bitsize > WIDEST_WORD_READ:
            return -3
    # xdrfile's compressor sets or steps the index one past its table's end on
    # large coordinates (its LASTIDX); valid as long as no run of atoms uses it
    if smallidx < _FIRSTIDX or smallidx > _MAGICINTS.size:
        return -1
    damaged = -2 if smallidx == _MAGICINTS.size else -1  # -2: the writer used junk
    smaller = _MAGICINTS[max(_FIRSTIDX, smallidx - 1)] // 2
    smallnum = _MAGICINTS[smallidx] // 2 if smallidx < _MAGICINTS.size else -1
    sizesmall = _MAGICINTS[smallidx] if smallidx < _MAGICINTS.size else -1  # for x, y and z
    inv = np.float32(1.0) / np.float32(precision)
    s0, s1, s2 = sizeint[0], sizeint[1], sizeint[2]
    m0, m1, m2 = minint[0], minint[1], minint[2]
    pos, end = start * 8, (start + nbytes) * 8  # in bits
    run = 0
    i = 0  # atoms decoded
    while i < n_wanted:
        if pos > end:  # an atom's bits (at most ~100 bytes) may run into the padding
            return damaged
        if bitsize == 0:
            t0 = np.int64(_bits(buf, pos, bitsizeint[0]))
            pos += bitsizeint[0]
            t1 = np.int64(_bits(buf, pos, bitsizeint[1]))
            pos += bitsizeint[1]
            t2 = np.int64(_bits(buf, pos, bitsizeint[2]))
            pos += bitsizeint[2]
        else:
            t0, t1, t2 = _ints(buf, pos, bitsize, s0, s1, s2)
            pos += bitsize
        p0, p1, p2 = t0 + m0, t1 + m1, t2 + m2
        head = np.int64(_bits(buf, pos, 6))  # a flag bit, and if set a run's 5 bits
        is_smaller = 0
        if head >= 32:
            run = head - 32
            pos += 6
            is_smaller = run % 3
            run -= is_smaller
            is_smaller -= 1
        else:
            pos += 1  # no flag: the run goes on as before
        if run > 0:
            if sizesmall < 0:  # xdrfile would read past its table: no defined value
                return -2
            if smallidx > WIDEST_WORD_READ:
                return -3
            for j in range(0, run, 3):
                t0, t1, t2 = _ints(buf, pos, smallidx, sizesmall, sizesmall, sizesmall)
                pos += smallidx
                t0, t1, t2 = t0 + p0 - smallnum, t1 + p1 - smallnum, t2 + p2 - smallnum
                if j == 0:  # the first two atoms come swapped (water compresses better)
                    p0, t0 = t0, p0
                    p1, t1 = t1, p1
                    p2, t2 = t2, p2
                    i = _put(out, i, n_wanted, p0, p1, p2, inv)
                else:
                    p0, p1, p2 = t0, t1, t2
                i = _put(out, i, n_wanted, t0, t1, t2, inv)
        else:
            i = _put(out, i, n_wanted, p0, p1, p2, inv)
        smallidx += is_smaller
        if smallidx < _FIRSTIDX or smallidx > _MAGICINTS.size:  # damaged bits
            return damaged
        if smallidx == _MAGICINTS.size:
            damaged = -2
        if is_smaller < 0:
            smallnum = smaller
            smaller = _MAGICINTS[smallidx - 1] // 2 if smallidx > _FIRSTIDX else 0
        elif is_smaller > 0:
            smaller = smallnum
            smallnum = _MAGICINTS[smallidx] // 2 if smallidx < _MAGICINTS.size else -1
        sizesmall = _MAGICINTS[smallidx] if smallidx < _MAGICINTS.size else -1
    if pos > end:  # the last atom's bits ran past the bytes given
        return damaged
    return (pos - start * 8 + 7) >> 3


def xtc_decode(buf, starts, nbytes, precision, minint, maxint, smallidx, out, used):
    """Frames of `buf` (their compressed bytes at `starts`, at most `nbytes` each)
    into out (F, n_wanted, 3), in Å, and the bytes each took into used; -1, or
    2 * the first bad frame (+ 1 where it uses xdrfile's small index past its
    table, which has no defined value; else its bits end before its atoms do)."""
    for f in range(starts.size):
        code = _xtc_frame(buf, starts[f], nbytes[f], precision[f], minint[f], maxint[f],
                          smallidx[f], out.shape[1], out[f])
        if code == -3:
            code = _xtc_frame_bytewise(buf, starts[f], nbytes[f], precision[f], minint[f],
                                       maxint[f], smallidx[f], out.shape[1], out[f])
        if code < 0:
            return 2 * f + (1 if code == -2 else 0)
        used[f] = code
    return -1


# --- a counter in shared memory (schedules.py) ----------------------------------------
@intrinsic
def _atomic_add(typingctx, array, index, value):
    """array[index] += value as one atomic read-modify-write (sequentially consistent);
    the old value. LLVM's atomicrmw: a `lock xadd` on x86-64."""
    def codegen(context, builder, signature, args):
        kind = signature.args[0]
        view = context.make_array(kind)(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, kind, view, [args[1]])
        return builder.atomic_rmw("add", pointer, args[2], "seq_cst")
    return types.int64(array, index, value), codegen


def atomic_fetch_add(counter, value):
    """counter[0] += value atomically, for every process mapping the same memory; the old value."""
    return _atomic_add(counter, 0, value)


def qcp_frames(xt, ref_t, w, g_ref, out):
    _qcp_frames(xt, ref_t, w, g_ref, out)


def dihedral_rows(x, chain, cells, kinds, out):
    _dihedral_rows(x, chain, cells, kinds, out)


SIGNATURES = {  # kernels.ENTRY_POINTS: exported name -> (function, signature)
    **{f"qcp_frames_{p}": (qcp_frames, f"void({x}[:, :, ::1], float64[:, ::1], float64[::1], "
                                        "float64, float64[::1])")
       for p, x in (("f4", "float32"), ("f8", "float64"))},
    **{f"dihedral_rows_{p}": (dihedral_rows, f"void({x}[:, :, ::1], int64[:, ::1], "
                                              "float64[:, :, ::1], int64[::1], float64[:, :, :, ::1])")
       for p, x in (("f4", "float32"), ("f8", "float64"))},
    "atomic_fetch_add": (atomic_fetch_add, "int64(int64[::1], int64)"),
    "xtc_decode": (xtc_decode, "int64(uint8[::1], int64[::1], int64[::1], float32[::1], "
                               "int64[:, ::1], int64[:, ::1], int64[::1], float32[:, :, ::1], "
                               "int64[::1])"),
}


def jit_entry_points():
    """The entry points through numba's JIT (cached on disk), by their exported names."""
    return {name: njit(cache=True, nogil=True)(fn) for name, (fn, _) in SIGNATURES.items()}


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
            cc.export(name, signature)(fn)
        cc.compile()
        built = [f for f in os.listdir(build_dir) if f.startswith(module_name + ".")]
        if len(built) != 1:
            raise RuntimeError(f"numba.pycc left {os.listdir(build_dir)} in {build_dir}")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with replaced_whole(path) as tmp:
            shutil.copyfile(os.path.join(build_dir, built[0]), tmp)
            os.chmod(tmp, 0o755)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    print(f"trajflow: kernels compiled ahead of time into {path}", file=sys.stderr)
