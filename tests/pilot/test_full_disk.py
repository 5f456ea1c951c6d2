"""A disk that fills during a run (issue 15): the run fails promptly and says why,
leaves no half-written file and no process, writes outcome.json; --resume
completes once there is space again, equal to MDAnalysis.

RUNDIR is on a small tmpfs mounted by the test (root only; skipped elsewhere
with the reason). The disk is filled by a ballast file while the analyze
tasks sleep (TRAJFLOW_TEST_DELAY), so the parts cannot be written.
"""
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from processes import analyze_tasks, start_with_sleeping_tasks, stop

pytestmark = pytest.mark.entk


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def trajflow(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_a_run_that_fills_its_disk_refuses_up_front(small_disk, adk):
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (10 << 20))  # 2 MB left: not enough for a RADICAL session
    done = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                    "--io", "h5md", "--out", small_disk / "r")
    assert done.returncode == 2, done.stderr
    assert "not enough disk space" in done.stderr and str(small_disk / "r") in done.stderr
    assert "MB free" in done.stderr
    assert not (small_disk / "r").exists()


def test_a_disk_filled_during_the_run_fails_it_clearly_and_resume_completes(small_disk, adk,
                                                                           reference_results):
    out = small_disk / "run"
    proc = start_with_sleeping_tasks(
        ["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
         "--mode", "tasks", "--blocks", "2", "--cpus", "2", "--retries", "0",
         "--walltime", "15", "--out", str(out)], delay="0:compute:8,1:compute:8")
    ballast = small_disk / "ballast"
    try:
        deadline = time.time() + 240
        while not analyze_tasks(str(out)) and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        with open(ballast, "wb") as fh:  # another job fills the disk
            try:
                while True:
                    fh.write(b"\0" * (1 << 16))
                    fh.flush()
            except OSError:
                pass
        t0 = time.time()
        code = proc.wait(timeout=300)
        output = proc.stdout.read()
    finally:
        stop(proc)
    assert code == 1, output
    assert time.time() - t0 < 120, "the run should fail promptly, not hang"
    assert f"the disk of '{out}' is full" in output, output
    outcome = json.load(open(out / "outcome.json"))
    assert outcome["status"] == "failed" and "is full" in outcome["error"]
    assert not (out / "result.h5").exists()
    leftovers = [os.path.join(d, f) for d, _, files in os.walk(out) for f in files
                 if ".tmp" in f and "re.session" not in d]
    assert leftovers == []
    assert analyze_tasks(str(out)) == []
    ballast.unlink()  # space again
    again = trajflow("run", "--resume", out)
    assert again.returncode == 0, again.stdout + again.stderr
    with h5py.File(out / "result.h5", "r") as f:
        np.testing.assert_allclose(f["rmsd"][:], reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                                   rtol=1e-5, atol=1e-4)
