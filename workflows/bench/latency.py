"""`trajflow bench --latency`: what a run costs beside its analysis, on a held pilot and
on a pilot of its own, side by side with MDAnalysis' 2-worker run of the same analysis.

Each number is a median of `repeats`, measured in this one bench run:
  warm_rmsd_s     rmsd of AdK (PSF/DCD, 98 frames) on a held local pilot, from the call
                  (HeldPilot.submit) to its result, each sent once the one before had
                  ended (its report written);
  warm_backend_s  InterRDF of 1,000 of the solvated AdK's water oxygens through
                  MDAnalysis' run(backend=trajflow.Backend(pilot=NAME)), the call
                  (each, as each cli_warm_s, once the one before had its report);
  mda_workers_s   the same InterRDF with MDAnalysis' backend="multiprocessing",
                  n_workers=2 (a Python of its own; mda_serial_s: serial);
  ten_runs_s      ten `trajflow run --pilot NAME` processes started at once, until the
                  last has exited (their reports drawn meanwhile or after: a client
                  does not wait for its report);
  cli_warm_s      one `trajflow run ... --pilot NAME`, from the shell to its exit;
  cold_run_s      `trajflow run` with a pilot of its own, from the shell to its exit.
Every result is compared with MDAnalysis' serial one (`all_equal`). Where a warm
rmsd's time goes (`breakdown`) is read from its run folder: its wall time's parts, as
`inspect` gives them, and each stage's task start-up.
"""
import os
import statistics
import subprocess
import sys
import time
import warnings

import numpy as np

from trajflow.tasks.rundir import REPORT
from trajflow.workflows.bench.measure import mda_timed_script, run_isolated
from trajflow.workflows.datasets import adk_files, mdanalysis_data
from trajflow.workflows.profile.advice import run_times
from trajflow.workflows.run import held_client
from trajflow.workflows.run.runs import open_run
from trajflow.workflows.run.spec import PilotSpec

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
TARGETS = {"warm_rmsd_s": 1.0, "warm_backend_ratio": 1.5, "ten_runs_s": 6.0,
           "cold_run_s": 12.0, "cli_warm_s": 2.0}
TEN = 10

# 1,000 water oxygens: an InterRDF of about a second, as the users' small analyses are
# (all 11,000 of them: over a minute, which no longer measures what a run costs beside it)
RDF_WATERS = "name OW and index 20000:23000"

MDA_RDF = mda_timed_script("from MDAnalysis.analysis.rdf import InterRDF",
                           "InterRDF(ow, ow, nbins=75, exclusion_block=(1, 1))", "rdf",
                           setup=f"ow = u.select_atoms({RDF_WATERS!r})")


def _mda_rmsd_reference(top, dcd):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rms.RMSD(mda.Universe(top, dcd), select="name CA").run().results.rmsd


def _rmsd_equal(path, reference):
    import h5py
    with h5py.File(os.path.join(path, "result.h5"), "r") as f:
        return bool(np.allclose(f["rmsd"][:], reference, rtol=1e-5, atol=1e-4))


def _timed(args, cwd):
    t0 = time.perf_counter()
    done = subprocess.run([TRAJFLOW] + args, cwd=cwd, capture_output=True, text=True,
                          timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"trajflow {' '.join(args[:8])} failed: {done.stderr[-1500:]}")
    return time.perf_counter() - t0


def run_latency(repeats=3, folder=None, progress=print):
    """The numbers above, as a dict (see the module's docstring)."""
    folder = os.path.abspath(folder or f"trajflow-bench-latency-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(folder, exist_ok=True)
    top, dcd = adk_files()
    gro, xtc = mdanalysis_data("GRO", "XTC")
    rmsd_ref = _mda_rmsd_reference(top, dcd)
    rmsd_args = ["run", "--topology", top, "--trajectory", dcd, "--analysis", "rmsd", "--quiet"]
    equal = {}
    result = {"repeats": repeats, "targets": TARGETS}

    progress(f"cold: trajflow run with a pilot of its own, {repeats} times ...")
    cold = [_timed(rmsd_args + ["--out", os.path.join(folder, f"cold{i}")], folder)
            for i in range(repeats)]
    equal["cold_run"] = all(_rmsd_equal(os.path.join(folder, f"cold{i}"), rmsd_ref)
                            for i in range(repeats))
    result["cold_run_s"] = statistics.median(cold)

    name = f"bench-latency-{os.getpid()}"
    progress(f"holding a local pilot ({name}) ...")
    t0 = time.perf_counter()
    held_client.start_held(name, PilotSpec(path=os.path.join(folder, "pilot")),
                           idle_timeout_min=10, progress=False)
    result["pilot_start_s"] = time.perf_counter() - t0
    try:
        result.update(_warm(name, folder, top, dcd, gro, xtc, rmsd_ref, rmsd_args, repeats,
                            equal, progress))
    finally:
        held_client.stop_held(name)
    result["warm_backend_ratio"] = result["warm_backend_s"] / result["mda_workers_s"]
    result["equal"] = equal
    result["all_equal"] = all(equal.values())
    result["met"] = {key: result[key] <= target for key, target in TARGETS.items()}
    return result


def _warm(name, folder, top, dcd, gro, xtc, rmsd_ref, rmsd_args, repeats, equal, progress):
    out = {}
    progress(f"warm: rmsd on the held pilot, {repeats} times ...")
    warm, breakdowns = [], []
    with held_client.HeldPilot(name, progress=False) as pilot:
        for i in range(repeats):
            t0 = time.time()
            future = pilot.submit(top, dcd, "rmsd", out=os.path.join(folder, f"warm{i}"))
            run = future.result()
            got = time.time()
            # each on a quiet pilot: the holder's drawer draws a run's report.html after
            # its result (0.3 s of CPU, at nice +10), which the next run's tasks would
            # otherwise share the cores with (ten_runs_s measures runs that overlap)
            future.followed.join(120)
            warm.append(got - t0)
            breakdowns.append(breakdown(run.path, t0, got))
            equal[f"warm_rmsd_{i}"] = bool(np.allclose(run.results.rmsd, rmsd_ref, rtol=1e-5,
                                                       atol=1e-4))
    out["warm_rmsd_s"] = statistics.median(warm)
    out["breakdown"] = {k: statistics.median(b[k] for b in breakdowns if k in b)
                        for k in breakdowns[0]}

    progress(f"warm: InterRDF through Backend(pilot={name}) and MDAnalysis' own, "
             f"{repeats} times ...")
    rdf_ref = np.load(_mda_rdf(gro, xtc, 1, folder)[1])
    mda_serial = [_mda_rdf(gro, xtc, 1, folder)[0] for _ in range(repeats)]
    mda_two = []
    for i in range(repeats):
        seconds, path = _mda_rdf(gro, xtc, 2, folder)
        mda_two.append(seconds)
        equal[f"mda_workers_{i}"] = bool(np.allclose(np.load(path), rdf_ref, rtol=1e-6))
    backend = [_backend_rdf(name, gro, xtc, folder, rdf_ref, equal, i) for i in range(repeats)]
    out.update(warm_backend_s=statistics.median(backend), mda_workers_s=statistics.median(mda_two),
               mda_serial_s=statistics.median(mda_serial))

    progress(f"warm: trajflow run --pilot {name}, from the shell, {repeats} times ...")
    cli = []
    for i in range(repeats):
        cli.append(_timed(rmsd_args + ["--pilot", name, "--out", os.path.join(folder, f"cli{i}")],
                          folder))
        _report_drawn(os.path.join(folder, f"cli{i}"))
    equal["cli_warm"] = all(_rmsd_equal(os.path.join(folder, f"cli{i}"), rmsd_ref)
                            for i in range(repeats))
    out["cli_warm_s"] = statistics.median(cli)

    progress(f"warm: {TEN} runs from {TEN} processes at once ...")
    t0 = time.perf_counter()
    procs = [subprocess.Popen([TRAJFLOW] + rmsd_args + ["--pilot", name, "--out",
                                                        os.path.join(folder, f"ten{i}")],
                              cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for i in range(TEN)]
    try:
        errors = [p.communicate(timeout=900)[1] for p in procs]
    finally:  # none left running, whatever happened
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    out["ten_runs_s"] = time.perf_counter() - t0
    failed = [e for p, e in zip(procs, errors) if p.returncode != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} of the {TEN} runs failed: {failed[0][-1500:]}")
    equal["ten_runs"] = all(_rmsd_equal(os.path.join(folder, f"ten{i}"), rmsd_ref)
                            for i in range(TEN))
    return out


def _mda_rdf(gro, xtc, n_workers, folder):
    path = os.path.join(folder, f"mda_rdf_{n_workers}.npy")
    return run_isolated(MDA_RDF, gro, xtc, str(n_workers), path, timeout=600), path


def _backend_rdf(name, gro, xtc, folder, reference, equal, i):
    import MDAnalysis as mda
    from MDAnalysis.analysis.rdf import InterRDF
    import trajflow
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        u = mda.Universe(gro, xtc)
        ow = u.select_atoms(RDF_WATERS)
        backend = trajflow.Backend(pilot=name, out=os.path.join(folder, f"backend{i}"),
                                   progress=False)
        t0 = time.perf_counter()
        rdf = InterRDF(ow, ow, nbins=75, exclusion_block=(1, 1)).run(
            backend=backend, n_workers=2, unsupported_backend=True)
        seconds = time.perf_counter() - t0
    equal[f"warm_backend_{i}"] = bool(np.allclose(rdf.results.rdf, reference, rtol=1e-6))
    _report_drawn(backend.last_run.path)
    return seconds


def _report_drawn(rundir, timeout=120.0):
    """Wait (untimed) for the held pilot's drawer to write the run's report.html: each run
    is measured on a quiet pilot, as the warm rmsd is (ten_runs_s measures runs that
    overlap, their reports included)."""
    deadline = time.time() + timeout
    while not os.path.exists(os.path.join(rundir, REPORT)) and time.time() < deadline:
        time.sleep(0.05)


def breakdown(rundir, called, returned):
    """Where a run's time went, in seconds, from its folder: its wall time's parts (the
    same as `inspect` gives: wall_time.py), each stage's task start-up (launch to the
    task's first line) within them, and the result given back (the run's end to the
    call's return)."""
    run = open_run(rundir)
    times = run_times(run.profile.records, run.plan)
    out = dict(times["wall"]["parts"])
    for stage in ("split", "analyze", "reduce"):
        ups = [r["t_start"] - r["radical"]["launch_start"] for r in run.profile.records
               if r["task"] == stage and "launch_start" in r.get("radical", {})]
        if ups:
            out[f"{stage} task start-up"] = max(ups)
    end = (run.outcome or {}).get("ended")
    if end:
        out["result to caller"] = returned - end
    out["total"] = returned - called
    return out


def format_latency(result):
    """The bench's table: each number beside its target and MDAnalysis' own."""
    met = result["met"]

    def row(label, key, unit="s", target=None):
        mark = "" if key not in met else ("  met" if met[key] else "  NOT MET")
        shown = f"<= {target if target is not None else TARGETS[key]}" if key in TARGETS else ""
        return f"  {label:52s} {result[key]:7.2f} {unit:3s} {shown:10s}{mark}"
    lines = [f"latency, medians of {result['repeats']} (2-core local pilot):",
             row("cold: trajflow run with a pilot of its own", "cold_run_s"),
             row("holding a pilot (trajflow pilot start)", "pilot_start_s"),
             row("warm: rmsd, call to result", "warm_rmsd_s"),
             row("warm: trajflow run --pilot, shell to exit", "cli_warm_s"),
             row(f"warm: {TEN} runs from {TEN} processes at once", "ten_runs_s"),
             row("warm: InterRDF via Backend(pilot=NAME)", "warm_backend_s"),
             row("      MDAnalysis, 2 workers (multiprocessing)", "mda_workers_s"),
             row("      MDAnalysis, serial", "mda_serial_s"),
             row("      Backend / MDAnalysis 2 workers", "warm_backend_ratio", unit="x"),
             "  where a warm rmsd's time goes (s): " + ", ".join(
                 f"{k.replace('_', ' ')} {v:.2f}" for k, v in result["breakdown"].items()),
             "  every result equal to MDAnalysis' serial run: "
             + ("yes" if result["all_equal"] else "NO: " + ", ".join(
                 k for k, v in result["equal"].items() if not v))]
    return "\n".join(lines)
