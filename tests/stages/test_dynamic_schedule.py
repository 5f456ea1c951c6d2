"""The dynamic schedule through the task programs (mpiexec, no pilot): the same result
bit for bit as static blocks on every io strategy and gather, and a rank or task
made really slow (a cgroup CPU quota, workflows/bench/cpu_quota.py) does fewer
frames (MPI) or is overtaken by a backup copy (tasks), the profile saying so."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from plans import make_plan
from run_stages import plan_and_run, run_stages
from trajflow.workflows.bench import cpu_quota
from trajflow.workflows.datasets import adk_concatenated
from trajflow.workflows.profile.advice import advice
from trajflow.workflows.profile.inspection import load_run, straggler_lines, find_stragglers
from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.planning import fit_to_cores, write_plan

needs_quota = pytest.mark.skipif(cpu_quota.unavailable() is not None,
                                 reason=f"no real slow rank here: {cpu_quota.unavailable()}")


def datasets(path):
    with h5py.File(path) as f:
        return {k: f[k][()] for k in f if isinstance(f[k], h5py.Dataset)}


def records(plan):
    out = []
    for name in sorted(os.listdir(plan.path("profile"))):
        if name.startswith("analyze"):
            with open(plan.path("profile", name)) as fh:
                out.append(json.loads(fh.readline()))
    return out


CASES = [("shared", "mpi", "gatherv", 2, "rmsd", "xtc"), ("split", "mpi", "rma", 3, "dihedrals", "xtc"),
         ("h5md", "mpi", "gatherv", 3, "rmsd", "dcd"), ("shared", "mpi", "rma", 2, "dihedrals", "dcd"),
         ("split", "tasks", "gatherv", 3, "rmsd", "dcd"), ("h5md", "tasks", "gatherv", 2, "dihedrals", "xtc")]


@pytest.mark.parametrize("io,mode,gather,n,analysis,fmt", CASES)
def test_a_dynamic_schedule_gives_the_static_result_bit_for_bit(tmp_path, adk, adk_xtc, reference_results,
                                                                io, mode, gather, n, analysis, fmt):
    top, traj = adk_xtc if fmt == "xtc" else adk
    got = {}
    for schedule in ("static", "dynamic"):
        path, plan = plan_and_run(tmp_path / schedule, top, [traj], analysis, io=io, mode=mode,
                                  gather=gather, blocks=n, cpus=n, schedule=schedule)
        got[schedule] = datasets(path)
    assert got["static"].keys() == got["dynamic"].keys()
    for key in got["static"]:
        assert np.array_equal(got["static"][key], got["dynamic"][key]), key
    ref = reference_results(top, [traj], analysis)
    key = "rmsd" if analysis == "rmsd" else "features"
    assert np.abs(got["dynamic"][key] - ref[key]).max() < (1e-4 if analysis == "rmsd" else 1e-6)
    with h5py.File(path) as f:
        assert f.attrs["schedule"] == "dynamic"


def test_a_dynamic_schedule_of_chosen_frames(tmp_path, adk_xtc):
    """MDAnalysis' run(start, stop, step): the chunks are of the frames chosen."""
    got = {}
    for schedule in ("static", "dynamic"):
        path, _ = plan_and_run(tmp_path / schedule, adk_xtc[0], [adk_xtc[1]], "rmsd", blocks=2,
                               cpus=2, schedule=schedule, start=5, stop=90, step=3)
        got[schedule] = datasets(path)
    assert np.array_equal(got["static"]["rmsd"], got["dynamic"]["rmsd"])
    assert np.array_equal(got["dynamic"]["frame"], np.arange(5, 90, 3))


@pytest.mark.parametrize("io,gather,analysis", [("shared", "gatherv", "rmsd"),
                                                 ("split", "rma", "dihedrals")])
def test_fewer_ranks_than_blocks_share_them_and_give_the_same_result(tmp_path, adk, io, gather,
                                                                    analysis):
    """A pilot with fewer cores than blocks (a run resumed on the nodes left after one
    was lost): fit_to_cores gives the analyze task that many ranks on the dynamic
    schedule, and the result is the one-rank-per-block static result bit for bit."""
    path, _ = plan_and_run(tmp_path / "static", *adk[:1], [adk[1]], analysis, io=io,
                           gather=gather, blocks=5, cpus=5, schedule="static")
    want = datasets(path)
    plan = make_plan(adk[0], [adk[1]], analysis, str(tmp_path / "fitted"), io=io, gather=gather,
                     blocks=5, cpus=5, schedule="static")
    try:
        assert fit_to_cores(plan, 5) is plan
        fitted = fit_to_cores(plan, 2)
        assert (fitted.mpi_ranks, fitted.analyze_ranks, fitted.schedule) == (2, 2, "dynamic")
        plan_path = write_plan(fitted)
        specs = stage_specs(fitted, plan_path)  # every MPI task of the stages fits the cores
        assert [s.ranks for s in specs["analyze"] + [s for s in specs["split"] if s.mpi]] == \
            [2] * (2 if io == "split" else 1)
        got = datasets(run_stages(fitted, plan_path))
    finally:
        plan.lock.release()
    assert want.keys() == got.keys()
    for key in want:
        assert np.array_equal(want[key], got[key]), key
    ranks = records(fitted)
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert sum(r["frames"] for r in ranks) == 98
    # every block's frames were analysed, by the two ranks between them
    assert {c[1] for r in ranks for c in r["chunks"]} == set(range(5))


@pytest.fixture(scope="module")
def long_xtc():
    """AdK x40 as XTC (3,920 frames): a few seconds of CA-RMSD per rank when slowed."""
    return adk_concatenated(40, "XTC")


@pytest.fixture(scope="module")
def longer_xtc():
    """AdK x200 as XTC (19,600 frames): the frames' loop long enough, with the word-at-a-time
    decoder, for the report to judge the ranks' speeds (x40 took it under MIN_LOOP_S)."""
    return adk_concatenated(200, "XTC")


@pytest.mark.serial  # judges time: run alone (see the Makefile)
@needs_quota
def test_a_slow_rank_does_fewer_frames_and_the_report_says_so(tmp_path, longer_xtc):
    """Rank 1 at a fifth of a core: the dynamic schedule gives it far fewer frames than
    its half, the result is static's, and the straggler report and advice name it."""
    with cpu_quota.CpuQuota(0.2) as quota:
        path, plan = plan_and_run(tmp_path / "dynamic", longer_xtc[0], [longer_xtc[1]], "rmsd",
                                  blocks=2, cpus=2, schedule="dynamic",
                                  env={"TRAJFLOW_TEST_SLOW": f"1:{quota.path}"})
    static, _ = plan_and_run(tmp_path / "static", longer_xtc[0], [longer_xtc[1]], "rmsd",
                             blocks=2, cpus=2)
    assert np.array_equal(datasets(path)["rmsd"], datasets(static)["rmsd"])
    ranks = {r["rank"]: r for r in records(plan)}
    share = ranks[1]["frames"] / plan.n_frames
    assert share < 0.35, share  # its half at a fifth of the speed: about 1/6 when balanced
    assert ranks[0]["frames"] + ranks[1]["frames"] == plan.n_frames
    ids = sorted(c[0] for r in ranks.values() for c in r["chunks"])
    assert ids == list(range(len(ids)))
    assert ranks[0]["gather_root"] == 0  # rank 0 did the most frames: it gathers
    _, recs = load_run(plan.workdir)
    lines = "\n".join(straggler_lines({"stragglers": find_stragglers(recs), "records": recs}))
    assert "rank 1 ran at 0." in lines and "dynamic scheduling gave it" in lines
    assert "sooner than static blocks would have" in lines
    assert "--schedule static" not in advice(plan, recs).get("text", "")
    from trajflow.workflows.profile.report_html import write_html
    from trajflow.workflows.profile.inspection import inspect_runs
    write_html(inspect_runs([plan.workdir]), str(tmp_path / "report.html"))
    assert "chunk 0: the run&#x27;s frames #0-#" in (tmp_path / "report.html").read_text() or \
        "chunk 0: the run's frames #0-#" in (tmp_path / "report.html").read_text()  # hover


@pytest.mark.serial  # judges time: run alone (see the Makefile)
@needs_quota
def test_the_counter_of_ranks_on_several_nodes_balances_too(tmp_path, long_xtc):
    """The claims through MPI_Rget_accumulate on rank 0 (what ranks on several nodes
    use; forced here on one node): rank 1 slowed does fewer frames, rank 0's progress
    thread answers its claims, and the result is static's."""
    with cpu_quota.CpuQuota(0.2) as quota:
        path, plan = plan_and_run(tmp_path / "run", long_xtc[0], [long_xtc[1]], "dihedrals",
                                  blocks=2, cpus=2, schedule="dynamic",
                                  env={"TRAJFLOW_TEST_SLOW": f"1:{quota.path}",
                                       "TRAJFLOW_TEST_REMOTE_COUNTER": "1"})
    static, _ = plan_and_run(tmp_path / "static", long_xtc[0], [long_xtc[1]], "dihedrals",
                             blocks=2, cpus=2, schedule="static")
    assert np.array_equal(datasets(path)["features"], datasets(static)["features"])
    ranks = {r["rank"]: r for r in records(plan)}
    assert ranks[1]["frames"] < 0.35 * plan.n_frames
    assert ranks[1]["t_comm"] < 2.0  # its claims did not wait for rank 0's chunks


@pytest.mark.serial  # judges time: run alone (see the Makefile)
@needs_quota
def test_a_slow_rank_0_is_spared_the_gather(tmp_path, long_xtc):
    """Rank 0 slowed: rank 1 did the most frames, so it gathers and writes the part."""
    with cpu_quota.CpuQuota(0.2) as quota:
        path, plan = plan_and_run(tmp_path / "run", long_xtc[0], [long_xtc[1]], "rmsd",
                                  blocks=2, cpus=2, schedule="dynamic", gather="rma",
                                  env={"TRAJFLOW_TEST_SLOW": f"0:{quota.path}"})
    ranks = {r["rank"]: r for r in records(plan)}
    assert ranks[1]["frames"] > ranks[0]["frames"]
    assert ranks[0]["gather_root"] == ranks[1]["gather_root"] == 1
    assert ranks[1]["t_write"] > 0 and ranks[0]["t_write"] == 0
    assert np.array_equal(datasets(path)["frame"], np.arange(plan.n_frames))


@pytest.mark.serial  # judges time: run alone (see the Makefile)
@needs_quota
def test_a_late_task_is_overtaken_by_a_backup_copy(tmp_path, long_xtc):
    """Tasks mode, 4 blocks side by side, block 2's task at 5 % of a core: a task
    that has finished copies block 2, its copy wins, the original stops, and the
    result is the static run's bit for bit."""
    with cpu_quota.CpuQuota(0.05) as quota:
        path, plan = plan_and_run(tmp_path / "dynamic", long_xtc[0], [long_xtc[1]], "rmsd",
                                  mode="tasks", blocks=4, cpus=4, schedule="dynamic",
                                  side_by_side=True, env={"TRAJFLOW_TEST_SLOW": f"2:{quota.path}"})
    static, _ = plan_and_run(tmp_path / "static", long_xtc[0], [long_xtc[1]], "rmsd",
                             mode="tasks", blocks=4, cpus=4, side_by_side=True)
    assert np.array_equal(datasets(path)["rmsd"], datasets(static)["rmsd"])
    copies = {r["block"]: r["block_copies"] for r in records(plan)}
    original = copies[2][0]
    assert original["block"] == 2 and not original["won"]
    assert original["chunks_done"] < original["chunks"]  # it stopped when the copy won
    backups = [c for cs in copies.values() for c in cs if c["backup"]]
    assert [(c["block"], c["won"]) for c in backups] == [(2, True)]
    _, recs = load_run(plan.workdir)
    assert "block 2: a backup copy in the task of block" in "\n".join(
        straggler_lines({"stragglers": find_stragglers(recs), "records": recs}))


@pytest.fixture(scope="module")
def foreign_xtc(tmp_path_factory):
    """MDAnalysisTests' solvated AdK (periodic, triclinic) x4 as an XTC nobody here
    would write: precision 2 (0.01 nm), 3,000 A from the origin, no box in frame 0, and
    a copy cut inside its last frame."""
    import MDAnalysis as mda
    from trajflow.workflows.datasets import solvated_concatenated
    top, src = solvated_concatenated(4, "XTC")
    u = mda.Universe(top, src)
    folder = tmp_path_factory.mktemp("foreign")
    path = str(folder / "odd.xtc")
    with mda.Writer(path, n_atoms=len(u.atoms), precision=2) as w:
        for ts in u.trajectory:
            ts.positions += 3000.0
            if ts.frame == 0:
                ts.dimensions = None
            w.write(u.atoms)
    cut = str(folder / "odd_cut.xtc")
    data = open(path, "rb").read()
    with open(cut, "wb") as fh:
        fh.write(data[:len(data) - 5000])  # the last frame loses its tail
    return top, path, cut


def features_in_float64(top, traj):
    """cos/sin of backbone phi/psi from the coordinates written, in float64 throughout
    (bond vectors, a brute-force triclinic minimum image, the angles): the data's own
    answer. At 3,000 A from the origin MDAnalysis' float32 minimum image is 2.6e-5 off
    it (measured), so the file is judged against this, not against MDAnalysis."""
    import MDAnalysis as mda
    from MDAnalysis.analysis.dihedrals import Ramachandran
    from MDAnalysis.lib.mdamath import triclinic_vectors
    u = mda.Universe(top, traj)
    rama = Ramachandran(u.select_atoms("protein"))
    groups = [rama.ag1, rama.ag2, rama.ag3, rama.ag4, rama.ag5]
    shifts = np.array([[i, j, k] for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)])

    def nearest(d, vec):
        d = d - np.round(np.linalg.solve(vec.T, d.T).T) @ vec
        images = d[:, None, :] + (shifts @ vec)[None]
        return images[np.arange(len(d)), np.argmin((images ** 2).sum(2), axis=1)]

    def angle(b1, b2, b3):
        n1, n2 = np.cross(b1, b2), np.cross(b2, b3)
        return np.arctan2(np.linalg.norm(b2, axis=1) * (n1 * b3).sum(1), (n1 * n2).sum(1))

    out = []
    for ts in u.trajectory:
        x = [g.positions.astype(np.float64) for g in groups]
        b = [x[k + 1] - x[k] for k in range(4)]
        if ts.dimensions is not None:
            vec = triclinic_vectors(ts.dimensions).astype(np.float64)
            b = [nearest(v, vec) for v in b]
        phi, psi = angle(*b[:3]), angle(*b[1:])
        out.append(np.stack([np.cos(phi), np.sin(phi), np.cos(psi), np.sin(psi)], 1).ravel())
    return np.array(out)


@pytest.mark.parametrize("analysis", ["rmsd", "dihedrals"])
def test_a_dynamic_schedule_on_a_foreign_periodic_xtc_equals_the_data(
        tmp_path, foreign_xtc, reference_results, analysis):
    """Several chunks per block on a file of another precision, far from the origin, with
    a box missing, whole and cut short (--allow-truncated: its whole frames): RMSD
    against MDAnalysis' serial run of the whole file, the dihedral features against the
    data written (MDAnalysis' own are 2.6e-5 off them here)."""
    top, whole, cut = foreign_xtc
    if analysis == "rmsd":
        key, tolerance, expected = "rmsd", 1e-4, reference_results(top, [whole], "rmsd")["rmsd"]
    else:
        key, tolerance, expected = "features", 1e-9, features_in_float64(top, whole)
    for name, traj, extra in (("whole", whole, {}), ("cut", cut, {"allow_truncated": True})):
        path, plan = plan_and_run(tmp_path / name, top, [traj], analysis, blocks=2, cpus=2,
                                  schedule="dynamic", chunk=3, **extra)
        got = datasets(path)
        n = plan.n_frames
        assert n == (40 if name == "whole" else 39)
        assert max(len(r["chunks"]) for r in records(plan)) > 1
        np.testing.assert_array_equal(got["frame"], np.arange(n))
        np.testing.assert_allclose(got[key], expected[:n], rtol=0, atol=tolerance)


def test_a_rank_launched_late_is_not_waited_for_before_the_first_chunk(tmp_path, long_xtc):
    """mpiexec starts rank 1 3 s after rank 0 (MPMD: a shell sleeps, then execs the
    rank): rank 0 claims and analyses chunks at once (the counter in /dev/shm,
    launch_env.py), so it does nearly all of them and MPI_Init waits only after; the
    result is static's, and the counter's file is gone."""
    from run_stages import MPIEXEC, _env
    plan = make_plan(long_xtc[0], [long_xtc[1]], "rmsd", str(tmp_path / "late"), blocks=2,
                     cpus=2, schedule="dynamic")
    path = write_plan(plan)
    plan.lock.release()
    spec = stage_specs(plan, path)
    argv = spec["analyze"][0].argv(sys.executable)
    late = ["sh", "-c", 'sleep 3; exec "$@"', "late"] + argv
    proc = subprocess.run([MPIEXEC, "-n", "1"] + argv + [":", "-n", "1"] + late, env=_env(None),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    assert spec["reduce"] == []  # the analyze task's root has published result.h5
    static, _ = plan_and_run(tmp_path / "static", long_xtc[0], [long_xtc[1]], "rmsd", blocks=2,
                             cpus=2, schedule="static")
    assert np.array_equal(datasets(plan.result_path())["rmsd"], datasets(static)["rmsd"])
    ranks = {r["rank"]: r for r in records(plan)}
    assert ranks[1]["t_start"] - ranks[0]["t_start"] > 2.5  # it really came late
    first_chunk = min(c[4] for c in ranks[0]["chunks"])
    assert first_chunk < ranks[1]["t_start"] - 2.0  # rank 0 did not wait for it
    assert ranks[0]["frames"] > 0.9 * plan.n_frames, ranks[0]["frames"]
    assert ranks[0]["mpi_init_after_chunks"] and ranks[1]["mpi_init_after_chunks"]
    assert not [n for n in os.listdir(f"/dev/shm/trajflow-{os.getuid()}")
                if plan.input_checksum[:16] in n]


def analyze_under_shells(tmp_path, traj, env, timeout_s=None):
    """(plan, path, process) of a 2-rank dynamic analyze stage whose ranks each run under a
    shell of their own (as RADICAL-Pilot's task.*.exec.sh runs them), with `env` added."""
    from run_stages import MPIEXEC, _env
    plan = make_plan(traj[0], [traj[1]], "rmsd", str(tmp_path / "run"), blocks=2, cpus=2,
                     schedule="dynamic")
    if timeout_s is not None:
        plan.collective_timeout_s = timeout_s
    path = write_plan(plan)
    plan.lock.release()
    shell = ["sh", "-c", '"$@"; exit $?', "rank"] + stage_specs(plan, path)["analyze"][0].argv(
        sys.executable)
    proc = subprocess.run([MPIEXEC, "-n", "2"] + shell, env={**_env(None), **env},
                          capture_output=True, text=True, timeout=120)
    return plan, path, proc


@pytest.mark.parametrize("job_ids,early", [
    ({}, False),  # each rank under a shell of its own, no job id: the launch has no sure name
    ({"RP_SESSION_ID": "re.session.t", "RP_PILOT_ID": "pilot.0000", "RP_TASK_ID": "task.1"},
     True),  # as RADICAL-Pilot runs a rank (task.*.exec.sh: `rank &; wait`), with its ids
])
def test_ranks_under_shells_of_their_own_claim_early_only_when_the_launch_is_named(
        tmp_path, long_xtc, job_ids, early):
    """Ranks whose parent is not the launcher must not each make a counter of their own
    (each would analyse every chunk): they claim before MPI_Init only where the job's ids
    name the launch; either way every chunk is analysed once and the result is static's."""
    plan, path, proc = analyze_under_shells(tmp_path, long_xtc, job_ids)
    spec = stage_specs(plan, path)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-3000:]
    assert spec["reduce"] == []  # the analyze task's root has published result.h5
    static, _ = plan_and_run(tmp_path / "static", long_xtc[0], [long_xtc[1]], "rmsd", blocks=2,
                             cpus=2, schedule="static")
    assert np.array_equal(datasets(plan.result_path())["rmsd"], datasets(static)["rmsd"])
    ranks = records(plan)
    assert sum(r["frames"] for r in ranks) == plan.n_frames
    assert [r["mpi_init_after_chunks"] for r in ranks] == [early, early]


def test_a_rank_killed_before_mpi_init_does_not_leave_the_others_waiting(tmp_path, long_xtc):
    """Under shells of their own (as RADICAL-Pilot runs ranks), the launcher does not end
    the job when a rank dies before MPI_Init: the others, in MPI_Init, see its pid gone
    (the counter's file) and exit, long before the collective timeout; nothing published."""
    ids = {"RP_SESSION_ID": "re.session.k", "RP_PILOT_ID": "pilot.0000", "RP_TASK_ID": "task.2",
           "TRAJFLOW_TEST_KILL": "1"}
    # the collective timeout (600 s) must not be what ends it
    plan, _, proc = analyze_under_shells(tmp_path, long_xtc, ids, timeout_s=600.0)
    assert proc.returncode != 0
    assert "rank(s) [1] ended before MPI_Init" in proc.stdout + proc.stderr
    assert not os.path.exists(plan.gathered_part_path())


def test_a_rank_that_fails_before_mpi_init_ends_the_job_with_its_code(tmp_path, long_xtc):
    """TRAJFLOW_TEST_FAIL on rank 0 of ranks that claim before MPI_Init: it leaves no chunk
    to the others, joins their MPI_Init and aborts the job with its own exit code (3),
    the code the workstation judges a retry by."""
    from trajflow.tasks.exit_codes import INJECTED_FAILURE
    ids = {"RP_SESSION_ID": "re.session.f", "RP_PILOT_ID": "pilot.0000", "RP_TASK_ID": "task.3",
           "TRAJFLOW_TEST_FAIL": "0:1"}
    plan, _, proc = analyze_under_shells(tmp_path, long_xtc, ids)
    assert proc.returncode == INJECTED_FAILURE, proc.stdout[-1500:] + proc.stderr[-2000:]
    assert "TRAJFLOW_TEST_FAIL: block 0 fails on purpose" in proc.stderr
    assert not os.path.exists(plan.gathered_part_path())
