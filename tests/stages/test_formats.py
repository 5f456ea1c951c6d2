"""Files nobody here wrote: every reader path of trajflow against MDAnalysis' own reader.

Differential and property-based (hypothesis): trajectories generated over atom
counts, coordinate magnitudes, XTC precisions, per-frame boxes (absent, zero,
orthorhombic, triclinic), H5MD units and dtypes, written with MDAnalysis'
writers or by hand with h5py where MDAnalysis cannot write the case, then read
by trajflow and by MDAnalysis and compared bit for bit (coordinates, box,
time). MDAnalysisTests' own odd files too. End to end, trajectories whose
first frame has no box, XTC at other precisions and H5MD inputs of another
writer go through every io strategy and equal MDAnalysis' serial answer.
Where MDAnalysis is wrong (an H5MD box in another unit than the positions),
the expectation is the data written, and the test says so.
"""
import os
import warnings

import h5py
import numpy as np
import pytest
import MDAnalysis as mda
from hypothesis import HealthCheck, example, given, settings, strategies as st
from MDAnalysis.lib.mdamath import triclinic_box, triclinic_vectors

from trajflow.tasks import units
from trajflow.tasks.h5md import H5MDError
from trajflow.tasks.readers import open_block_reader
from paths import FACTORIES

pytestmark = pytest.mark.timeout(600)
warnings.filterwarnings("ignore", module="MDAnalysis")
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def read_ours(paths, idx, need_boxes, chunk=3):
    reader = open_block_reader(paths, idx, need_boxes)
    try:
        chunks = list(reader.chunks(0, reader.n_frames, chunk))
    finally:
        reader.close()
    coords = np.concatenate([c.coords for c in chunks])
    times = np.concatenate([c.times for c in chunks])
    boxes = None if all(c.boxes is None for c in chunks) else np.concatenate(
        [np.zeros((len(c.times), 6), np.float32) if c.boxes is None else c.boxes for c in chunks])
    return coords, times, boxes


def read_mdanalysis(paths, idx):
    traj = mda.coordinates.core.reader(paths[0] if len(paths) == 1 else list(paths))
    coords, times, boxes = [], [], []
    for ts in traj:
        coords.append(ts.positions[idx].copy())
        times.append(traj.time)
        boxes.append(np.zeros(6, np.float32) if ts.dimensions is None else ts.dimensions.copy())
    traj.close()
    return np.array(coords), np.array(times), np.array(boxes)


def assert_reads_like_mdanalysis(paths, idx=None, boxes_too=True):
    """trajflow's readers (without and with boxes) give MDAnalysis' frames bit for bit."""
    m_coords, m_times, m_boxes = read_mdanalysis(paths, slice(None) if idx is None else idx)
    idx = np.arange(m_coords.shape[1]) if idx is None else np.asarray(idx)
    for need_boxes in (False, True) if boxes_too else (False,):
        coords, times, boxes = read_ours(paths, idx, need_boxes)
        assert coords.dtype == np.float32
        np.testing.assert_array_equal(coords, m_coords)
        np.testing.assert_array_equal(times, m_times)
        if need_boxes:
            np.testing.assert_array_equal(np.zeros_like(m_boxes) if boxes is None else boxes, m_boxes)


# --- what can be in a frame --------------------------------------------------------

BOX_KINDS = ("absent", "zero", "orthorhombic", "triclinic")


@st.composite
def frames(draw, max_atoms=40, max_frames=5, magnitudes=(1e-3, 1.0, 100.0, 3e3, 1e5)):
    """(coords (F, N, 3) float32 Å, per-frame dimensions (F, 6) float32, zeros = no box)."""
    n_atoms = draw(st.integers(1, max_atoms))
    n_frames = draw(st.integers(1, max_frames))
    magnitude = draw(st.sampled_from(magnitudes))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    centre = rng.uniform(-magnitude, magnitude, 3)
    coords = centre + rng.normal(0, max(1.0, magnitude / 100), (n_frames, n_atoms, 3))
    kinds = draw(st.lists(st.sampled_from(BOX_KINDS), min_size=n_frames, max_size=n_frames))
    boxes = np.zeros((n_frames, 6), np.float32)
    for f, kind in enumerate(kinds):
        lengths = rng.uniform(20, 80, 3)
        if kind == "orthorhombic":
            boxes[f] = [*lengths, 90, 90, 90]
        elif kind == "triclinic":
            boxes[f] = [*lengths, *rng.uniform(60, 120, 3)]
            if not triclinic_box(*triclinic_vectors(boxes[f])).any():
                boxes[f] = [*lengths, 90, 90, 90]  # angles that make no box
    return coords.astype(np.float32), boxes


def write_with_mdanalysis(path, coords, boxes, **writer_kwargs):
    u = mda.Universe.empty(coords.shape[1], trajectory=True)
    with mda.Writer(str(path), n_atoms=coords.shape[1], **writer_kwargs) as w:
        for f, x in enumerate(coords):
            u.trajectory.ts.positions = x
            u.trajectory.ts.dimensions = boxes[f] if boxes[f, :3].any() else None
            u.trajectory.ts.time = 0.5 * f
            w.write(u.atoms)
    return str(path)


@PROPERTY
@given(data=frames(), precision=st.sampled_from([10, 100, 1000, 10_000, 100_000, 1_000_000]))
@example(data=(np.random.default_rng(2).normal(-9000, 100, (2, 35, 3)).astype(np.float32),
               np.zeros((2, 6), np.float32)), precision=1_000_000)  # past xdrfile's table
def test_xtc_of_any_precision_reads_like_mdanalysis(tmp_path_factory, data, precision):
    coords, boxes = data
    # xdrfile stores int(x * precision) in nm: beyond 2**30 it cannot write the frame
    if np.abs(coords).max() / 10 * precision > 2**30:
        precision = 10
    path = write_with_mdanalysis(tmp_path_factory.mktemp("xtc") / "t.xtc", coords, boxes,
                                 precision=int(round(np.log10(precision))))  # its decimals
    try:
        read_ours([path], np.arange(coords.shape[1]), False)
    except OSError as exc:
        # Where MDAnalysis is wrong: on large coordinates xdrfile's compressor uses the
        # entry past the end of its table (undefined memory); MDAnalysis reads junk back
        # without a word. trajflow refuses, naming the file and frame.
        assert "past the end of xdrfile's table" in str(exc) and path in str(exc)
        assert np.abs(read_mdanalysis([path], slice(None))[0] - coords).max() > 1.0
        return
    assert_reads_like_mdanalysis([path])
    # a selection that ends early in the frame (the decoder stops there)
    assert_reads_like_mdanalysis([path], idx=[0, coords.shape[1] // 2], boxes_too=False)


@PROPERTY
@given(data=frames(), fmt=st.sampled_from(["dcd", "trr"]))
def test_dcd_and_trr_read_like_mdanalysis(tmp_path_factory, data, fmt):
    coords, boxes = data
    path = write_with_mdanalysis(tmp_path_factory.mktemp(fmt) / f"t.{fmt}", coords, boxes)
    assert_reads_like_mdanalysis([path])


# --- H5MD of other writers -------------------------------------------------------------

def write_h5md_by_hand(path, coords, boxes, length="nm", time="ps", box_unit=None,
                       dtype=np.float32, time_dtype=np.float64, group="particles_of_someone"):
    """An H5MD file as another program writes it: positions in `length`, time in
    `time`, box vectors per frame in `box_unit` (default: no unit attribute on the
    box, as many writers do), the data in `dtype`."""
    scale = units.to_angstrom(units.H5MD_LENGTH[length]) if length else 1.0
    with h5py.File(path, "w") as f:
        f.create_group("h5md").attrs["version"] = [1, 1]
        p = f.create_group(f"particles/{group}")
        pos = p.create_group("position")
        value = pos.create_dataset("value", data=(coords.astype(np.float64) / scale).astype(dtype))
        if length:
            value.attrs["unit"] = length
        t = pos.create_dataset("time", data=(np.arange(len(coords)) * 0.25 + 1).astype(time_dtype))
        if time:
            t.attrs["unit"] = time
        pos.create_dataset("step", data=np.arange(len(coords)) * 10)
        box = p.create_group("box")
        box.attrs["dimension"] = 3
        box.attrs["boundary"] = ["periodic"] * 3
        box_scale = units.to_angstrom(units.H5MD_LENGTH[box_unit or length])
        edges = box.create_group("edges")
        vectors = np.stack([triclinic_vectors(b, dtype=np.float64) for b in boxes])
        ev = edges.create_dataset("value", data=(vectors / box_scale).astype(dtype))
        if box_unit:
            ev.attrs["unit"] = box_unit
        edges["step"], edges["time"] = pos["step"], pos["time"]
    return str(path)


@PROPERTY
@given(data=frames(max_atoms=30), length=st.sampled_from(sorted(units.H5MD_LENGTH)),
       time=st.sampled_from(sorted(units.H5MD_TIME)), dtype=st.sampled_from([np.float32, np.float64]),
       time_dtype=st.sampled_from([np.float32, np.float64, np.int64]))
@example(data=(np.full((2, 3, 3), 1000.0, np.float32), np.array([[0] * 6, [30, 30, 30, 90, 90, 90]], np.float32)),
         length="nm", time="AKMA", dtype=np.float64, time_dtype=np.float32)
def test_foreign_h5md_reads_like_mdanalysis(tmp_path_factory, data, length, time, dtype, time_dtype):
    """Units as MDAnalysis converts them (AKMA time, fm, float32 times scaled in
    float32, float64 data cast before scaling), boxes per frame."""
    coords, boxes = data
    path = write_h5md_by_hand(tmp_path_factory.mktemp("h5md") / "t.h5md", coords, boxes, length,
                              time, dtype=dtype, time_dtype=time_dtype)
    assert_reads_like_mdanalysis([path])


def test_units_are_mdanalysis_own():
    for unit, mda_unit in units.H5MD_LENGTH.items():
        assert units.to_angstrom(mda_unit) == mda.units.get_conversion_factor("length", mda_unit, "Angstrom"), unit
    for unit, mda_unit in units.H5MD_TIME.items():
        assert units.to_ps(mda_unit) == mda.units.get_conversion_factor("time", mda_unit, "ps"), unit
    assert units.H5MD_LENGTH == mda.coordinates.H5MD.H5MDReader._unit_translation["length"]
    assert units.H5MD_TIME == mda.coordinates.H5MD.H5MDReader._unit_translation["time"]


def test_h5md_box_in_its_own_unit_is_read_as_written(tmp_path):
    """MDAnalysis converts an H5MD box with the positions' unit whatever the box's
    own `unit` says (here nm positions, Å box: its box comes out 10x too large).
    trajflow follows the data written: the box's own unit."""
    rng = np.random.default_rng(1)
    coords = rng.uniform(0, 30, (2, 5, 3)).astype(np.float32)
    boxes = np.array([[31, 32, 33, 90, 90, 90], [31, 32, 33, 80, 85, 95]], np.float32)
    path = write_h5md_by_hand(tmp_path / "t.h5md", coords, boxes, length="nm", box_unit="Angstrom")
    _, _, ours = read_ours([path], np.arange(5), True)
    _, _, theirs = read_mdanalysis([path], slice(None))
    np.testing.assert_allclose(ours, boxes, rtol=2e-6)
    np.testing.assert_allclose(theirs[:, :3], 10 * boxes[:, :3], rtol=2e-6)  # MDAnalysis' error


@pytest.mark.parametrize("missing,message", [("length", "has no unit attribute"),
                                             ("time", "has no unit attribute"),
                                             ("odd", "which MDAnalysis does not know")])
def test_h5md_without_units_is_refused_as_mdanalysis_refuses_it(tmp_path, missing, message):
    coords = np.ones((2, 3, 3), np.float32)
    boxes = np.zeros((2, 6), np.float32)
    kwargs = {"length": None} if missing == "length" else {"time": None} if missing == "time" else {}
    path = write_h5md_by_hand(tmp_path / "t.h5md", coords, boxes, box_unit="nm", **kwargs)
    if missing == "odd":
        with h5py.File(path, "a") as f:
            f["particles/particles_of_someone/position/value"].attrs["unit"] = "furlong"
    with pytest.raises((ValueError, RuntimeError, TypeError)):  # TypeError wraps its ValueError
        mda.coordinates.core.reader(path)
    with pytest.raises(H5MDError, match=message) as info:
        open_block_reader([path], np.arange(3), True)
    assert path in str(info.value)


# --- MDAnalysisTests' own odd files ----------------------------------------------------

def odd_files():
    from MDAnalysisTests import datafiles as d
    return {"cobrotoxin xtc (solvent subset)": [d.XTC_sub_sol],
            "random walk xtc": [d.RANDOM_WALK],
            "adk dcd with dims": [d.DCD2],
            "NAMD triclinic dcd": [d.DCD_NAMD_TRICLINIC],
            "LAMMPS dcd": [d.LAMMPSdcd2],
            "CHARMM triclinic dcd": [d.DCD_TRICLINIC],
            "cobrotoxin h5md (x, v, f)": [d.H5MD_xvf],
            "cobrotoxin trr": [d.TRR_sub_sol]}


@pytest.mark.parametrize("name", sorted(odd_files()))
def test_mdanalysistests_odd_files_read_like_mdanalysis(name):
    assert_reads_like_mdanalysis(odd_files()[name])


# --- end to end: every io strategy on files of other writers ---------------------------

def boxed_late(tmp_path, fmt, solvated):
    """The solvated AdK (protein broken across a triclinic box) with no cell in its
    first frame, as a trajectory that starts from a non-periodic structure does:
    the box must be taken frame by frame."""
    u = mda.Universe(*solvated)
    path = str(tmp_path / f"boxed_late.{fmt}")
    with mda.Writer(path, n_atoms=len(u.atoms)) as w:
        for ts in u.trajectory:
            if ts.frame == 0:
                ts.dimensions = None
            w.write(u.atoms)
    return solvated[0], path


STRATEGIES = [("shared", "tasks"), ("split", "mpi"), ("split", "tasks"), ("h5md", "mpi"), ("h5md", "tasks")]


def check_against_mdanalysis(tmp_path, top, traj, analysis, reference_results, io, mode, tolerance):
    from run_stages import plan_and_run
    path, plan = plan_and_run(tmp_path / f"run-{io}-{mode}", top, [traj], analysis, io=io, mode=mode,
                              blocks=2, cpus=2, chunk=3, side_by_side=True)
    expected = reference_results(top, [traj], analysis)
    key = "rmsd" if analysis == "rmsd" else "features"
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["frame"][()], expected["frame"])
        np.testing.assert_array_equal(f["time"][()], expected["time"])
        np.testing.assert_allclose(f[key][()], expected[key], rtol=0, atol=tolerance)
    return plan


@pytest.mark.parametrize("fmt", ["xtc", "dcd", "trr"])
@pytest.mark.parametrize("io,mode", STRATEGIES)
def test_a_box_missing_in_the_first_frame_is_not_lost(tmp_path, solvated, reference_results, fmt, io, mode):
    top, traj = boxed_late(tmp_path, fmt, solvated)
    assert mda.Universe(top, traj).trajectory[0].dimensions is None
    # MDAnalysis' float32 minimum image on this large box: 2e-5 (see test_stages)
    check_against_mdanalysis(tmp_path, top, traj, "dihedrals", reference_results, io, mode, 2e-5)


@pytest.mark.parametrize("decimals", [2, 4, 5])
@pytest.mark.parametrize("analysis,tolerance", [("rmsd", 1e-6), ("dihedrals", 1e-6)])
def test_split_segments_keep_any_xtc_precision(tmp_path, adk, reference_results, decimals, analysis, tolerance):
    """Segments were XTC at precision 1000 whatever the input's: at 10,000 RMSD
    was 7.7e-4 Å off. Now they hold the input's float32 coordinates."""
    u = mda.Universe(*adk)
    traj = str(tmp_path / f"adk_{decimals}.xtc")
    with mda.Writer(traj, n_atoms=len(u.atoms), precision=decimals) as w:
        for _ in u.trajectory[:30]:
            w.write(u.atoms)
    for io, mode in (("split", "tasks"), ("split", "mpi"), ("h5md", "tasks")):
        check_against_mdanalysis(tmp_path, adk[0], traj, analysis, reference_results, io, mode, tolerance)


def test_trr_segments_carry_the_inputs_float32_and_velocities(tmp_path, solvated_trr):
    """TRR segments went through Å -> nm -> Å (1 ulp on 6.7 % of coordinates);
    the H5MD segment holds MDAnalysis' own float32 positions and velocities."""
    from run_stages import plan_and_run
    top, traj = solvated_trr
    _, plan = plan_and_run(tmp_path / "run", top, [traj], "rmsd", io="split", mode="tasks",
                           blocks=2, cpus=2, side_by_side=True)
    u = mda.Universe(top, traj)
    start, stop = plan.blocks[1]
    # segments are removed with the run's parts once result.h5 is published: rebuild one
    from trajflow.tasks.copies import write_segment
    from trajflow.tasks.timing import RankTimer
    write_segment(plan, u, 1, RankTimer("split", rank=0, size=1))
    seg = mda.Universe(top, plan.segment_path(1))
    assert seg.trajectory.n_frames == stop - start
    for a, b in zip(u.trajectory[start:stop], seg.trajectory):
        np.testing.assert_array_equal(b.positions, a.positions)
        np.testing.assert_array_equal(b.velocities, a.velocities)


def test_an_h5md_input_is_read_as_it_is(tmp_path, solvated, reference_results):
    """An H5MD file MDAnalysis' H5MDWriter wrote (nm, ps): read natively with
    --io shared and --io h5md (no copy made), equal to MDAnalysis reading it."""
    import subprocess
    import sys
    traj = str(tmp_path / "solvated.h5md")
    # written by a program of its own, as a user's file is (MDAnalysis' H5MDWriter
    # keeps its HDF5 lock until its process ends, seen here)
    subprocess.run([sys.executable, "-c", f"""
import MDAnalysis as mda
u = mda.Universe({solvated[0]!r}, {solvated[1]!r})
with mda.Writer({traj!r}, n_atoms=len(u.atoms)) as w:
    for _ in u.trajectory:
        w.write(u.atoms)
"""], check=True, timeout=120)
    for io, mode in (("shared", "mpi"), ("h5md", "tasks")):
        for analysis, tolerance in (("rmsd", 1e-6), ("dihedrals", 2e-5)):
            plan = check_against_mdanalysis(tmp_path / analysis, solvated[0], traj, analysis,
                                            reference_results, io, mode, tolerance)
            assert plan.h5md_path() == traj if io == "h5md" else True
            assert not os.path.exists(plan.path("split", "trajectory.h5md"))


def test_user_analysis_on_a_box_missing_in_the_first_frame(tmp_path, solvated):
    """A user's analysis through the split segments and the H5MD copy sees every
    frame's own box and the input's exact coordinates, as a serial run does."""
    from run_stages import plan_and_run
    from trajflow.tasks.results import open_result
    factories = FACTORIES
    top, traj = boxed_late(tmp_path, "xtc", solvated)
    import importlib.util
    spec = importlib.util.spec_from_file_location("factories", factories)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    serial = module.dihedral(mda.Universe(top, traj)).run().results.angles
    for io in ("split", "h5md"):
        _, plan = plan_and_run(tmp_path / io, top, [traj], f"{factories}:dihedral", io=io,
                               mode="tasks", blocks=2, cpus=2, side_by_side=True)
        np.testing.assert_array_equal(open_result(plan.workdir)["angles"], serial)


# --- damaged files met by trajflow's own readers ----------------------------------------

def test_xtc_cut_inside_its_first_frame_or_its_last(tmp_path, adk_xtc):
    """Cut in the first frame: a clear OSError naming the file (was IndexError). Cut
    in the last: the same whole frames whether MDAnalysis' offsets file lies beside
    it or not (it counted the cut frame before)."""
    from trajflow.tasks.xtc import XTCFile
    data = open(adk_xtc[1], "rb").read()
    first = tmp_path / "first.xtc"
    first.write_bytes(data[:200])
    with pytest.raises(OSError, match="holds no whole frame") as info:
        XTCFile.open(str(first))
    assert str(first) in str(info.value)
    whole = mda.Universe(adk_xtc[1]).trajectory  # its frame starts
    cut = tmp_path / "last.xtc"
    cut.write_bytes(data[:int(whole._xdr.offsets[-1]) + 100])
    without_offsets = XTCFile.open(str(cut)).n_frames
    mda.coordinates.core.reader(str(cut)).close()  # writes .last.xtc_offsets.npz beside it
    assert os.path.exists(tmp_path / ".last.xtc_offsets.npz")
    assert XTCFile.open(str(cut)).n_frames == without_offsets == whole.n_frames - 1


def test_dcd_promising_a_cell_it_lacks_is_refused_before_any_pilot(tmp_path, adk):
    """MDAnalysis reads such a file as garbage (coordinates taken for the cell);
    trajflow refuses it at planning with the reason, not as a truncation."""
    import shutil
    import struct
    from trajflow.workflows.errors import InputError
    from plans import make_plan
    bad = tmp_path / "nocell.dcd"
    shutil.copy(adk[1], bad)
    with open(bad, "r+b") as f:
        f.seek(48)
        f.write(struct.pack("<i", 1))  # CHARMM's "extra block" flag: a cell per frame
    with pytest.raises(InputError, match="unit cell record, but the first frame starts with"):
        make_plan(adk[0], [str(bad)], "rmsd", str(tmp_path / "run"), io="shared", mode="tasks",
                  blocks=2, cpus=2)
    assert not os.path.exists(tmp_path / "run")  # nothing written
