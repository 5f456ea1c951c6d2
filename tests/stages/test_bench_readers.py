"""`trajflow bench --readers`: every reader decodes the same frames, checked equal
before a number is printed; a peer that cannot be measured is null with its reason."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from trajflow.workflows.bench.readers import check_same, format_readers

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
XTC_KEYS = ["ours_full_ns_per_atom", "ours_selective_us_per_frame", "xdrfile_ns_per_atom",
            "mdtraj_ns_per_atom", "chemfiles_ns_per_atom", "molly_ns_per_atom"]
H5MD_KEYS = ["one_frame_chunks_us_per_frame", "selection_layout_us_per_frame",
             "dcd_rows_us_per_frame", "selection_layout_efficiency_2"]


@pytest.mark.serial  # judges time: run alone (see the Makefile)
@pytest.mark.timeout(900)
def test_bench_readers_measures_every_peer_on_the_same_frames(tmp_path):
    out = tmp_path / "readers.json"
    proc = subprocess.run([TRAJFLOW, "bench", "--readers", "--large-gb", "0.002", "--launches",
                           "1", "--json", str(out)], capture_output=True, text=True, timeout=850,
                          env={**os.environ, "TRAJFLOW_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    readers = json.loads(out.read_text())["readers"]
    cargo = shutil.which("cargo") or os.path.exists(os.path.expanduser("~/.cargo/bin/cargo"))
    for key in XTC_KEYS:
        if key == "molly_ns_per_atom" and not cargo:
            assert readers["xtc"][key] is None and "cargo is not installed" in proc.stdout
            continue
        assert readers["xtc"][key] > 0, key
    for key in H5MD_KEYS:
        assert readers["h5md"][key] > 0, key
    assert readers["xtc"]["frames"] == 20 and readers["xtc"]["atoms"] == 47681
    assert readers["xtc"]["selected_atoms"] == 214
    assert "XTC readers, 20 frames of 47,681 atoms" in proc.stdout
    assert "laid out for selection" in proc.stdout and "DCD rows" in proc.stdout
    import h5py
    if not h5py.get_config().mpi:  # the MPI-IO rows need the parallel HDF5 environment
        assert readers["h5md"]["mpio_2_ranks_us_per_frame"] is None
        assert "H5MD through MPI-IO, 2 ranks: not measured: this Python's h5py is built " \
               "without MPI" in proc.stdout


@pytest.mark.timeout(600)
def test_bench_h5md_mpio_rows_read_with_two_ranks_each_way(tmp_path, adk):
    """The MPI-IO rows of bench --readers on AdK written in a selection layout: where
    h5py has MPI (make test-parallel-hdf5), two ranks read it on their own (sec2) and
    through MPI-IO with independent and collective reads (97 frames in chunks of 16:
    3 reads on one rank, 4 on the other; the padding keeps the collective ones matched,
    and HDF5 says they were collective);
    elsewhere the rows are not measured, and the reason says where they are."""
    import h5py
    import MDAnalysis as mda
    from trajflow.tasks.h5md import H5MDWriter
    from trajflow.workflows.bench.readers import mpio_rows
    u = mda.Universe(*adk)
    ca = u.select_atoms("name CA").indices
    coords = np.stack([ts.positions.copy() for ts in u.trajectory])[:97]
    path = str(tmp_path / "adk_selection.h5md")
    w = H5MDWriter(path, coords.shape[1], len(coords), selection_end=int(ca.max()) + 1)
    w.write(np.arange(len(coords), dtype=np.float64), coords)
    w.close()
    rows, why = mpio_rows(path, ca, len(coords), 1, chunk=16)
    if h5py.get_config().mpi:
        assert why is None and set(rows) == {"sec2", "independent", "collective"}
        assert all(us > 0 for us in rows.values()), rows
    else:
        assert rows is None and "parallel HDF5 environment" in why


def test_a_reader_that_differs_is_never_reported():
    ours = np.random.default_rng(0).normal(0, 50, (2, 5, 3)).astype(np.float32)
    check_same(ours, ours.copy(), "a float32 peer")
    check_same(ours, ours.astype(np.float64) * (1 + 1e-8), "a float64 peer")  # rounding
    with pytest.raises(AssertionError, match="differ"):
        check_same(ours, ours + np.float32(1e-3), "a float32 peer")
    with pytest.raises(AssertionError, match="differ"):
        check_same(ours, ours.astype(np.float64) + 1e-3, "a float64 peer")
    with pytest.raises(AssertionError, match="read"):
        check_same(ours, ours[:1], "a short peer")


def test_a_missing_peer_is_printed_with_its_reason():
    xtc = {"ours_full_ns_per_atom": 10.0, "xdrfile_ns_per_atom": 20.0, "mdtraj_ns_per_atom": 15.0,
           "chemfiles_ns_per_atom": 30.0, "molly_ns_per_atom": None, "frames": 5, "atoms": 9,
           "selected_atoms": 2, "last_selected_atom": 3, "ours_selective_us_per_frame": 1.0}
    h5md = {"one_frame_chunks_us_per_frame": 8.0, "selection_layout_us_per_frame": 2.0,
            "dcd_rows_us_per_frame": 2.0, "selection_layout_efficiency_2": 0.9, "frames": 5,
            "all_frames": 9, "selection_layout_all_frames_us_per_frame": 2.0,
            "compressed_us_per_frame": {}, "mpio_2_ranks_us_per_frame": None,
            "mpio_missing": "this Python's h5py is built without MPI"}
    text = format_readers({"xtc": xtc, "h5md": h5md, "xtc_file": "x.xtc",
                           "missing": {"molly": "cargo is not installed"}})
    assert "molly" in text and "not measured: cargo is not installed" in text
    assert "xdrfile          20.0        2.00x" in text
    assert "MPI-IO, 2 ranks: not measured: this Python's h5py is built without MPI" in text
    h5md["mpio_2_ranks_us_per_frame"] = {"sec2": 4.0, "independent": 5.0, "collective": 6.0}
    text = format_readers({"xtc": xtc, "h5md": h5md, "xtc_file": "x.xtc",
                           "missing": {"molly": "cargo is not installed"}})
    assert "sec2 4.0 (1.00x); independent 5.0 (1.25x); collective 6.0 (1.50x)" in text
