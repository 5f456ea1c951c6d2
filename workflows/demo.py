"""`trajflow demo`: the point of the product in about a minute.

It builds the solvated AdK (MDAnalysisTests' GRO/XTC, 47,681 atoms) repeated
to a few thousand frames in the cache (once), keeps one local pilot for its runs, runs CA
RMSD on it with 2 MPI ranks beside MDAnalysis' serial and 2-worker runs of the
same analysis (each in a Python of its own), checks that the three agree,
and prints the times, the straggler verdict and the report's path; then a
second analysis (backbone RMSD) on the same pilot, which starts no pilot
of its own, and the pilot is stopped. (The pilot is this process's own,
kept for both runs; `trajflow pilot start` holds one beyond a command.)
"""
import dataclasses
import os
import shlex
import time

import numpy as np

from trajflow.workflows.bench.measure import mda_rmsd
from trajflow.workflows.datasets import solvated_concatenated
from trajflow.workflows.errors import RunFailed
from trajflow.workflows.profile.advice import run_times
from trajflow.workflows.profile.inspection import straggler_lines
from trajflow.workflows.run.pilot import Pilot

DEFAULT_COPIES = 500  # x 10 frames: 5,000 frames, ~830 MB of XTC, copied in seconds once


def run_demo(out, copies, pilot_spec, spec, say=print):
    """The demo into `out`; the exit code (1 if a run failed or disagreed)."""
    say(f"building the demo trajectory (solvated AdK, 47,681 atoms, x{copies}) in the cache, "
        "once ...")
    top, xtc = solvated_concatenated(copies, "XTC")
    say(f"  {xtc}")
    os.makedirs(out, exist_ok=True)
    spec_of_pilot = dataclasses.replace(pilot_spec, cpus=pilot_spec.cpus or 2,
                                        path=os.path.join(out, "pilot"))
    say(f"holding a pilot on {spec_of_pilot.resource} ({spec_of_pilot.cpus} cores) for both "
        "analyses ...")
    # reports written after the timings: each run's call to its result is what is timed
    with Pilot(progress=spec.progress, reports=False,
               **dataclasses.asdict(spec_of_pilot)) as pilot:
        t0 = time.time()
        pilot.start()
        say(f"  pilot active in {time.time() - t0:.1f} s (paid once, not per run)")
        t0 = time.time()
        rmsd = pilot.run(top, xtc, "rmsd", blocks=2, retries=spec.retries,
                         out=os.path.join(out, "rmsd"))
        ours = time.time() - t0
        say("MDAnalysis' own runs of the same analysis (CA RMSD), for comparison ...")
        serial_s, serial = mda_rmsd(top, xtc, 1, out)
        workers_s, workers = mda_rmsd(top, xtc, 2, out)
        equal = (np.allclose(rmsd.results.rmsd, serial, rtol=1e-5, atol=1e-4)
                 and np.allclose(workers, serial, rtol=1e-5, atol=1e-4))
        _say_comparison(say, rmsd, ours, serial_s, workers_s, equal)
        t0 = time.time()
        try:
            second = pilot.run(top, xtc, "rmsd", select="backbone", blocks=2,
                               retries=spec.retries, out=os.path.join(out, "rmsd_backbone"))
        except RunFailed as exc:
            say(f"the second analysis failed: {exc}")
            return 1
        say(f"a second analysis on the same pilot, no pilot start: backbone RMSD of "
            f"{second.plan.n_frames:,} frames in {time.time() - t0:.1f} s -> {second.result_path} "
            f"(report: {second.write_report()})")
        say("stopping the pilot ...")
    say(f"done: the runs are in {out}; `trajflow inspect {shlex.quote(out + '/rmsd')}` for the "
        "phase table, "
        "`trajflow pilot start` to hold a pilot for your own runs")
    return 0 if equal else 1


def _say_comparison(say, run, ours, serial_s, workers_s, equal):
    times = run_times(run.profile.records, run.plan)
    n = run.plan.n_frames
    say(f"CA RMSD of {n:,} frames ({run.plan.n_atoms:,} atoms), the call to the result:")
    say(f"  trajflow, 2 MPI ranks on the kept pilot  {ours:6.2f} s   (its analysis itself "
        f"{times['analysis']:.2f} s, {1e6 * times['analysis'] / n:.0f} us/frame)")
    say(f"  MDAnalysis, serial                       {serial_s:6.2f} s   "
        f"({serial_s / ours:.1f}x trajflow's time)")
    say(f"  MDAnalysis, 2 workers (multiprocessing)  {workers_s:6.2f} s   "
        f"({workers_s / ours:.1f}x trajflow's time)")
    say("  the three results " + ("agree (within 1e-5)" if equal else
                                   "DISAGREE: please report this, it is a defect"))
    for line in straggler_lines(run.profile.report)[:2]:
        say(f"  {line}")
    say(f"  report: {run.write_report()}")
