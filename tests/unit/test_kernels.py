"""The kernels against MDAnalysis' own computations, on real frames and edge cases."""
import numpy as np
import pytest
import MDAnalysis as mda
from MDAnalysis.analysis import rms
from MDAnalysis.lib.distances import calc_dihedrals

from trajflow.tasks import kernels


@pytest.fixture(scope="module")
def ca_frames(adk):
    u = mda.Universe(*adk)
    ca = u.select_atoms("name CA")
    return u.trajectory.timeseries(ca, order="fac"), ca.masses


def mda_rmsd(frames, ref, weights=None):
    return np.array([rms.rmsd(x, ref, weights=weights, center=True, superposition=True)
                     for x in frames])


def test_rmsd_matches_qcprot_on_every_adk_frame(ca_frames):
    frames, _ = ca_frames
    for ref in (frames[0], frames[50]):
        np.testing.assert_allclose(kernels.qcp_rmsd(frames, ref), mda_rmsd(frames, ref), atol=1e-5)


def test_weighted_rmsd_matches_qcprot(ca_frames):
    frames, masses = ca_frames
    np.testing.assert_allclose(kernels.qcp_rmsd(frames, frames[3], masses),
                               mda_rmsd(frames, frames[3], masses), atol=1e-5)


def test_rmsd_edge_cases(ca_frames):
    frames, _ = ca_frames
    ref = frames[0].astype(np.float64)
    # identical frames, and a rigidly rotated + translated copy: zero
    rot = np.array([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]])
    moved = ref @ rot.T + [5.0, -3.0, 2.0]
    out = kernels.qcp_rmsd(np.stack([ref, ref, moved]), ref)
    np.testing.assert_allclose(out, 0.0, atol=1e-5)
    # near-identical: tiny noise
    noisy = ref + np.random.default_rng(1).normal(scale=1e-3, size=ref.shape)
    np.testing.assert_allclose(kernels.qcp_rmsd(noisy[None], ref), mda_rmsd(noisy[None], ref), atol=1e-5)
    # reflected structure: proper rotations only, as qcprot
    mirrored = ref * [-1.0, 1.0, 1.0]
    got = kernels.qcp_rmsd(mirrored[None], ref)
    np.testing.assert_allclose(got, mda_rmsd(mirrored[None], ref), atol=1e-5)
    assert got[0] > 1.0
    # one frame, float32 input, one atom
    np.testing.assert_allclose(kernels.qcp_rmsd(frames[7:8], frames[0]),
                               mda_rmsd(frames[7:8], frames[0]), atol=1e-5)
    assert kernels.qcp_rmsd(frames[:, :1], frames[0, :1]).max() < 1e-6
    assert kernels.qcp_rmsd(frames[:0], frames[0]).shape == (0,)


def test_rmsd_rejects_bad_shapes(ca_frames):
    frames, _ = ca_frames
    with pytest.raises(ValueError, match="n_atoms >= 1"):
        kernels.qcp_rmsd(frames[:, :0], frames[0, :0])
    with pytest.raises(ValueError, match="atoms"):
        kernels.qcp_rmsd(frames[:, :10], frames[0])


def test_chunked_equals_one_chunk(ca_frames):
    frames, _ = ca_frames
    whole = kernels.qcp_rmsd(frames, frames[0])
    pieces = np.concatenate([kernels.qcp_rmsd(frames[i:i + 7], frames[0]) for i in range(0, len(frames), 7)])
    np.testing.assert_allclose(whole, pieces, rtol=0, atol=1e-12)


def _random_quads(n_atoms, n, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([rng.choice(n_atoms, 4, replace=False) for _ in range(n)])


def test_dihedrals_match_calc_dihedrals_without_box(adk):
    u = mda.Universe(*adk)
    x = u.trajectory.timeseries(order="fac")[:20]
    quads = _random_quads(len(u.atoms), 300)
    cos, sin = kernels.dihedral_cos_sin(x, quads)
    for f in range(len(x)):
        ang = calc_dihedrals(*(x[f][quads[:, i]] for i in range(4)))
        np.testing.assert_allclose(cos[f], np.cos(ang), atol=1e-6)
        np.testing.assert_allclose(sin[f], np.sin(ang), atol=1e-6)


@pytest.mark.parametrize("box", [[30.0, 40.0, 50.0, 90.0, 90.0, 90.0],
                                 [30.0, 30.0, 30.0, 60.0, 60.0, 90.0]])
def test_dihedrals_follow_minimum_image(box):
    """Atoms scattered through a cell: bonds cross it, so the minimum image matters."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 30, size=(3, 200, 3)).astype(np.float32)
    quads = _random_quads(200, 100, seed=3)
    boxes = np.array([box] * 3, dtype=np.float32)
    cos, sin = kernels.dihedral_cos_sin(x, quads, boxes)
    for f in range(3):
        ang = calc_dihedrals(*(x[f][quads[:, i]] for i in range(4)), box=boxes[f])
        # MDAnalysis wraps triclinic positions in float32 first: agree to its precision
        np.testing.assert_allclose(cos[f], np.cos(ang), atol=2e-5)
        np.testing.assert_allclose(sin[f], np.sin(ang), atol=2e-5)


def test_backbone_features_layout_and_agreement(adk):
    """[cos φ, sin φ, cos ψ, sin ψ] per residue, each the dihedral of four consecutive chain atoms."""
    u = mda.Universe(*adk)
    x = u.trajectory.timeseries(order="fac")[:5]
    chain = _random_quads(len(u.atoms), 40, seed=5)
    chain = np.concatenate([chain, chain[:, :1]], axis=1)  # five atoms a row
    feats = kernels.backbone_features(x, chain)
    assert feats.shape == (5, 160)
    cos_phi, sin_phi = kernels.dihedral_cos_sin(x, chain[:, :4])
    cos_psi, sin_psi = kernels.dihedral_cos_sin(x, chain[:, 1:])
    np.testing.assert_array_equal(feats[:, 0::4], cos_phi)
    np.testing.assert_array_equal(feats[:, 1::4], sin_phi)
    np.testing.assert_array_equal(feats[:, 2::4], cos_psi)
    np.testing.assert_array_equal(feats[:, 3::4], sin_psi)


KERNELS_IN_A_FRESH_INTERPRETER = """
import sys, numpy as np
from trajflow.tasks import kernels
frames = np.load(sys.argv[1])
np.save(sys.argv[2], kernels.qcp_rmsd(frames, frames[0]))
kernels.backbone_features(frames, np.arange(5).reshape(1, 5), np.tile([50.0] * 3 + [90.0] * 3, (len(frames), 1)))
print(kernels.COMPILED, "numba" in sys.modules)
"""


def run_kernels(tmp_path, env, frames):
    import subprocess
    import sys
    np.save(tmp_path / "frames.npy", frames)
    out = subprocess.run([sys.executable, "-c", KERNELS_IN_A_FRESH_INTERPRETER,
                          str(tmp_path / "frames.npy"), str(tmp_path / "rmsd.npy")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip(), out.stderr, np.load(tmp_path / "rmsd.npy")


def test_kernels_built_ahead_of_time_run_without_numba(tmp_path, ca_frames):
    """What a pilot does before its first task (python -m trajflow.tasks.kernels):
    the build lands in the kernel cache, and a task then loads it without
    importing numba (1.0 s of its start-up) and gets MDAnalysis' RMSD."""
    import os
    import subprocess
    import sys
    frames, _ = ca_frames
    env = {**os.environ, "TRAJFLOW_KERNEL_CACHE": str(tmp_path / "cache")}
    env.pop("TRAJFLOW_KERNELS", None)
    built = subprocess.run([sys.executable, "-m", "trajflow.tasks.kernels"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0 and "(ahead of time)" in built.stdout, built.stderr
    assert len(os.listdir(tmp_path / "cache")) == 1  # the build, nothing else
    said, _, rmsd = run_kernels(tmp_path, env, frames)
    assert said == "ahead of time False"
    np.testing.assert_allclose(rmsd, mda_rmsd(frames, frames[0]), atol=1e-5)


def test_a_damaged_build_falls_back_to_the_jit(tmp_path, ca_frames, monkeypatch):
    import os
    frames, _ = ca_frames
    monkeypatch.setenv("TRAJFLOW_KERNEL_CACHE", str(tmp_path / "cache"))
    _, path = kernels.compiled_module_path()
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"not a shared object")
    said, stderr, rmsd = run_kernels(tmp_path, dict(os.environ), frames[:5])
    assert said == "numba JIT True" and "could not be loaded" in stderr
    np.testing.assert_allclose(rmsd, mda_rmsd(frames[:5], frames[0]), atol=1e-5)


@pytest.mark.parametrize("offset", [0.0, 1e3, 3e3, 1e4, 1e5])
def test_rmsd_far_from_the_origin_matches_mdanalysis(ca_frames, offset):
    """Large membrane and virus systems sit thousands of Å from the origin: the
    frame is centred before its sums, so RMSD stays MDAnalysis' to 1e-6 relative
    on the same float32 coordinates (the one-pass form was 3.9e-4 Å off at 1e4 Å)."""
    frames, masses = ca_frames
    moved = (frames.astype(np.float64) + np.array([offset, -0.7 * offset, 0.3 * offset])).astype(np.float32)
    for weights in (None, masses):
        ours = kernels.qcp_rmsd(moved, moved[0], weights)
        theirs = mda_rmsd(moved, moved[0], weights)
        np.testing.assert_allclose(ours[1:], theirs[1:], rtol=1e-6)
        assert ours[0] < 1e-3


@pytest.mark.parametrize("name", ["rmsd", "dihedrals"])
def test_every_result_of_a_builtin_analysis_declares_how_it_combines(adk, name):
    """Reduce joins parts by each result's declared rule (tasks/combine.py) and refuses a
    result without one: every array a built-in returns for a block has a rule, and the
    rule joins two blocks as the whole run would have them."""
    from trajflow.tasks.analyses import ANALYSIS_CLASSES
    from trajflow.tasks.readers import open_block_reader
    from trajflow.tasks.timing import RankTimer
    cls = ANALYSIS_CLASSES[name]
    u = mda.Universe(*adk)
    selected = cls.select(u, cls.default_selection)
    analysis = cls(selected, cls.default_selection)
    reader = open_block_reader([adk[1]], selected["atom_indices"], cls.need_boxes)
    analysis.prepare(reader)
    whole = analysis.run_block(reader, 0, 20, 8, RankTimer("analyze"))
    halves = [analysis.run_block(reader, a, b, 8, RankTimer("analyze")) for a, b in ((0, 7), (7, 20))]
    assert set(whole) <= set(cls.combine), set(whole) - set(cls.combine)
    for key, rule in cls.combine.items():
        np.testing.assert_array_equal(rule.merge([h[key] for h in halves]), whole[key])
