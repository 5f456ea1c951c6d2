"""The task programs, run as the pilot runs them (python -m ..., mpiexec -n N), without EnTK.

rmsd within 1e-4 Å of MDAnalysis' rms.RMSD and dihedral features within 1e-6
of cos/sin of its Ramachandran angles, on the AdK DCD and on an XTC made from
it, and on MDAnalysis' solvated AdK (GRO/XTC: a triclinic box with the protein
broken across it, so every path must carry the box).

Which combinations, and why not all of them. The factors touch different code:
the io strategy and the file format choose the reader (our DCD and XTC readers,
trajflow's H5MD copies and segments), so io x format x analysis runs in full;
mode and gather (mpi+gatherv, mpi+rma, tasks) choose how results reach reduce,
and N how the frames are cut into blocks (1; 2 even; 3 uneven: 33/33/32).
Those meet the readers only through a block's first frame and length, which
every pair of levels exercises: the cases are a covering array in which every
pair of levels of (io, mode+gather, N, analysis, format) occurs at least once
(`test_the_matrix_covers_every_pair` checks it), 12 runs instead of the full
108 on AdK, 18 instead of 54 on the periodic system (every io x mode+gather x N
pair, both analyses) and 12 instead of 24 for its TRR and DCD. The full product
found nothing in 479-test CI runs that a pair did not. On that large periodic box
MDAnalysis computes the angles from float32 coordinates after a float32
minimum image, and its features agree with ours (float64 after the same
float32 box vectors) to ~1e-5 (9.6e-6 seen): there the tolerance is 2e-5. The
TRR and a DCD of the solvated system (its unit cell read per frame instead
of by the raw DCD path) run every io x mode with 3 blocks.
"""

import json
import os

import h5py
import numpy as np
import pytest

from run_stages import plan_and_run

STRATEGIES = [("shared", "mpi", "gatherv"), ("shared", "mpi", "rma"), ("shared", "tasks", "gatherv"),
              ("split", "mpi", "gatherv"), ("split", "mpi", "rma"), ("split", "tasks", "gatherv"),
              ("h5md", "mpi", "gatherv"), ("h5md", "mpi", "rma"), ("h5md", "tasks", "gatherv")]
MODES = STRATEGIES[:3]  # (mode, gather) levels, by io "shared": mpi+gatherv, mpi+rma, tasks
FORMATS = [("dcd", "rmsd"), ("dcd", "dihedrals"), ("xtc", "rmsd"), ("xtc", "dihedrals")]
IOS = ["shared", "split", "h5md"]


def _covering(rows_b):
    """(io, mode, gather, N, b) with io = a, mode+gather = (a + b) % 3, N = 1 + (a + 2b) % 3
    for a in 0..2 and each b: (a, b) -> (mode+gather, N) is one-to-one for b in 0..2, so
    every pair of levels occurs (checked by test_the_matrix_covers_every_pair)."""
    return [(IOS[a], MODES[(a + b) % 3][1], MODES[(a + b) % 3][2], 1 + (a + 2 * b) % 3, b)
            for a in range(3) for b in rows_b]


ADK_CASES = [(io, mode, gather, n, *FORMATS[b][::-1])
             for io, mode, gather, n, b in _covering(range(4))]        # (.., analysis, fmt)
PERIODIC_CASES = [(io, mode, gather, n, analysis) for io, mode, gather, n, _ in _covering(range(3))
                  for analysis in ("rmsd", "dihedrals")]
PERIODIC_FORMAT_CASES = [(io, mode, gather, ("rmsd", "dihedrals")[(i + j) % 2], fmt)
                         for i, (io, mode, gather) in enumerate(
                             s for s in STRATEGIES if s[2] == "gatherv")
                         for j, fmt in enumerate(("trr", "dcd"))]
TOLERANCE = {"rmsd": 1e-4, "features": 1e-6}
PERIODIC_TOLERANCE = {"rmsd": 1e-4, "features": 2e-5}


def check_result(path, expected, analysis, n_blocks, io, mode, tolerance=TOLERANCE):
    key = "rmsd" if analysis == "rmsd" else "features"
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["frame"][()], expected["frame"])
        np.testing.assert_allclose(f["time"][()], expected["time"], rtol=1e-6, atol=1e-6)
        got = f[key][()]
        assert got.shape == expected[key].shape
        np.testing.assert_allclose(got, expected[key], rtol=0, atol=tolerance[key])
        assert f.attrs["n_blocks"] == n_blocks and f.attrs["io"] == io and f.attrs["mode"] == mode
        assert f.attrs["analysis"] == analysis


def _pairs(rows, names):
    return {(i, j, row[i], row[j]) for row in rows for i in range(len(names))
            for j in range(i + 1, len(names))}


def test_the_matrix_covers_every_pair():
    levels = [IOS, [m[1:] for m in MODES], [1, 2, 3], ["rmsd", "dihedrals"], ["dcd", "xtc"]]
    rows = [(io, (mode, gather), n, analysis, fmt) for io, mode, gather, n, analysis, fmt in ADK_CASES]
    want = {(i, j, x, y) for i in range(5) for j in range(i + 1, 5)
            for x in levels[i] for y in levels[j]}
    assert want <= _pairs(rows, levels) and len(rows) == 12
    rows = [(io, (mode, gather), n, analysis) for io, mode, gather, n, analysis in PERIODIC_CASES]
    want = {(i, j, x, y) for i in range(4) for j in range(i + 1, 4)
            for x in levels[i] for y in levels[j]}
    assert want <= _pairs(rows, levels[:4]) and len(rows) == 18
    rows = [(io, mode, analysis, fmt) for io, mode, _, analysis, fmt in PERIODIC_FORMAT_CASES]
    lv = [IOS, ["mpi", "tasks"], ["rmsd", "dihedrals"], ["trr", "dcd"]]
    want = {(i, j, x, y) for i in range(4) for j in range(i + 1, 4) for x in lv[i] for y in lv[j]}
    assert want <= _pairs(rows, lv) and len(rows) == 12


@pytest.mark.parametrize("io,mode,gather,n,analysis,fmt", ADK_CASES)
def test_result_equals_mdanalysis(tmp_path, adk, adk_xtc, reference_results,
                                  io, mode, gather, n, analysis, fmt):
    top, traj = adk if fmt == "dcd" else adk_xtc
    path, plan = plan_and_run(tmp_path / "run", top, [traj], analysis, io=io, mode=mode,
                              gather=gather, blocks=n, cpus=n, chunk=16, side_by_side=True)
    check_result(path, reference_results(top, [traj], analysis), analysis, n, io, mode)
    assert os.listdir(plan.path("parts")) == []  # the result is the run's one copy
    if io == "h5md":  # MPI ranks open the copy together where h5py has MPI (mpio)
        from trajflow.workflows.bench.measure import analyze_records
        drivers = {r.get("h5md_driver") for r in analyze_records(plan)}
        assert drivers == {"mpio" if mode == "mpi" and h5py.get_config().mpi else "sec2"}


@pytest.mark.parametrize("system,chunk", [("adk", 16), ("solvated", 3)])
@pytest.mark.parametrize("analysis", ["rmsd", "dihedrals"])
def test_h5md_collective_mpi_reads_equal_mdanalysis(tmp_path, adk, solvated, reference_results,
                                                   analysis, system, chunk):
    """--mpi-reads collective on AdK (98 frames: blocks of 33/33/32 in chunks of 16, so
    4, 4 and 3 reads of the positions, frame 0 included) and on the periodic solvated
    XTC MDAnalysisTests ships (10 frames: 4/3/3 in chunks of 3): the ranks with fewer
    reads pad with one-position collective reads, or the others would wait for them
    forever. Where h5py has MPI the profile says the reads were collective, as HDF5
    itself reports what it did (asking is no proof: h5py's fast path once read
    independently whatever was asked); elsewhere they stay each rank's own."""
    top, traj = adk if system == "adk" else solvated
    tolerance = TOLERANCE if system == "adk" else PERIODIC_TOLERANCE
    path, plan = plan_and_run(tmp_path / "run", top, [traj], analysis, io="h5md", mode="mpi",
                              blocks=3, cpus=3, chunk=chunk, mpi_reads="collective")
    assert plan.schedule == "static"  # auto would be dynamic, which collective reads exclude
    check_result(path, reference_results(top, [traj], analysis), analysis, 3, "h5md", "mpi",
                 tolerance)
    from trajflow.workflows.bench.measure import analyze_records
    records = analyze_records(plan)
    assert {r.get("h5md_reads") for r in records} == {
        "collective" if h5py.get_config().mpi else "independent"}
    if h5py.get_config().mpi:
        assert {r["h5md_mpio_mode"] for r in records} <= {"chunk collective", "chunk mixed"}


@pytest.mark.parametrize("io,mode,gather,n,analysis", PERIODIC_CASES)
def test_periodic_result_equals_mdanalysis(tmp_path, solvated, reference_results,
                                           io, mode, gather, n, analysis):
    top, traj = solvated
    path, _ = plan_and_run(tmp_path / "run", top, [traj], analysis, io=io, mode=mode,
                           gather=gather, blocks=n, cpus=n, chunk=4, side_by_side=True)
    check_result(path, reference_results(top, [traj], analysis), analysis, n, io, mode,
                 PERIODIC_TOLERANCE)


@pytest.mark.parametrize("io,mode,gather,analysis,fmt", PERIODIC_FORMAT_CASES)
def test_periodic_formats_equal_mdanalysis(tmp_path, solvated_trr, solvated_dcd, reference_results,
                                           io, mode, gather, analysis, fmt):
    top, traj = solvated_trr if fmt == "trr" else solvated_dcd
    path, _ = plan_and_run(tmp_path / "run", top, [traj], analysis, io=io, mode=mode,
                           gather=gather, blocks=3, cpus=3, chunk=2, side_by_side=True)
    check_result(path, reference_results(top, [traj], analysis), analysis, 3, io, mode,
                 PERIODIC_TOLERANCE)


@pytest.mark.parametrize("io", ["shared", "split", "h5md"])
def test_several_files_are_one_trajectory(tmp_path, adk, adk_xtc, reference_results, io):
    """DCD then XTC: one continuous trajectory with MDAnalysis' ChainReader frame/time semantics."""
    top = adk[0]
    trajs = [adk[1], adk_xtc[1]]
    path, plan = plan_and_run(tmp_path / "run", top, trajs, "rmsd", io=io, mode="mpi",
                              blocks=3, cpus=3, chunk=32)
    assert plan.n_frames == 196
    check_result(path, reference_results(top, trajs, "rmsd"), "rmsd", 3, io, "mpi")


def test_repeat_multiplies_compute_not_the_result(tmp_path, adk, reference_results):
    path, _ = plan_and_run(tmp_path / "run", adk[0], [adk[1]], "rmsd", mode="tasks", blocks=2, cpus=2, repeat=5)
    check_result(path, reference_results(adk[0], [adk[1]], "rmsd"), "rmsd", 2, "shared", "tasks")
    with h5py.File(path) as f:
        assert f.attrs["repeat"] == 5


@pytest.mark.parametrize("select,chunks", [("name CA", (6, 3336, 3)), ("all", (6, 3341, 3))])
def test_h5md_split_is_chunked_for_the_selection_and_compressed(tmp_path, adk, select, chunks):
    """Chunks end at the selection's last atom (AdK's last CA is atom 3335), ~240 KB each."""
    _, plan = plan_and_run(tmp_path / "run", adk[0], [adk[1]], "rmsd", io="h5md", mode="mpi", blocks=2,
                           cpus=2, compression="gzip:3", select=select)
    with h5py.File(plan.h5md_path()) as f:
        value = f["particles/trajectory/position/value"]
        assert value.chunks == chunks
        assert value.compression == "gzip" and value.compression_opts == 3
        assert np.all(np.diff(f["particles/trajectory/position/step"][()]) == 1)
        assert np.all(np.diff(f["particles/trajectory/position/time"][()]) > 0)


@pytest.mark.parametrize("io", ["h5md", "shared"])
def test_rmsd_over_h5md_or_dcd_runs_without_importing_mdanalysis(tmp_path, adk, adk_xtc, io):
    """MDAnalysis' import is 0.65 s of every rank's start-up; RMSD over H5MD or plain
    DCD needs none of it. Block 0 analysed again in a fresh interpreter, then its
    modules listed; the part it wrote holds MDAnalysis' RMSD of its frames."""
    import subprocess
    import sys
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    from trajflow.tasks.analyze import needs_mdanalysis
    _, plan = plan_and_run(tmp_path / "run", adk[0], [adk[1]], "rmsd", io=io, mode="tasks",
                           blocks=2, cpus=2)
    code = ("import sys, trajflow.tasks.analyze as a; "
            f"a.main(['--plan', {plan.path('plan.json')!r}, '--block', '0']); "
            "print('MDAnalysis' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"
    expected = rms.RMSD(mda.Universe(*adk), select="name CA").run().results.rmsd[:, 2]
    with h5py.File(plan.block_part_path(0)) as f:
        np.testing.assert_allclose(f["rmsd"][()], expected[:len(f["rmsd"])], atol=1e-4)
    import dataclasses
    # trajflow's own H5MD holds every frame's exact box: no MDAnalysis even for dihedrals;
    # a user's H5MD gives its box as vectors, turned into dimensions as MDAnalysis does
    assert not needs_mdanalysis(dataclasses.replace(plan, io="h5md", analysis="dihedrals"))
    users = dataclasses.replace(plan, io="shared", analysis="dihedrals",
                                trajectories=[str(tmp_path / "theirs.h5md")])
    assert needs_mdanalysis(users)
    assert needs_mdanalysis(dataclasses.replace(users, io="h5md"))
    shared_rmsd = dataclasses.replace(plan, io="shared", analysis="rmsd")
    assert needs_mdanalysis(dataclasses.replace(
        shared_rmsd, trajectories=[adk_xtc[1], adk_xtc[1]]))  # a chain
    assert not needs_mdanalysis(dataclasses.replace(
        shared_rmsd, trajectories=[adk_xtc[1]]))  # xtc.py reads it
    assert not needs_mdanalysis(dataclasses.replace(shared_rmsd, trajectories=[adk[1]]))


@pytest.mark.serial  # judges time: run alone (see the Makefile)
def test_a_campaigns_shared_h5md_copy_is_made_once(tmp_path, solvated, reference_results):
    """Two h5md runs naming one shared copy (as a campaign's experiments do) start their
    split tasks together: one converts, under a lock, the other waits and reuses the
    copy, charged the conversion's time; both results equal MDAnalysis (periodic system)."""
    from run_stages import run_side_by_side, run_stages
    from trajflow.workflows.profile.advice import prepare_seconds
    from trajflow.tasks.stages import stage_specs
    from plans import make_plan
    from trajflow.workflows.run.planning import write_plan
    top, traj = solvated
    shared = str(tmp_path / "shared" / "trajectory.h5md")
    runs = []
    for i, (analysis, mode) in enumerate([("rmsd", "mpi"), ("dihedrals", "tasks")]):
        plan = make_plan(top, [traj], analysis, str(tmp_path / f"run{i}"), io="h5md", mode=mode,
                         blocks=2, cpus=2, chunk=4)
        plan.shared_h5md = shared
        runs.append((plan, write_plan(plan)))
    run_side_by_side([spec for plan, path in runs for spec in stage_specs(plan, path)["split"]])
    records = [json.load(open(plan.profile_path("split.h5md.rank_00000"))) for plan, _ in runs]
    converted = [r for r in records if "conversion_reused_s" not in r]
    reused = [r for r in records if "conversion_reused_s" in r]
    assert len(converted) == 1 and len(reused) == 1, records
    assert converted[0]["t_convert"] > 0 and reused[0]["t_convert"] == 0
    assert reused[0]["conversion_reused_s"] == pytest.approx(converted[0]["t_total"], rel=0.2)
    assert prepare_seconds(reused) == reused[0]["conversion_reused_s"]
    assert not os.path.exists(runs[0][0].path("split", "trajectory.h5md"))
    assert sorted(os.listdir(tmp_path / "shared")) == ["trajectory.h5md", "trajectory.h5md.lock"]
    for plan, path in runs:
        try:
            check_result(run_stages(plan, path, side_by_side=True),
                         reference_results(top, [traj], plan.analysis), plan.analysis, 2, "h5md",
                         plan.mode, PERIODIC_TOLERANCE)
        finally:
            plan.lock.release()


@pytest.mark.parametrize("mode,change", [("mpi", "rewritten"), ("tasks", "touched"),
                                         ("mpi", "removed")])
def test_a_shared_run_refuses_inputs_changed_since_it_was_planned(tmp_path, adk, mode, change):
    """Shared io has no split stage: each analyze task checks the inputs' size and
    modification time against the plan's before its first frame, and the run ends with
    no result naming the file."""
    import shutil

    from run_stages import run_stages
    from plans import make_plan
    from trajflow.workflows.run.planning import write_plan
    traj = str(tmp_path / "adk.dcd")
    shutil.copy(adk[1], traj)
    plan = make_plan(adk[0], [traj], "rmsd", str(tmp_path / "run"), io="shared", mode=mode,
                     blocks=2, cpus=2)
    try:
        plan_path = write_plan(plan)
        assert plan.io_strategy.split_tasks(plan) == []
        if change == "rewritten":  # the same size, other bytes: only the time tells
            with open(traj, "r+b") as fh:
                fh.seek(os.path.getsize(traj) - 4)
                fh.write(b"\0\0\0\1")
            st = os.stat(traj)
            os.utime(traj, ns=(st.st_atime_ns, plan.input_stats[1][1] + 1_000_000_000))
        elif change == "touched":
            st = os.stat(traj)
            os.utime(traj, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        else:
            os.remove(traj)
        with pytest.raises(RuntimeError) as err:
            run_stages(plan, plan_path)
    finally:
        plan.lock.release()
    text = str(err.value)
    assert text.startswith("analyze/") and f"input {traj!r}" in text, text
    assert ("cannot be read now" if change == "removed" else "changed since the run was planned") in text
    assert not os.path.exists(plan.result_path())
