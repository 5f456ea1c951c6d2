"""A dataset someone else owns: trajectories in a read-only folder (a real read-only
bind mount: no offsets file can be written beside them) and on a file system whose
locks fail. Runs go through, equal to MDAnalysis' serial run, with MDAnalysis' XTC
offsets computed once and kept in trajflow's cache (tasks/offsets_cache.py)."""
import errno
import os
import shutil
import subprocess
import warnings

import h5py
import numpy as np
import pytest

from paths import FACTORIES
from run_stages import plan_and_run
from trajflow.tasks import offsets_cache


@pytest.fixture
def read_only_dataset(tmp_path, solvated):
    """The solvated AdK GRO/XTC in a folder mounted read-only (root ignores modes, so a
    chmod would not stop it), with no offsets file beside the XTC."""
    source = tmp_path / "dataset"
    source.mkdir()
    for path in solvated:
        shutil.copy(path, source)
    mounted = tmp_path / "project"
    mounted.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(mounted)], check=True, timeout=30)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True, timeout=30)
        yield [str(mounted / os.path.basename(p)) for p in solvated]
    finally:  # lazily if a file is still open: never left mounted
        if subprocess.run(["umount", str(mounted)], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mounted)], check=True, timeout=30)


def mda_offsets(top, xtc, tmp_path):
    """MDAnalysis' own offsets of a writable copy of the file."""
    import MDAnalysis as mda
    copy = tmp_path / "writable.xtc"
    shutil.copy(xtc, copy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(mda.Universe(top, str(copy)).trajectory._xdr.offsets)


def test_a_read_only_dataset_runs_with_its_offsets_in_the_cache(tmp_path, read_only_dataset,
                                                                monkeypatch):
    top, xtc = read_only_dataset
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRAJFLOW_CACHE", str(cache))
    with pytest.raises(OSError):  # the folder really is read-only
        open(os.path.join(os.path.dirname(xtc), "probe"), "w")
    env = {"TRAJFLOW_CACHE": str(cache)}
    # trajflow's XTC reader (rmsd, shared), MDAnalysis' (your analysis), the split stage
    rmsd, _ = plan_and_run(tmp_path / "rmsd", top, [xtc], "rmsd", env=env, mode="mpi",
                           blocks=2, cpus=2)
    # scanned once: a process that scanned again would have stored a new file (a new inode)
    first = os.stat(offsets_cache.cached(xtc)).st_ino
    rdf, _ = plan_and_run(tmp_path / "rdf", top, [xtc], f"{FACTORIES}:interrdf", env=env,
                          mode="tasks", blocks=2, cpus=2, args={"nbins": 50})
    split, _ = plan_and_run(tmp_path / "split", top, [xtc], "rmsd", env=env, io="split",
                            mode="tasks", blocks=2, cpus=2)
    assert not os.path.exists(offsets_cache.beside(xtc))
    kept = offsets_cache.valid_offsets(offsets_cache.cached(xtc), xtc, 47681)
    np.testing.assert_array_equal(kept, mda_offsets(top, xtc, tmp_path))
    assert os.listdir(cache / "offsets") == [os.path.basename(offsets_cache.cached(xtc))]
    assert os.stat(offsets_cache.cached(xtc)).st_ino == first  # read by every later process

    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    import sys
    sys.path.insert(0, os.path.dirname(FACTORIES))
    import factories
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(top, xtc)
        ref = rms.RMSD(u, select="name CA").run().results.rmsd
        ref_rdf = factories.interrdf(u, nbins=50).run().results
        u.trajectory.close()  # the mount is let go of at the end
    for path in (rmsd, split):
        with h5py.File(path) as f:
            np.testing.assert_allclose(f["rmsd"][()], ref, rtol=1e-6, atol=1e-5)
    with h5py.File(rdf) as f:
        np.testing.assert_allclose(f["results/rdf"][()], ref_rdf.rdf, rtol=1e-6)


def test_a_file_system_without_locks_opens_with_the_offsets_in_the_cache(tmp_path, solvated,
                                                                         monkeypatch):
    """Lustre mounted `noflock` refuses flock (ENOSYS): MDAnalysis' offsets lock then raises
    and the Universe cannot be opened; with trajflow's hook it opens, and the offsets are
    cached once and reused."""
    import filelock
    import MDAnalysis as mda
    top, xtc = solvated
    copy = tmp_path / "adk.xtc"
    shutil.copy(xtc, copy)
    monkeypatch.setenv("TRAJFLOW_CACHE", str(tmp_path / "cache"))

    def no_locks(self, *args, **kwargs):
        raise OSError(errno.ENOSYS, "Function not implemented")
    monkeypatch.setattr(filelock.FileLock, "acquire", no_locks)
    from MDAnalysis.coordinates.XDR import XDRBaseReader
    hooked = XDRBaseReader._load_offsets  # MDAnalysis' own, whether hooked here before or not
    monkeypatch.setattr(XDRBaseReader, "_load_offsets", getattr(hooked, "original", hooked))
    with pytest.raises(OSError, match="not implemented"):  # MDAnalysis alone
        mda.Universe(top, str(copy))
    offsets_cache.keep_offsets_in_cache()
    u = mda.Universe(top, str(copy))
    assert u.trajectory.n_frames == 10
    kept = offsets_cache.cached(str(copy))
    assert os.path.exists(kept) and not os.path.exists(offsets_cache.beside(str(copy)))
    np.testing.assert_array_equal(u.trajectory._xdr.offsets,
                                  offsets_cache.valid_offsets(kept, str(copy), 47681))
    inode = os.stat(kept).st_ino
    again = mda.Universe(top, str(copy))  # read from the cache, not scanned and stored anew
    assert again.trajectory[9].time == u.trajectory[9].time and os.stat(kept).st_ino == inode


def test_offsets_others_could_write_are_not_trusted(tmp_path, solvated, monkeypatch):
    """A cache folder others can write, or a file that changes while it is scanned, is
    never a source of offsets: wrong offsets would read the wrong frames."""
    top, xtc = solvated
    copy = tmp_path / "adk.xtc"
    shutil.copy(xtc, copy)
    monkeypatch.setenv("TRAJFLOW_CACHE", str(tmp_path / "cache"))
    folder = os.path.dirname(offsets_cache.cached(str(copy)))
    os.makedirs(folder)
    os.chmod(folder, 0o777)
    before = os.stat(copy)
    offsets_cache.store(str(copy), 47681, [0, 1, 2], before)
    assert os.listdir(folder) == []  # not written into a folder others can write
    os.chmod(folder, 0o700)
    with open(copy, "ab") as fh:  # the file grows while it is being scanned
        fh.write(b"\0" * 64)
    offsets_cache.store(str(copy), 47681, [0, 1, 2], before)
    assert os.listdir(folder) == []
