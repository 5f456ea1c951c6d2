"""Block readers give what MDAnalysis gives, chunk by chunk, with bounded memory."""
import json
import os

import h5py
import numpy as np
import pytest
import MDAnalysis as mda

from trajflow.tasks.dcd import DCDFile, DCDTrajectory
from trajflow.tasks.xtc import XTCFile
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


DCD_FILES = ["DCD", "DCD2", "DCD_NAMD_GBIS", "DCD_NAMD_TRICLINIC", "DCD_TRICLINIC", "LAMMPSdcd2",
             "waterDCD", "COORDINATES_DCD"]


@pytest.mark.parametrize("name", DCD_FILES)
def test_dcd_read_without_mdanalysis_matches_it(name):
    """trajflow's own DCD reading (dcd.py) on every DCD of MDAnalysisTests (CHARMM,
    NAMD, LAMMPS, with and without a unit cell, MDAnalysis' own writer): the same
    frame count, coordinates and times, bit for bit; chunks longer than its batch."""
    import MDAnalysisTests.datafiles as data
    path = getattr(data, name)
    reader = TrajectoryBlockReader(open_trajectory([path]), [0])
    assert isinstance(reader.parts[0], DCDFile)  # not MDAnalysis' reader
    mda_reader = mda.coordinates.DCD.DCDReader(path)
    assert reader.n_frames == mda_reader.n_frames
    reader = TrajectoryBlockReader(open_trajectory([path]), np.arange(0, mda_reader.n_atoms, 3))
    for start, stop, chunk in [(0, mda_reader.n_frames, 70), (mda_reader.n_frames - 1,
                                                              mda_reader.n_frames, 1)]:
        frames, times, coords = collect(reader, start, stop, chunk)
        ref = [(ts.time, ts.positions[::3].copy()) for ts in mda_reader[start:stop]]
        np.testing.assert_array_equal(frames, np.arange(start, stop))
        np.testing.assert_array_equal(times, [t for t, _ in ref])
        np.testing.assert_array_equal(coords, [x for _, x in ref])


def test_dcd_chain_and_cells(adk):
    """Several DCD files read as MDAnalysis' ChainReader reads them (cumulative
    times); where boxes are needed and a file has a cell, MDAnalysis reads it."""
    from MDAnalysisTests.datafiles import DCD, DCD2, DCD_TRICLINIC, PSF_TRICLINIC
    idx = mda.Universe(adk[0]).select_atoms("name CA").indices
    reader = TrajectoryBlockReader(open_trajectory([DCD, DCD2]), idx)
    assert all(isinstance(p, DCDFile) for p in reader.parts)
    frames, times, coords = collect(reader, 90, 110, 7)
    ref_t, ref_x = mda_frames(adk[0], [DCD, DCD2], idx, 90, 110)
    np.testing.assert_array_equal(times, ref_t)
    np.testing.assert_array_equal(coords, ref_x)
    with_boxes = TrajectoryBlockReader(open_trajectory([DCD_TRICLINIC], need_boxes=True), [0, 1],
                                       need_boxes=True)
    assert not isinstance(with_boxes.parts[0], DCDFile)
    chunk = next(with_boxes.chunks(0, 3, 3))
    u = mda.Universe(PSF_TRICLINIC, DCD_TRICLINIC)
    np.testing.assert_array_equal(chunk.boxes, [ts.dimensions for ts in u.trajectory[0:3]])
    assert isinstance(open_trajectory([DCD], need_boxes=True), DCDTrajectory)  # no cell in it


def test_dcd_other_layouts_go_through_mdanalysis(adk, tmp_path):
    """Another byte order is left to MDAnalysis; a file cut inside a frame loses
    that frame as MDAnalysis does; damaged frame records are an error, not zeros."""
    data = open(adk[1], "rb").read()
    header = DCDFile.from_header(adk[1])
    cut = tmp_path / "cut.dcd"
    cut.write_bytes(data[:header.header_size + 10 * header.frame_size + 100])
    assert DCDFile.from_header(str(cut)).n_frames == mda.coordinates.DCD.DCDReader(str(cut)).n_frames == 10
    swapped = tmp_path / "big_endian.dcd"
    swapped.write_bytes(np.frombuffer(data[:4], "<i4").astype(">i4").tobytes() + data[4:])
    assert DCDFile.from_header(str(swapped)) is None
    damaged = tmp_path / "damaged.dcd"
    record = header.header_size + 5 * header.frame_size  # frame 5's first record marker
    damaged.write_bytes(data[:record] + np.int32(12).tobytes() + data[record + 4:])
    reader = TrajectoryBlockReader(open_trajectory([str(damaged)]), [0])
    with pytest.raises(OSError, match="not 3341 atoms"):
        list(reader.chunks(0, 10, 10))


@pytest.mark.parametrize("select", ["name CA", "protein and index 0:9", "all", "index 47600:47680"])
def test_dcd_rows_or_whole_frames_match_mdanalysis(solvated_dcd, select, tmp_path):
    """A selection that ends early in the solvated system's frames (the protein before
    its water) is read as each coordinate record's rows up to its last atom, others
    as whole frames; both equal MDAnalysis bit for bit over batches, and a damaged
    record marker is found by either way."""
    top, path = solvated_dcd
    u = mda.Universe(top, path)
    idx = u.select_atoms(select).indices
    dcd = DCDFile.from_header(path)
    rows = 3 * 4 * (idx.max() + 2) <= dcd.frame_size // 4
    assert rows == (select in ("name CA", "protein and index 0:9"))
    reader = TrajectoryBlockReader(open_trajectory([path]), idx)
    assert isinstance(reader.parts[0], DCDFile)
    frames, times, coords = collect(reader, 1, u.trajectory.n_frames, 4)
    ref_t, ref_x = mda_frames(top, [path], idx, 1, u.trajectory.n_frames)
    np.testing.assert_array_equal(times, ref_t)
    np.testing.assert_array_equal(coords, ref_x)
    data = open(path, "rb").read()
    record = dcd.header_size + 3 * dcd.frame_size + 56 + (4 * dcd.n_atoms + 8)  # frame 3's y marker
    damaged = tmp_path / "damaged.dcd"
    damaged.write_bytes(data[:record] + np.int32(12).tobytes() + data[record + 4:])
    with pytest.raises(OSError, match="not 47681 atoms"):
        list(TrajectoryBlockReader(open_trajectory([str(damaged)]), idx).chunks(0, 5, 5))


@pytest.mark.parametrize("select", ["name CA", "all", "index 47600:47680", "protein and index 0:9"])
def test_selective_xtc_reader_matches_mdanalysis(solvated, select, tmp_path):
    """trajflow's XTC reader (xtc.py, decoding each frame only up to the last atom
    wanted) on the solvated system: the protein first, 214 CA of 47,681 atoms, the
    whole system, a selection at its very end, ten atoms. Bit for bit, with times
    and steps; frame positions from MDAnalysis' offsets file and from a scan."""
    import shutil
    gro, xtc = solvated
    path = str(tmp_path / "solvated.xtc")
    shutil.copy(xtc, path)  # no offsets file beside it: the reader scans the headers
    u = mda.Universe(gro, xtc)
    idx = u.select_atoms(select).indices
    # a copy whose offsets file MDAnalysis is still writing (half of it there): a scan
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(xtc, half / "solvated.xtc")
    offsets = os.path.join(os.path.dirname(xtc), f".{os.path.basename(xtc)}_offsets.npz")
    data = open(offsets, "rb").read()
    (half / ".solvated.xtc_offsets.npz").write_bytes(data[:len(data) // 2])
    for source in (path, xtc, str(half / "solvated.xtc")):  # MDAnalysisTests' has its offsets
        reader = TrajectoryBlockReader(open_trajectory([source]), idx)
        assert isinstance(reader.parts[0], XTCFile)
        chunks = list(reader.chunks(2, 10, 3))
        ref = [(ts.time, ts.data["step"], ts.positions[idx].copy()) for ts in u.trajectory[2:10]]
        np.testing.assert_array_equal(np.concatenate([c.coords for c in chunks]),
                                      [x for _, _, x in ref])
        np.testing.assert_array_equal(np.concatenate([c.times for c in chunks]),
                                      [t for t, _, _ in ref])
        np.testing.assert_array_equal(np.concatenate([c.steps for c in chunks]),
                                      [s for _, s, _ in ref])


def test_xtc_odd_sizes_and_damage(adk, adk_xtc, tmp_path):
    """AdK's XTC (3341 atoms); 10 atoms (the smallest compressed frames); 9 atoms
    (stored uncompressed: left to MDAnalysis); a cut last frame is left out (the
    plan analyses whole frames only); a damaged frame is an error, not wrong numbers."""
    u = mda.Universe(*adk_xtc)
    idx = u.select_atoms("name CA").indices
    frames, times, coords = collect(TrajectoryBlockReader(open_trajectory([adk_xtc[1]]), idx),
                                    0, u.trajectory.n_frames, 40)
    ref_t, ref_x = mda_frames(adk_xtc[0], [adk_xtc[1]], idx, 0, u.trajectory.n_frames)
    np.testing.assert_array_equal(coords, ref_x)
    np.testing.assert_array_equal(times, ref_t)
    for n_atoms, ours in ((10, True), (9, False)):
        path = str(tmp_path / f"{n_atoms}.xtc")
        small = mda.Merge(u.atoms[:n_atoms])
        with mda.Writer(path, n_atoms=n_atoms) as w:
            for ts in u.trajectory[:5]:
                small.atoms.positions = u.atoms[:n_atoms].positions
                w.write(small.atoms)
        reader = TrajectoryBlockReader(open_trajectory([path]), np.arange(n_atoms))
        assert isinstance(reader.parts[0], XTCFile) == ours
        got = collect(reader, 0, 5, 5)[2]
        np.testing.assert_array_equal(got, [ts.positions.copy() for ts in
                                            mda.coordinates.XTC.XTCReader(path)])
    data = open(adk_xtc[1], "rb").read()
    whole = XTCFile.open(adk_xtc[1])
    cut = tmp_path / "cut.xtc"
    cut.write_bytes(data[:int(whole.offsets[-1]) - 10])
    assert XTCFile.open(str(cut)).n_frames == whole.n_frames - 1  # (MDAnalysis counts it)
    damaged = tmp_path / "damaged.xtc"
    a = int(whole.offsets[3]) + 88  # frame 3's byte count: frame 4 is no longer found
    damaged.write_bytes(data[:a] + np.array([8], ">i4").tobytes() + data[a + 4:])
    with pytest.raises(OSError, match="frame 4 .* does not start with an XTC header"):
        open_trajectory([str(damaged)])
    smallidx = tmp_path / "smallidx.xtc"
    a = int(whole.offsets[3]) + 84  # frame 3's first run-length index, out of xdrfile's table
    smallidx.write_bytes(data[:a] + np.array([99], ">i4").tobytes() + data[a + 4:])
    reader = TrajectoryBlockReader(open_trajectory([str(smallidx)]), np.arange(3341))
    with pytest.raises(OSError, match=r"frame 3 \(byte \d+\) is damaged"):
        list(reader.chunks(0, 5, 5))
    for shift in (1, 50):  # maxint below minint: a size of 0 or less (xdrfile never ends)
        sizes = tmp_path / f"sizes{shift}.xtc"
        a = int(whole.offsets[3]) + 60  # frame 3's minint x; its maxint x is 12 bytes on
        low = int(np.frombuffer(data[a:a + 4], ">i4")[0])
        sizes.write_bytes(data[:a + 12] + np.array([low - shift], ">i4").tobytes()
                          + data[a + 16:])
        reader = TrajectoryBlockReader(open_trajectory([str(sizes)]), np.arange(3341))
        with pytest.raises(OSError, match=r"frame 3 \(byte \d+\) is damaged"):
            list(reader.chunks(0, 5, 5))


def _water_like(rng, n_mol, spacing, bond):
    """Three-atom molecules (the runs xdrfile compresses) spread over `spacing` Å."""
    o = rng.uniform(0, spacing * (round(n_mol ** (1 / 3)) + 1), (n_mol, 3))
    h = o[:, None, :] + rng.normal(0, bond, (n_mol, 2, 3))
    return np.concatenate([o[:, None], h], axis=1).reshape(-1, 3)


def test_xtc_word_reader_and_its_bytewise_fallback_equal_xdrfile(tmp_path):
    """The decoder reads 57 bits at a time (kernel_code._xtc_frame); frames with a
    wider integer (-3) go to xdrfile's byte-wise way, from their start. Across
    precisions and spreads that give packed triples of 34 to 66 bits, separately
    stored large integers and run indices past 57, both ways are taken (also
    mid-frame), and every coordinate equals MDAnalysis' (xdrfile's)."""
    from trajflow.tasks import kernel_code
    from trajflow.tasks.xtc import _COMPRESSED, _HEAD, HEADER_BYTES
    rng = np.random.default_rng(1)
    codes = set()
    for decimals, spacing, bond in [(3, 3.0, 1.0), (6, 3.0, 1.0), (6, 30.0, 4.0),
                                    (6, 200.0, 5.0), (5, 50.0, 3.0), (6, 100.0, 20.0)]:
        frames = np.stack([_water_like(rng, 200, spacing, bond) for _ in range(3)])
        path = str(tmp_path / f"w{decimals}_{spacing}.xtc")
        u = mda.Universe.empty(frames.shape[1], trajectory=True)
        with mda.Writer(path, n_atoms=frames.shape[1], precision=decimals) as w:
            for x in frames.astype(np.float32):
                u.trajectory.ts.positions = x
                w.write(u.atoms)
        xtc = XTCFile.open(path)
        ref = np.stack([ts.positions.copy() for ts in mda.coordinates.XTC.XTCReader(path)])
        for idx in (np.arange(xtc.n_atoms), np.array([0, 1, 2, 301])):
            np.testing.assert_array_equal(xtc.read(idx, 0, xtc.n_frames)[0], ref[:, idx])
        raw = np.frombuffer(open(path, "rb").read() + bytes(256), np.uint8)
        for start in xtc.offsets[:-1]:
            c = _COMPRESSED.unpack_from(raw, int(start) + _HEAD.size)
            codes.add(min(0, kernel_code._xtc_frame(
                raw, int(start) + HEADER_BYTES, c[8], np.float32(c[0]),
                np.array(c[1:4], np.int64), np.array(c[4:7], np.int64), c[7], xtc.n_atoms,
                np.empty((xtc.n_atoms, 3), np.float32))))  # bytes taken (>= 0), or a code
    assert codes == {0, -3}


def test_selective_xtc_reads_each_frames_first_bytes_once_it_knows_how_many(solvated):
    """After a first read of whole frames, a selection of the first atoms reads only
    each frame's first bytes (1.25x what its atoms took, + 512); where a frame's atoms
    need more, the chunk is read whole again. Bit for bit with MDAnalysis either way."""
    gro, xtc_path = solvated
    u = mda.Universe(gro, xtc_path)
    ca = u.select_atoms("name CA").indices
    ref = np.array([ts.positions[ca].copy() for ts in u.trajectory])
    xtc = XTCFile.open(xtc_path)
    n_wanted = int(ca.max()) + 1
    np.testing.assert_array_equal(xtc.read(ca, 0, 4)[0], ref[:4])  # whole: learns
    frame_bytes = np.diff(xtc.offsets).mean()
    assert 0 < xtc._prefix[n_wanted] < 0.2 * frame_bytes
    np.testing.assert_array_equal(xtc.read(ca, 4, 10)[0], ref[4:10])  # first bytes only
    assert n_wanted in xtc._prefix
    xtc._prefix[n_wanted] = 600  # too few for some frame: read whole again, then relearnt
    np.testing.assert_array_equal(xtc.read(ca, 0, 10)[0], ref)
    assert xtc._prefix[n_wanted] > 600
    everything = np.arange(xtc.n_atoms)  # a whole frame never reads by prefix
    xtc.read(everything, 0, 2)
    assert xtc.n_atoms not in xtc._prefix


def test_damaged_xtc_bits_are_an_error_or_numbers_never_a_crash(adk_xtc, tmp_path):
    """Bytes flipped inside compressed frames: the decoder may read up to ~100
    bytes past a frame's end before it can tell (the padding covers it); it says
    'damaged', or decodes numbers, and never reads outside its buffer."""
    data = bytearray(open(adk_xtc[1], "rb").read())
    whole = XTCFile.open(adk_xtc[1])
    rng = np.random.default_rng(7)
    said = 0
    for trial in range(40):
        damaged = bytearray(data)
        last = int(whole.offsets[-2])  # the last frame: its padding is the buffer's end
        for _ in range(8):
            damaged[rng.integers(last + 92, len(data))] = rng.integers(0, 256)
        path = tmp_path / f"d{trial}.xtc"
        path.write_bytes(bytes(damaged))
        xtc = XTCFile.open(str(path))
        try:
            coords = xtc.read(np.arange(xtc.n_atoms), xtc.n_frames - 1, xtc.n_frames)[0]
            assert coords.shape == (1, xtc.n_atoms, 3)
        except OSError as exc:
            assert "damaged" in str(exc) or "past the end" in str(exc)
            said += 1
    assert said > 0


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


def convert_with_the_split_stage(tmp_path, top, trajs, select="all"):
    """The H5MD file the split stage writes for a run (its task program, as the pilot runs it)."""
    from run_stages import run_spec
    from trajflow.tasks.stages import stage_specs
    from plans import make_plan
    from trajflow.workflows.run.planning import write_plan
    plan = make_plan(top, trajs, "rmsd", str(tmp_path / "run"), select=select, io="h5md",
                     mode="tasks", blocks=1, cpus=1, chunk=3)
    [spec] = stage_specs(plan, write_plan(plan))["split"]
    proc = run_spec(spec)
    assert proc.returncode == 0, proc.stderr
    return plan.h5md_path()


@pytest.mark.parametrize("case", ["solvated xtc", "solvated trr", "triclinic dcd", "no box", "chain",
                                  "solvated xtc, CA"])
def test_h5md_conversion_round_trips_every_frame(tmp_path, adk, solvated, solvated_trr, case):
    """Positions, box, time and step of every frame, read back by MDAnalysis' H5MDReader and
    by trajflow's reader, against MDAnalysis reading the original. A copy for the CA
    atoms is chunked at the last one (h5md.chunk_shape), which the file records."""
    from MDAnalysisTests.datafiles import DCD_TRICLINIC, PSF_TRICLINIC
    top, trajs = {"solvated xtc": (solvated[0], [solvated[1]]),
                  "solvated trr": (solvated_trr[0], [solvated_trr[1]]),
                  "triclinic dcd": (PSF_TRICLINIC, [DCD_TRICLINIC]),
                  "no box": (adk[0], [adk[1]]),
                  "chain": (solvated[0], [solvated[1], solvated[1]]),
                  "solvated xtc, CA": (solvated[0], [solvated[1]])}[case]
    select = "name CA" if case.endswith("CA") else "all"
    path = convert_with_the_split_stage(tmp_path, top, trajs, select)
    with h5py.File(path, "r") as f:
        layout = json.loads(f["trajflow"].attrs["layout"])
        chunks = f["particles/trajectory/position/value"].chunks
    end = mda.Universe(top, trajs[0]).select_atoms(select).indices.max() + 1
    assert tuple(layout["chunks"]) == chunks and chunks[1:] == (end, 3)
    assert layout["selection_end"] == end and layout["compression"] == "none"
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
        # the box travels as float32 box vectors (as MDAnalysis' H5MDWriter writes it),
        # which other readers get within an ulp, and exact for trajflow's reader
        np.testing.assert_allclose(b.dimensions, a.dimensions, rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(our_boxes[i], a.dimensions)
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


def test_h5md_chunks_are_cut_at_the_selection_end_but_never_tiny():
    from trajflow.tasks.h5md import chunk_shape
    assert chunk_shape(47681, 1000, 3336) == (6, 3336, 3)     # CA of solvated AdK: ~240 KB
    assert chunk_shape(47681, 1000, None) == (1, 47681, 3)    # every atom: a frame a chunk
    assert chunk_shape(47681, 1000, 20) == (16, 1365, 3)      # never 4 KB chunks
    assert chunk_shape(300, 1000, 20) == (16, 300, 3)         # a small system: all its atoms
    assert chunk_shape(3341, 3, None) == (3, 3341, 3)         # never more frames than written


def test_an_xtc_repeated_as_bytes_reads_as_the_original_with_time_running_on(tmp_path):
    """The demo's and benchmarks' XTC is the original's frames copied as they are: MDAnalysis
    reads the same positions and boxes, with step and time running on across copies."""
    import warnings
    import MDAnalysis as mda
    from MDAnalysisTests.datafiles import GRO, XTC
    from trajflow.workflows.datasets import concatenated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = concatenated(GRO, XTC, "rep", 3, "XTC", folder=str(tmp_path))
        ours, original = mda.Universe(GRO, path), mda.Universe(GRO, XTC)
        n, dt = original.trajectory.n_frames, original.trajectory.dt
        assert ours.trajectory.n_frames == 3 * n
        for ts in ours.trajectory:
            ref = original.trajectory[ts.frame % n]
            np.testing.assert_array_equal(ts.positions, ref.positions)
            np.testing.assert_allclose(ts.dimensions, ref.dimensions)
            assert ts.data["step"] == ts.frame
            assert ts.time == pytest.approx(ts.frame * dt, abs=1e-3)
