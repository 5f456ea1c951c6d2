"""Block readers give what MDAnalysis gives, chunk by chunk, with bounded memory."""
import h5py
import numpy as np
import pytest
import MDAnalysis as mda

from trajflow.tasks.h5md import H5MDWriter
from trajflow.tasks.readers import H5MDChunkReader, TrajectoryBlockReader, open_trajectory


def mda_frames(top, trajs, idx, start, stop):
    u = mda.Universe(top, trajs[0] if len(trajs) == 1 else trajs)
    out = [(u.trajectory.time, ts.positions[idx].copy()) for ts in u.trajectory[start:stop]]
    return np.array([t for t, _ in out]), np.array([x for _, x in out])


def collect(reader, start, stop, chunk):
    chunks = list(reader.chunks(start, stop, chunk))
    assert all(len(c.frames) <= chunk for c in chunks)
    return (np.concatenate([c.frames for c in chunks]), np.concatenate([c.times for c in chunks]),
            np.concatenate([c.coords for c in chunks]))


@pytest.mark.parametrize("fmt", ["dcd", "xtc", "chain"])
def test_universe_reader_matches_mdanalysis(adk, adk_xtc, fmt):
    top = adk[0]
    trajs = {"dcd": [adk[1]], "xtc": [adk_xtc[1]], "chain": [adk[1], adk_xtc[1]]}[fmt]
    idx = mda.Universe(top).select_atoms("name CA").indices
    reader = TrajectoryBlockReader(open_trajectory(trajs), idx)
    start, stop = (90, 110) if fmt == "chain" else (5, 60)
    frames, times, coords = collect(reader, start, stop, 7)
    ref_t, ref_x = mda_frames(top, trajs, idx, start, stop)
    np.testing.assert_array_equal(frames, np.arange(start, stop))
    np.testing.assert_allclose(times, ref_t, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(coords, ref_x)


@pytest.mark.parametrize("case", ["periodic", "batches", "one frame"])
def test_dcd_straight_from_the_file_matches_mdanalysis(adk, case):
    """The raw DCD path (batched reads, numpy picks the atoms): a unit-cell record
    before the coordinates, chunks longer than its batch of frames, one frame."""
    from MDAnalysisTests.datafiles import DCD_TRICLINIC, PSF_TRICLINIC
    top, traj = (PSF_TRICLINIC, DCD_TRICLINIC) if case == "periodic" else adk
    u = mda.Universe(top, traj)
    idx = u.select_atoms("all" if case == "periodic" else "name CA").indices[::3]
    start, stop, chunk = {"periodic": (1, 10, 4), "batches": (3, 98, 70), "one frame": (41, 42, 1)}[case]
    reader = TrajectoryBlockReader(open_trajectory([traj]), idx)
    assert reader._dcd_raw(reader.parts[0], start, stop) is not None  # not the fallback
    frames, times, coords = collect(reader, start, stop, chunk)
    ref_t, ref_x = mda_frames(top, [traj], idx, start, stop)
    np.testing.assert_array_equal(frames, np.arange(start, stop))
    np.testing.assert_allclose(times, ref_t, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(coords, ref_x)


def test_h5md_reader_matches_mdanalysis(adk, tmp_path):
    top, dcd = adk
    u = mda.Universe(top, dcd)
    x = u.trajectory.timeseries(order="fac")
    path = str(tmp_path / "a.h5md")
    w = H5MDWriter(path, x.shape[1], len(x), compression="gzip:1")
    w.write(np.arange(len(x)) * 2.0, x)
    w.close()
    idx = u.select_atoms("name CA").indices
    frames, times, coords = collect(H5MDChunkReader(path, idx), 10, 50, 16)
    ref_t, ref_x = mda_frames(top, [path], idx, 10, 50)  # MDAnalysis' own H5MD reader
    np.testing.assert_allclose(times, ref_t)
    np.testing.assert_allclose(coords, ref_x, atol=1e-5)
    np.testing.assert_array_equal(coords, x[10:50][:, idx])


def test_memory_is_bounded_by_the_chunk(adk, tmp_path):
    """A long trajectory (AdK x20, 1960 frames, all atoms) read 32 frames at a time."""
    top, dcd = adk
    u = mda.Universe(top, dcd)
    x = u.trajectory.timeseries(order="fac")
    path = str(tmp_path / "long.h5md")
    w = H5MDWriter(path, x.shape[1], 20 * len(x))
    for c in range(20):
        w.write((np.arange(len(x)) + c * len(x)) * 1.0, x)
    w.close()
    idx = np.arange(x.shape[1])
    largest, n = 0, 0
    for chunk in H5MDChunkReader(path, idx).chunks(0, 20 * len(x), 32):
        largest = max(largest, chunk.coords.nbytes)
        n += len(chunk.frames)
    assert n == 20 * len(x)
    assert largest == 32 * x.shape[1] * 3 * 4  # never more than one chunk of coordinates


def convert_with_the_split_stage(tmp_path, top, trajs):
    """The H5MD file the split stage writes for a run (its task program, as the pilot runs it)."""
    from stages import run_spec
    from trajflow.workflows.pipeline import stage_specs
    from trajflow.workflows.planning import make_plan, write_plan
    plan = make_plan(top, trajs, "rmsd", str(tmp_path / "run"), selection="all", io="h5md",
                     mode="tasks", blocks=1, cpus=1, chunk_frames=3)
    [spec] = stage_specs(plan, write_plan(plan))["split"]
    proc = run_spec(spec)
    assert proc.returncode == 0, proc.stderr
    return plan.h5md_path()


@pytest.mark.parametrize("case", ["solvated xtc", "solvated trr", "triclinic dcd", "no box", "chain"])
def test_h5md_conversion_round_trips_every_frame(tmp_path, adk, solvated, solvated_trr, case):
    """Positions, box, time and step of every frame, read back by MDAnalysis' H5MDReader and
    by trajflow's reader, against MDAnalysis reading the original."""
    from MDAnalysisTests.datafiles import DCD_TRICLINIC, PSF_TRICLINIC
    top, trajs = {"solvated xtc": (solvated[0], [solvated[1]]),
                  "solvated trr": (solvated_trr[0], [solvated_trr[1]]),
                  "triclinic dcd": (PSF_TRICLINIC, [DCD_TRICLINIC]),
                  "no box": (adk[0], [adk[1]]),
                  "chain": (solvated[0], [solvated[1], solvated[1]])}[case]
    path = convert_with_the_split_stage(tmp_path, top, trajs)
    original = mda.Universe(top, trajs[0] if len(trajs) == 1 else trajs)
    converted = mda.Universe(top, path)
    ours = H5MDChunkReader(path, np.arange(len(original.atoms)), need_boxes=True)
    chunks = list(ours.chunks(0, ours.n_frames, 4))
    our_boxes = None if chunks[0].boxes is None else np.concatenate([c.boxes for c in chunks])
    our_coords = np.concatenate([c.coords for c in chunks])
    assert converted.trajectory.n_frames == ours.n_frames == original.trajectory.n_frames
    steps = []
    for i, (a, b) in enumerate(zip(original.trajectory, converted.trajectory)):
        np.testing.assert_array_equal(b.positions, a.positions)
        np.testing.assert_array_equal(our_coords[i], a.positions)
        assert b.time == pytest.approx(original.trajectory.time, abs=1e-9)
        steps.append(b.data["step"])
        if a.dimensions is None:
            assert b.dimensions is None and our_boxes is None
            continue
        # the box travels as float32 box vectors (as MDAnalysis' H5MDWriter writes it)
        np.testing.assert_allclose(b.dimensions, a.dimensions, rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(our_boxes[i], b.dimensions)
    if case == "chain":  # the second copy's steps restart: shifted to keep increasing
        assert np.all(np.diff(steps) > 0)
        assert np.all(np.diff(steps) == np.diff(steps)[0])
    else:
        assert steps == [ts.data.get("step", ts.frame + 1) for ts in original.trajectory]
    with h5py.File(path) as f:
        box = f["particles/trajectory/box"]
        periodic = case != "no box"
        assert [b.decode() for b in box.attrs["boundary"]] == ["periodic" if periodic else "none"] * 3
        assert ("edges" in box) == periodic
        assert f["particles/trajectory/position/value"].attrs["unit"] == "Angstrom"
        assert f["particles/trajectory/position/time"].attrs["unit"] == "ps"
        if periodic:
            np.testing.assert_array_equal(box["edges/step"][()], f["particles/trajectory/position/step"][()])
