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
from processes import (analyze_tasks, assert_resumed_equal, processes_mentioning,
                       remove_local_sandboxes, start_with_sleeping_tasks, stop, TRAJFLOW)

pytestmark = pytest.mark.entk


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    remove_local_sandboxes(mount)  # (its sessions' folders go with the disk)
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def trajflow(*args, env=None):
    return subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_a_run_that_fills_its_disk_refuses_up_front(small_disk, adk):
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (22 << 20))  # 2 MB left: not enough for a RADICAL session
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
        with open(ballast, "wb", buffering=0) as fh:  # another job fills the disk (unbuffered:
            # a partial last write left bytes that close() could not flush, and raised)
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


def test_a_disk_filled_right_after_planning_fails_the_session_start_named(small_disk, adk,
                                                                         reference_results,
                                                                         shared_pilot):
    """The run folder's disk fills between planning and RADICAL's session: before, the
    run said "split submitted" and nothing for 10 minutes."""
    out = small_disk / "run"
    ballast = small_disk / "ballast"
    proc = subprocess.Popen([TRAJFLOW, "run", "--topology", adk[0], "--trajectory", adk[1],
                             "--analysis", "rmsd", "--io", "h5md", "--cpus", "2",
                             "--limits", "session=30,submit=30,start=60", "--out", str(out)],
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while not (out / "plan.json").exists() and time.time() < deadline:
            time.sleep(0.005)
        fill(small_disk, ballast)
        t0 = time.time()
        code = proc.wait(timeout=60 + 90 + 60)  # within the session bound and the shutdown
        output = proc.stdout.read()
    finally:
        stop(proc)
    print(f"full disk after planning: exit {code} after {time.time() - t0:.0f} s\n{output}")
    assert code == 1, output
    # the run's own disk named (whichever said it first: the failed session's note or the
    # watchdog's), with the space measured
    assert (f"the disk of '{out}' is full (" in output
            or f"the file system of {out} is full (" in output), output
    assert " MB free" in output, output
    assert not (out / "result.h5").exists()
    assert processes_mentioning(str(out)) == []
    ballast.unlink()
    assert_resumed_equal(out, adk, reference_results, pilot=shared_pilot)  # the cold one: above


def fill(disk, ballast):
    """Take every free byte of `disk` at once, as another job filling it does (written,
    not fallocated: the run's own writes race with it)."""
    with open(ballast, "ab", buffering=0) as fh:  # unbuffered: nothing left to flush
        for chunk in (1 << 20, 1 << 12):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError:
                pass


@pytest.mark.parametrize("moment", ["split", "reduce", "report"])
def test_a_disk_filled_at_any_moment_fails_the_run_named_and_resume_completes(
        small_disk, adk, moment, reference_results, shared_pilot):
    """The disk fills as the split stage starts (the H5MD copy), as reduce starts, or as
    the result is published (the report, outcome.json): the run ends within its bounds,
    exit 1, the disk named, nothing half-written; --resume completes it."""
    out = small_disk / "run"
    # the moment's sign: the split task started; both analyze parts written (reduce, a few
    # ms long, starts next: its own start marker came too late to fill the disk before it
    # published, seen); the result published
    sign = {"split": out / "progress" / "started.split",
            "reduce": out / "parts" / "block_00001.h5", "report": out / "result.h5"}[moment]
    other = out / "parts" / "block_00000.h5"
    proc = subprocess.Popen([TRAJFLOW, "run", "--topology", adk[0], "--trajectory", adk[1],
                             "--analysis", "rmsd", "--io", "h5md", "--mode", "tasks",
                             "--blocks", "2", "--cpus", "2", "--retries", "0",
                             "--limits", "stall=60,task=60,start=90", "--out", str(out)],
                            start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    ballast = small_disk / "ballast"
    try:
        deadline = time.time() + 240
        while not (sign.exists() and (moment != "reduce" or other.exists())) \
                and time.time() < deadline and proc.poll() is None:
            time.sleep(0.005)
        assert sign.exists(), proc.stdout.read() if proc.poll() is not None else "no " + str(sign)
        fill(small_disk, ballast)
        code = proc.wait(timeout=300)
        output = proc.stdout.read()
    finally:
        stop(proc)
    print(f"disk full at {moment}: exit {code}\n{output}")
    if moment == "report":  # the result is whole: a report never hides it, its loss is said
        assert code == 0 and "no report.html" in output and "No space left" in output, output
        ballast.unlink()
    else:
        assert code == 1, output
        assert "is full" in output and str(out) in output, output
        # a watchdog that ended it did not wait out its bound (60 s) on the full disk
        assert "(bound 60 s" not in output or "gave up before its bound, the disk being full" \
            in output, output
    leftovers = [os.path.join(d, f) for d, _, files in os.walk(out) for f in files
                 if ".tmp" in f and "re.session" not in d]
    assert leftovers == []
    assert analyze_tasks(str(out)) == []
    if moment != "report":
        ballast.unlink()
    assert_resumed_equal(out, adk, reference_results, resume=moment != "report", pilot=shared_pilot)
