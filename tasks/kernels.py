"""Pure numpy kernels: coordinates of a chunk of frames in, results out.

Both kernels work on a whole chunk at once, never on one frame, because the
per-frame Python path (not the arithmetic) is what made the papers' analysis
slow. They know nothing of files, MPI or MDAnalysis universes.
"""
import numpy as np

# Newton-Raphson on the QCP characteristic polynomial converges quadratically
# from the upper bound E0; 50 iterations is a safety net, not the norm.
_QCP_MAX_ITER = 50


def prepare_reference(reference, weights=None):
    """Centre a reference structure (N, 3) and normalise weights like MDAnalysis.

    Returns (weighted reference centred at its weighted centre, weights or None,
    G_ref = sum w |y|^2). Weights are scaled to mean 1, as `rms.rmsd` does.
    """
    ref = np.asarray(reference, dtype=np.float64)
    if ref.ndim != 2 or ref.shape[1] != 3 or ref.shape[0] == 0:
        raise ValueError(f"reference must have shape (n_atoms >= 1, 3), got {ref.shape}")
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (ref.shape[0],):
            raise ValueError("weights must have one value per atom")
        weights = weights / weights.mean()
        centre = weights @ ref / weights.sum()
        ref_c = ref - centre
        g_ref = float(weights @ np.einsum("ij,ij->i", ref_c, ref_c))
    else:
        ref_c = ref - ref.mean(axis=0)
        g_ref = float(np.einsum("ij,ij->", ref_c, ref_c))
    return ref_c, weights, g_ref


def qcp_rmsd(chunk, reference, weights=None):
    """RMSD after optimal superposition of every frame of `chunk` onto `reference`.

    chunk: (n_frames, n_atoms, 3) coordinates (any float dtype); reference:
    (n_atoms, 3). Centres each frame (weighted), builds all correlation matrices
    with one matrix product, then solves QCP (Theobald 2005, Liu et al. 2010)
    for all frames together. Matches MDAnalysis `rms.rmsd(..., center=True,
    superposition=True)` frame by frame.
    """
    x = np.asarray(chunk)
    if x.ndim != 3 or x.shape[2] != 3:
        raise ValueError(f"chunk must have shape (n_frames, n_atoms, 3), got {x.shape}")
    ref_c, w, g_ref = prepare_reference(reference, weights)
    n_frames, n_atoms, _ = x.shape
    if n_atoms != ref_c.shape[0]:
        raise ValueError(f"chunk has {n_atoms} atoms, reference has {ref_c.shape[0]}")
    if n_frames == 0:
        return np.empty(0, dtype=np.float64)

    # (F, 3, N) in float64: one pass that converts and transposes, so that all
    # correlation matrices come from a single (3F, N) @ (N, 3) product.
    xt = np.empty((n_frames, 3, n_atoms), dtype=np.float64)
    xt[...] = x.transpose(0, 2, 1)
    wref = ref_c if w is None else ref_c * w[:, None]
    # sum(w * ref_c) == 0, so the frame's centre drops out of the correlation.
    corr = (xt.reshape(3 * n_frames, n_atoms) @ wref).reshape(n_frames, 3, 3)
    if w is None:
        sum_w = float(n_atoms)
        centre = xt.sum(axis=2) / sum_w
        g_x = np.einsum("fij,fij->f", xt, xt)
    else:
        sum_w = float(w.sum())
        centre = xt @ w / sum_w
        g_x = np.einsum("fij,fij->f", xt * xt, np.broadcast_to(w, xt.shape))
    g_x -= sum_w * np.einsum("fi,fi->f", centre, centre)
    return _qcp_from_correlation(corr, g_x, g_ref, n_atoms)


def _qcp_from_correlation(corr, g_x, g_ref, n_atoms):
    """Largest eigenvalue of the QCP key matrix by Newton-Raphson, all frames at once."""
    sxx, sxy, sxz = corr[:, 0, 0], corr[:, 0, 1], corr[:, 0, 2]
    syx, syy, syz = corr[:, 1, 0], corr[:, 1, 1], corr[:, 1, 2]
    szx, szy, szz = corr[:, 2, 0], corr[:, 2, 1], corr[:, 2, 2]
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

    e0 = 0.5 * (g_x + g_ref)
    lam = e0.copy()
    active = np.arange(lam.size)
    for _ in range(_QCP_MAX_ITER):
        l = lam[active]
        x2 = l * l
        b = (x2 + c2[active]) * l
        a = b + c1[active]
        denom = 2.0 * x2 * l + b + a
        with np.errstate(divide="ignore", invalid="ignore"):
            delta = np.where(denom != 0.0, (a * l + c0[active]) / denom, 0.0)
        lam[active] = l - delta
        converged = np.abs(delta) <= 1e-15 * np.abs(l)
        active = active[~converged]
        if active.size == 0:
            break
    return np.sqrt(np.abs(2.0 * (e0 - lam) / n_atoms))


def dihedral_cos_sin(chunk, quads, boxes=None):
    """cos and sin of the dihedral angles given by atom index quadruplets.

    chunk: (n_frames, n_atoms, 3); quads: (n_dihedrals, 4) indices into the
    chunk's atom axis; boxes: (n_frames, 6) unit cells or None. Returns two
    (n_frames, n_dihedrals) arrays, in MDAnalysis' `calc_dihedrals` convention;
    bond vectors follow the minimum image when a box is given, as there.
    """
    quads = np.asarray(quads, dtype=np.intp)
    b1, b2, b3 = _bonds(chunk, quads, boxes)
    return _cos_sin(_cross(b1, b2), _cross(b2, b3), b2, b3)


def backbone_features(chunk, chain, boxes=None):
    """[cos φ, sin φ, cos ψ, sin ψ] per residue for every frame of a chunk.

    chain: (n_residues, 5) indices of C(i-1), N, CA, C, N(i+1). φ and ψ share
    two of their three bonds and one plane normal, so each is computed once.
    Returns (n_frames, 4 * n_residues).
    """
    b0, b1, b2, b3 = _bonds(chunk, np.asarray(chain, dtype=np.intp), boxes)
    n1, n2, n3 = _cross(b0, b1), _cross(b1, b2), _cross(b2, b3)
    cos_phi, sin_phi = _cos_sin(n1, n2, b1, b2)
    cos_psi, sin_psi = _cos_sin(n2, n3, b2, b3)
    return interleave_features(cos_phi, sin_phi, cos_psi, sin_psi)


def _bonds(chunk, chain, boxes):
    """Bond vectors between consecutive atoms of each row of `chain`, as
    coordinate-major float64 arrays (3, n_frames, n_rows) so that every
    later step works on long contiguous rows. The differences are taken in
    the input precision first, as MDAnalysis' C code does (it matters for
    molecules broken across the cell)."""
    x = np.asarray(chunk)
    bonds = []
    for k in range(chain.shape[1] - 1):
        d = x[:, chain[:, k + 1]] - x[:, chain[:, k]]
        if boxes is not None:
            d = minimum_image(d, boxes)
        bonds.append(np.ascontiguousarray(d.transpose(2, 0, 1), dtype=np.float64))
    return bonds


def _cross(a, b):
    return np.stack([a[1] * b[2] - a[2] * b[1],
                     a[2] * b[0] - a[0] * b[2],
                     a[0] * b[1] - a[1] * b[0]])


def _cos_sin(n1, n2, b_mid, b_next):
    """Dihedral from plane normals n1 = b1 x b2, n2 = b2 x b3: MDAnalysis takes
    atan2((n1 x n2).b2 / |b2|, n1.n2); (n1 x n2) = b2 (n1.b3), so the y term
    is |b2| (n1.b3). cos and sin come from the two projections directly."""
    x = np.einsum("ifr,ifr->fr", n1, n2)
    y = np.sqrt(np.einsum("ifr,ifr->fr", b_mid, b_mid)) * np.einsum("ifr,ifr->fr", n1, b_next)
    norm = np.hypot(x, y)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norm > 0, x / norm, 1.0)
        sin = np.where(norm > 0, y / norm, 0.0)
    return cos, sin


def interleave_features(cos_phi, sin_phi, cos_psi, sin_psi):
    """Lay out (n_frames, n_res) arrays as [cos φ1, sin φ1, cos ψ1, sin ψ1, ...]."""
    return np.stack([cos_phi, sin_phi, cos_psi, sin_psi], axis=2).reshape(cos_phi.shape[0], -1)


def minimum_image(vectors, boxes):
    """Apply the minimum image convention to (n_frames, n, 3) vectors.

    Mirrors MDAnalysis' C code (calc_distances.h) in float64: orthorhombic
    cells wrap by rounding; triclinic cells shift into the reference cell and
    then take the shortest of the 27 neighbouring images, as LAMMPS does.
    Frames without a cell (lengths all zero) are left alone.
    """
    boxes = np.asarray(boxes, dtype=np.float64)
    has_box = np.all(boxes[:, :3] > 0, axis=1)
    if not has_box.any():
        return vectors
    out = np.array(vectors, dtype=np.float64, copy=True)
    ortho = has_box & np.all(boxes[:, 3:] == 90.0, axis=1)
    if ortho.any():
        l = boxes[ortho][:, None, :3]
        out[ortho] -= l * np.round(out[ortho] / l)
    tric = has_box & ~ortho
    if tric.any():
        out[tric] = _minimum_image_triclinic(out[tric], triclinic_vectors(boxes[tric]))
    return out


def triclinic_vectors(boxes):
    """(n_frames, 6) [a, b, c, alpha, beta, gamma] to (n_frames, 3, 3) box vectors.

    Computed in float32 like MDAnalysis, so that wrapped vectors match it exactly.
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


def _minimum_image_triclinic(dx, vec):
    """LAMMPS-style triclinic minimum image for (F, n, 3) vectors and (F, 3, 3) cells."""
    dx = dx.copy()
    for axis in (2, 1, 0):
        shift = np.round(dx[..., axis] / vec[:, None, axis, axis])
        dx -= shift[..., None] * vec[:, None, axis, :]
    best = dx.copy()
    best_sq = np.full(dx.shape[:2], np.inf)
    for ix in (-1, 0, 1):
        for iy in (-1, 0, 1):
            for iz in (-1, 0, 1):
                cand = dx + (ix * vec[:, 0] + iy * vec[:, 1] + iz * vec[:, 2])[:, None, :]
                sq = np.einsum("fni,fni->fn", cand, cand)
                better = sq < best_sq
                best[better] = cand[better]
                best_sq[better] = sq[better]
    return best
