"""`trajflow bench`: our kernels and readers against the baselines, side by side, in one run.

Every number is microseconds per frame (or seconds where named), measured in
this process on the same data one after another, best of `repeats` runs, so
that ratios are fair on a noisy machine. Baselines: MDAnalysis' own classes,
the papers' per-frame loops (Khoshlessan et al. 2019, Appendix B), and mdtraj's SSE QCP
(the fastest RMSD known; an optional, benchmark-only dependency).
"""
import glob
import json
import os
import platform
import subprocess
import sys
import time
import warnings

import numpy as np

from trajflow.tasks import kernels
from trajflow.tasks.analyses import Dihedrals, RMSD
from trajflow.tasks.mda_analyses import read_results
from trajflow.tasks.plan import chunk_size
from trajflow.tasks.readers import H5MDChunkReader, open_trajectory, TrajectoryBlockReader
from trajflow.tasks.rundir import read_outcome
from trajflow.tasks.timing import RankTimer
from trajflow.workflows.bench.large import format_large, run_large
from trajflow.workflows.bench.measure import (analyze_records, mda_rmsd, mpiexec_stage_s,
                                              run_isolated)
from trajflow.workflows.datasets import adk_concatenated, adk_files, solvated_concatenated
from trajflow.workflows.run.execute import run_plans
from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment
from trajflow.workflows.run.planning import plan_from_options, write_plan
from trajflow.workflows.run.spec import PilotSpec


def best_of(fn, repeats):
    """Smallest wall time of `repeats` calls of fn() (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def per_frame_us(seconds, n_frames):
    return seconds / n_frames * 1e6


def _ours_e2e(reader, analysis, n_frames):
    """Read + compute over the whole trajectory: the analyze task's own block loop."""
    return analysis.run_block(reader, 0, n_frames, chunk_size(0, len(analysis.atom_indices)),
                              RankTimer("bench"))


def bench_rmsd(top, paths, repeats, loop_frames):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    r = {}
    u = mda.Universe(top, paths["DCD"])
    n = u.trajectory.n_frames
    ca = u.select_atoms("name CA")
    coords = u.trajectory.timeseries(atomgroup=ca, order="fac")
    ref = kernels.prepare_reference(coords[0])
    chunk = chunk_size(0, len(ca))  # as the analyze task feeds the kernel
    r["ours_compute_us"] = per_frame_us(best_of(
        lambda: [kernels.qcp_rmsd(coords[i:i + chunk], ref) for i in range(0, n, chunk)], repeats), n)
    r["mdtraj_compute_us"] = _mdtraj_rmsd_us(coords, repeats)
    sub = coords[:loop_frames]
    ref0 = coords[0].astype(np.float64)
    r["mda_loop_compute_us"] = per_frame_us(best_of(lambda: [
        rms.rmsd(x, ref0, center=True, superposition=True) for x in sub], repeats), len(sub))

    analysis = RMSD(RMSD.select(u, "name CA"))
    analysis.reference = ref
    dcd = TrajectoryBlockReader(open_trajectory([paths["DCD"]]), analysis.atom_indices)
    r["ours_e2e_dcd_us"] = per_frame_us(best_of(lambda: _ours_e2e(dcd, analysis, n), repeats), n)
    r["mda_rmsd_run_dcd_us"] = per_frame_us(best_of(
        lambda: rms.RMSD(u, select="name CA").run(), 1), n)
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        r["mda_mp2_rmsd_run_dcd_us"] = per_frame_us(mda_rmsd(top, paths["DCD"], 2, tmp)[0], n)

    def seed_loop():  # Khoshlessan et al. 2019, Appendix B.1, per frame
        for ts in u.trajectory:
            rms.rmsd(ca.positions, ref0, center=True, superposition=True)
    r["seed_loop_e2e_dcd_us"] = per_frame_us(best_of(seed_loop, 1), n)

    xtc = TrajectoryBlockReader(open_trajectory([paths["XTC"]]), analysis.atom_indices)
    r["ours_e2e_xtc_us"] = per_frame_us(best_of(lambda: _ours_e2e(xtc, analysis, n), repeats), n)
    h5 = H5MDChunkReader(paths["H5MD"], analysis.atom_indices)
    r["ours_e2e_h5md_us"] = per_frame_us(best_of(lambda: _ours_e2e(h5, analysis, n), repeats), n)
    uh = mda.Universe(top, paths["H5MD"])
    cah = uh.select_atoms("name CA")
    m = min(n, 20 * loop_frames)
    r["mda_h5md_iter_us"] = per_frame_us(best_of(
        lambda: [cah.positions for _ in uh.trajectory[:m]], 1), m)
    return r


def _mdtraj_rmsd_us(coords, repeats):
    try:
        import mdtraj as md
    except ImportError:
        return None
    top = md.Topology()
    chain = top.add_chain()
    for _ in range(coords.shape[1]):
        top.add_atom("CA", md.element.carbon, top.add_residue("ALA", chain))
    traj = md.Trajectory(coords / 10.0, top)
    traj.center_coordinates()
    return per_frame_us(best_of(
        lambda: md.rmsd(traj, traj, 0, precentered=True, parallel=False), repeats), len(coords))


def bench_dihedrals(top, paths, repeats, loop_frames):
    import MDAnalysis as mda
    from MDAnalysis.lib.distances import calc_dihedrals
    from itertools import chain as ichain
    r = {}
    u = mda.Universe(top, paths["DCD"])
    n = u.trajectory.n_frames
    analysis = Dihedrals(Dihedrals.select(u, "protein"))
    chain = analysis.selected["chain"]
    coords = u.trajectory.timeseries(atomgroup=u.atoms[analysis.atom_indices], order="fac")
    chunk = chunk_size(0, len(analysis.atom_indices))
    r["ours_compute_us"] = per_frame_us(best_of(
        lambda: [kernels.backbone_features(coords[i:i + chunk], chain)
                 for i in range(0, n, chunk)], repeats), n)
    # the papers' featurisation: a Python loop over MDAnalysis Dihedral objects (Appendix B.3)
    residues = u.select_atoms("protein").residues[1:-1]
    dihedrals = list(ichain.from_iterable((res.phi_selection().dihedral, res.psi_selection().dihedral)
                                         for res in residues))

    def seed_loop():
        for _ in u.trajectory[:loop_frames]:
            x = np.deg2rad([d.value() for d in dihedrals])
            np.ravel(np.transpose([np.cos(x), np.sin(x)]))
    r["seed_loop_compute_us"] = per_frame_us(best_of(seed_loop, 1), loop_frames)
    q = chain
    full = coords[:loop_frames]

    def mda_all_at_once():
        for x in full:
            phi = calc_dihedrals(x[q[:, 0]], x[q[:, 1]], x[q[:, 2]], x[q[:, 3]])
            psi = calc_dihedrals(x[q[:, 1]], x[q[:, 2]], x[q[:, 3]], x[q[:, 4]])
            np.stack([np.cos(phi), np.sin(phi), np.cos(psi), np.sin(psi)], axis=1).ravel()
    r["mda_calc_dihedrals_compute_us"] = per_frame_us(best_of(mda_all_at_once, repeats), len(full))
    dcd = TrajectoryBlockReader(open_trajectory([paths["DCD"]]), analysis.atom_indices)
    r["ours_e2e_dcd_us"] = per_frame_us(best_of(lambda: _ours_e2e(dcd, analysis, n), repeats), n)
    return r


def bench_parallel(top, dcd, workdir, launches=5):
    """The analyze stage alone under mpiexec -n 1 and -n 2: the slowest rank's t_total
    per launch, best of `launches` (the stage takes a twentieth of a second on a shared
    2-core VM: one descheduled rank would otherwise decide the ratio); the median
    launch's efficiency is reported beside it."""
    times = {}
    for n in (1, 2):
        plan = plan_from_options(top, [dcd], "rmsd", out=os.path.join(workdir, f"parallel_{n}"),
                         mode="mpi", blocks=n, cpus=n)
        times[n] = mpiexec_stage_s(plan, write_plan(plan), launches)
    one, two = min(times[1]), min(times[2])
    return {"analyze_1rank_s": one, "analyze_2rank_s": two, "efficiency_2": one / (2 * two),
            "efficiency_2_median": float(np.median(times[1]) / (2 * np.median(times[2]))),
            "launches": launches}


def bench_startup(top, dcd, workdir, launches=5):
    """A task's start-up and exit, side by side warm and on a fresh install: the
    analyze task (tasks mode, one block of RMSD over DCD) launched `launches`
    times each way; start-up is its launch to the rank's first timestamp, exit its
    last timestamp to the process' end (medians). Fresh: empty kernel and numba
    caches (each launch its own), then what a pilot does before its first task
    (`python -m trajflow.tasks.kernels`, timed apart as prepare_s), then the task;
    without that step a task compiles the kernels itself (jit_start_s). (.pyc
    files are as pip leaves them: compiled at install; an editable trajflow's are
    compiled by the pilot's step.)"""
    kernels.build_ahead_of_time()  # warm means what a pilot leaves: the kernels built
    plan = plan_from_options(top, [dcd], "rmsd", out=os.path.join(workdir, "startup"), mode="tasks",
                     blocks=2, cpus=2)
    plan_path = write_plan(plan)
    plan.lock.release()
    out, prepares = {}, []
    for label in ("warm", "fresh", "jit"):
        starts, exits = [], []
        for k in range(launches if label != "jit" else 1):
            env = dict(os.environ)
            if label != "warm":
                empty = os.path.join(workdir, f"empty_{label}_{k}")
                env.update(TRAJFLOW_KERNEL_CACHE=os.path.join(empty, "kernels"),
                           NUMBA_CACHE_DIR=os.path.join(empty, "numba"))
            if label == "fresh":
                t0 = time.time()
                subprocess.run([sys.executable, "-m", "trajflow.tasks.kernels"], check=True,
                               env=env, capture_output=True)
                prepares.append(time.time() - t0)
            t0 = time.time()
            subprocess.run([sys.executable, "-m", "trajflow.tasks.analyze", "--plan", plan_path,
                            "--block", "0"], check=True, env=env)
            t1 = time.time()
            with open(plan.profile_path("analyze.block_00000")) as fh:
                rec = json.loads(fh.readline())
            starts.append(rec["t_start"] - t0)
            exits.append(t1 - rec["t_stop"])
        out[f"{label}_start_s"] = float(np.median(starts))
        if label == "warm":
            out["exit_s"] = float(np.median(exits))
    out["prepare_s"] = float(np.median(prepares))
    out["mpi_exit_s"] = mpi_exit_s(top, dcd, workdir, launches)
    out["launches"] = launches
    return out


def mpi_exit_s(top, dcd, workdir, launches):
    """An MPI rank's exit: the analyze stage (2 ranks, RMSD over DCD) under mpiexec, from
    the last rank's last timestamp (the gather root's publish of result.h5 included: its
    reduce record's end) to mpiexec's end (median of `launches`)."""
    plan = plan_from_options(top, [dcd], "rmsd", out=os.path.join(workdir, "mpi_exit"), mode="mpi",
                     blocks=2, cpus=2)
    spec = stage_specs(plan, write_plan(plan))["analyze"][0]
    plan.lock.release()
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exits = []
    for _ in range(launches):
        subprocess.run([mpiexec, "-n", "2"] + spec.argv(sys.executable), check=True,
                       env={**os.environ, **task_environment()})
        with open(plan.profile_path("reduce")) as fh:  # written by the gather's root
            published = json.loads(fh.readline())["t_stop"]
        exits.append(time.time() - max([published] + [r["t_stop"] for r in analyze_records(plan)]))
    return float(np.median(exits))


WATER_RDF = '''"""The user-analysis benchmark's factory, written as a user would write it."""
from MDAnalysis.analysis.rdf import InterRDF


def water_rdf(u):
    """InterRDF of water O-O (first shells, to 8 A)."""
    ow = u.select_atoms("name OW")
    return InterRDF(ow, ow, nbins=80, range=(0.0, 8.0), exclusion_block=(1, 1))
'''


MDA_USER_ANALYSIS = """
import json, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
import MDAnalysis as mda
from trajflow.tasks.mda_analyses import load_factory
factory_file, top, xtc, out = sys.argv[1:5]
u = mda.Universe(top, xtc)
t0 = time.perf_counter()
results = load_factory("file", factory_file, "water_rdf")(u).run(backend="multiprocessing",
                                                                 n_workers=2).results
seconds = time.perf_counter() - t0
np.savez(out, rdf=results.rdf, count=results.count)
print(json.dumps(seconds))
"""


def bench_user_analysis(workdir, copies=20, rounds=2):
    """A user's MDAnalysis analysis (WATER_RDF, a factory file) on the solvated AdK repeated to
    copies x 10 frames: trajflow's analyze stage with 2 MPI ranks (the slowest
    rank's t_total; and the wall time of the analyze and reduce launches,
    start-up included) against MDAnalysis' own run(backend="multiprocessing",
    n_workers=2) on the same frames. The two sides alternate, `rounds` times
    each, in the order A B B A ..., so that a drift of the machine's speed over
    the minutes the bench takes falls on both; the best of each side counts.
    Both results are checked to agree."""
    import MDAnalysis as mda
    top, xtc = solvated_concatenated(copies, "XTC")
    factory_file = os.path.join(workdir, "water_rdf.py")
    with open(factory_file, "w", encoding="utf-8") as fh:
        fh.write(WATER_RDF)
    plan = plan_from_options(top, [xtc], f"{factory_file}:water_rdf", out=os.path.join(workdir, "rdf"),
                     mode="mpi", blocks=2, cpus=2)
    specs = stage_specs(plan, write_plan(plan))
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    env = {**os.environ, **task_environment()}
    u = mda.Universe(top, xtc)
    stage, wall, theirs_s = [], [], []

    def ours():
        t0 = time.perf_counter()
        subprocess.run([mpiexec, "-n", "2"] + specs["analyze"][0].argv(sys.executable), check=True,
                       env=env)
        for spec in specs["reduce"]:  # none: the MPI analyze's root published result.h5
            subprocess.run(spec.argv(sys.executable), check=True, env=env)
        wall.append(time.perf_counter() - t0)
        totals = []
        for b in range(2):
            with open(plan.profile_path(f"analyze.block_{b:05d}")) as fh:
                totals.append(json.loads(fh.readline())["t_total"])
        stage.append(max(totals))

    def theirs():  # in a Python of its own, as bench_large.mda_rmsd
        out = os.path.join(workdir, "mda_rdf.npz")
        theirs_s.append(run_isolated(MDA_USER_ANALYSIS, factory_file, top, xtc, out))
        with np.load(out) as data:
            return {k: data[k] for k in data.files}

    for r in range(rounds):
        for side in ((theirs, ours) if r % 2 == 0 else (ours, theirs)):
            reference = side()
            if reference is not None:
                theirs_result = reference
    import h5py
    with h5py.File(plan.result_path()) as f:
        ours_result = read_results(f["results"])
    if not (np.allclose(ours_result.rdf, theirs_result["rdf"], rtol=1e-6)
            and np.array_equal(ours_result.count, theirs_result["count"])):
        raise RuntimeError("the user-analysis benchmark: trajflow's InterRDF differs from MDAnalysis'")
    return {"n_frames": int(u.trajectory.n_frames), "n_water_o": len(u.select_atoms("name OW")),
            "rounds": rounds, "ours_2rank_stage_s": min(stage), "ours_2rank_wall_s": min(wall),
            "mda_mp2_s": min(theirs_s), "ours_2rank_stage_all_s": stage,
            "ours_2rank_wall_all_s": wall, "mda_mp2_all_s": theirs_s}


def _prof_events(path):
    """(time, event) of a RADICAL profile file."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split(",")
            if len(parts) > 2 and not line.startswith("#"):
                out.append((float(parts[0]), parts[1]))
    return out


def bench_entk_overhead(workdir):
    """A one-block local run of the real pipeline, cut into pieces by its own profiles:
    pilot start (process launch to the pilot active), first task (pilot active to
    the first task submitted), task span (first submitted to last done) and
    teardown (last task done to process exit)."""
    top, dcd = adk_files()
    out = os.path.join(workdir, "entk")
    trajflow = os.path.join(os.path.dirname(sys.executable), "trajflow")
    t_launch = time.time()
    subprocess.run([trajflow, "run", "--topology", top, "--trajectory", dcd, "--analysis", "rmsd",
                    "--mode", "tasks", "--blocks", "1", "--cpus", "1", "--walltime", "10",
                    "--out", out], check=True, capture_output=True)
    t_exit = time.time()
    session = glob.glob(os.path.join(out, "re.session.*"))[0]
    amgr = _prof_events(os.path.join(session, "radical.entk.appmanager.0000.prof"))
    rmgr = _prof_events(os.path.join(session, "radical.entk.resource_manager.0000.prof"))
    active = next(t for t, e in rmgr if e == "resource active")
    submitted = [t for t, e in amgr if e == "sync_recv_obj_state_SUBMITTING"]
    done = [t for t, e in amgr if e == "sync_recv_obj_state_DONE"]
    return {"total_s": t_exit - t_launch, "pilot_start_s": active - t_launch,
            "to_first_task_s": min(submitted) - active, "task_span_s": max(done) - min(submitted),
            "teardown_s": t_exit - max(done)}


def bench_pilot_reuse(workdir):
    """Two one-block runs through one pilot, one after another (as a campaign runs
    its experiments): the second run's whole time, from the first run's end to its
    own, is what each further run costs once the pilot is up."""
    top, dcd = adk_files()
    runs = []
    for name in ("first", "second"):
        plan = plan_from_options(top, [dcd], "rmsd", out=os.path.join(workdir, "reuse", name), mode="tasks",
                         blocks=1, cpus=1)
        runs.append((name, plan, write_plan(plan)))
    t0 = time.time()
    report = run_plans(runs, PilotSpec(walltime=10, cpus=1), one_at_a_time=True,
                       session_root=os.path.join(workdir, "reuse"))
    if not report.ok:
        raise RuntimeError("the pilot-reuse benchmark runs failed")
    ended = [read_outcome(plan.workdir)["ended"] for _, plan, _ in runs]
    return {"two_runs_total_s": time.time() - t0, "run_on_kept_pilot_s": ended[1] - ended[0]}


def run_bench(copies=100, repeats=3, loop_frames=200, workdir=None, with_parallel=True,
              with_entk=True, user_copies=20, startup_launches=5):
    import MDAnalysis as mda
    warnings.filterwarnings("ignore")
    paths = {}
    for fmt in ("DCD", "XTC", "H5MD"):
        top, paths[fmt] = adk_concatenated(copies, fmt)
    u = mda.Universe(top, paths["DCD"])
    result = {"system": {"machine": platform.machine(), "python": platform.python_version(),
                         "cpus": os.cpu_count(), "n_frames": int(u.trajectory.n_frames),
                         "n_atoms": len(u.atoms), "n_ca": len(u.select_atoms("name CA")),
                         "numpy": np.__version__, "MDAnalysis": mda.__version__,
                         "repeats": repeats, "loop_frames": loop_frames}}
    result["rmsd"] = bench_rmsd(top, paths, repeats, loop_frames)
    result["dihedrals"] = bench_dihedrals(top, paths, repeats, loop_frames // 4)
    import tempfile
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        result["startup"] = bench_startup(top, paths["DCD"], tmp, startup_launches)
    if with_parallel:
        import tempfile
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            result["parallel"] = bench_parallel(top, paths["DCD"], tmp)
    if user_copies:
        import tempfile
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            result["user_analysis"] = bench_user_analysis(tmp, user_copies)
    if with_entk:
        import tempfile
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            result["entk_overhead_s"] = bench_entk_overhead(tmp)
            result["entk_overhead_s"].update(bench_pilot_reuse(tmp))
    return result


def run_bench_large(gb=2.0, launches=3, with_entk=True, startup_launches=5, workdir=None,
                    ranks=None, ceiling=False, cases=None):
    """The gigabyte-scale case (bench_large.py) and a task's start-up and exit."""
    import tempfile
    import MDAnalysis as mda
    warnings.filterwarnings("ignore")
    result = {"system": {"machine": platform.machine(), "python": platform.python_version(),
                         "cpus": os.cpu_count(), "numpy": np.__version__,
                         "MDAnalysis": mda.__version__, "launches": launches}}
    result.update(run_large(gb, launches, with_entk, workdir, ranks=ranks, ceiling=ceiling,
                            cases=cases))
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        result["startup"] = bench_startup(*adk_files(), tmp, startup_launches)
    return result


def ratios(result):
    """The comparisons the targets are stated in: (label, value, target text)."""
    rows = []
    if "rmsd" not in result:
        return rows
    r, d = result["rmsd"], result["dihedrals"]

    def ratio(label, a, b, target):
        if a is not None and b is not None and b > 0:
            rows.append((label, a / b, target))
    ratio("rmsd compute: ours / mdtraj", r["ours_compute_us"], r["mdtraj_compute_us"], "<= 1.5")
    ratio("rmsd compute: MDAnalysis loop / ours", r["mda_loop_compute_us"], r["ours_compute_us"], ">= 30")
    ratio("dihedral compute: papers' loop / ours", d["seed_loop_compute_us"], d["ours_compute_us"], ">= 1000")
    ratio("rmsd e2e DCD: rms.RMSD.run / ours", r["mda_rmsd_run_dcd_us"], r["ours_e2e_dcd_us"], ">= 8")
    ratio("rmsd e2e DCD: MDA 2-worker run / ours (1 rank)", r["mda_mp2_rmsd_run_dcd_us"],
          r["ours_e2e_dcd_us"], "> 1")
    ratio("rmsd e2e H5MD: MDA H5MD iteration / ours", r["mda_h5md_iter_us"], r["ours_e2e_h5md_us"], ">= 10")
    if "user_analysis" in result:
        ua = result["user_analysis"]
        ratio("InterRDF: MDA 2-worker run / ours 2 ranks (stage)", ua["mda_mp2_s"],
              ua["ours_2rank_stage_s"], ">= 1")
        ratio("InterRDF: MDA 2-worker run / ours 2 ranks (wall, start-up incl.)", ua["mda_mp2_s"],
              ua["ours_2rank_wall_s"], "(shown)")
    return rows


def format_table(result):
    lines = []
    if "rmsd" in result:
        lines.append(f"AdK x{result['system']['n_frames'] // 98}: {result['system']['n_frames']} "
                     f"frames, {result['system']['n_atoms']} atoms, {result['system']['n_ca']} CA")
    if "large" in result:
        lines += format_large(result)
    for section in ("rmsd", "dihedrals"):
        if section not in result:
            continue
        lines.append(f"\n{section} (us per frame)")
        for key, value in result[section].items():
            lines.append(f"  {key:34s} {'n/a' if value is None else f'{value:12.2f}'}")
    if "parallel" in result:
        p = result["parallel"]
        lines.append(f"\nanalyze stage (rmsd, DCD): 1 rank {p['analyze_1rank_s']:.3f} s, 2 ranks "
                     f"{p['analyze_2rank_s']:.3f} s (best of {p['launches']} launches each), efficiency "
                     f"{p['efficiency_2']:.2f} (target >= 0.85; median launches {p['efficiency_2_median']:.2f})")
    if "startup" in result:
        st = result["startup"]
        lines.append(f"\na task's start-up (launch to its first timestamp, medians of "
                     f"{st['launches']}): warm {st['warm_start_s']:.2f} s (target <= 0.5); fresh "
                     f"install {st['fresh_start_s']:.2f} s (target <= 1.0) after the pilot's "
                     f"preparation ({st['prepare_s']:.1f} s, once per pilot), "
                     f"{st['jit_start_s']:.1f} s without it; exit {st['exit_s']:.3f} s, an MPI "
                     f"rank's {st['mpi_exit_s']:.3f} s (target <= 0.1)")
    if "user_analysis" in result:
        ua = result["user_analysis"]
        lines.append(f"\nyour own analysis (InterRDF water O-O, {ua['n_water_o']} O, solvated AdK "
                     f"x{ua['n_frames'] // 10} = {ua['n_frames']} frames): ours 2 ranks "
                     f"{ua['ours_2rank_stage_s']:.1f} s stage, {ua['ours_2rank_wall_s']:.1f} s with "
                     f"launch and reduce; MDAnalysis multiprocessing 2 workers {ua['mda_mp2_s']:.1f} s "
                     f"(best of {ua['rounds']}, alternating; every run: ours "
                     f"{', '.join(f'{t:.1f}' for t in ua['ours_2rank_wall_all_s'])} s wall, MDAnalysis "
                     f"{', '.join(f'{t:.1f}' for t in ua['mda_mp2_all_s'])} s)")
    if "entk_overhead_s" in result:
        e = result["entk_overhead_s"]
        lines.append(f"\nEnTK one-block local run: {e['total_s']:.1f} s = pilot start {e['pilot_start_s']:.1f} "
                     f"+ to first task {e['to_first_task_s']:.1f} + task span {e['task_span_s']:.1f} "
                     f"+ teardown {e['teardown_s']:.1f} (target total <= 25 s)")
        if "run_on_kept_pilot_s" in e:
            lines.append(f"  a further one-block run on a kept pilot (campaigns): "
                         f"{e['run_on_kept_pilot_s']:.1f} s; two runs on one pilot "
                         f"{e['two_runs_total_s']:.1f} s in all")
    if "rmsd" in result:
        lines.append("\nratios")
    for label, value, target in ratios(result):
        lines.append(f"  {label:50s} {value:10.2f}   target {target}")
    return "\n".join(lines)
