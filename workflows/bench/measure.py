"""What the benchmarks share: a stage's time under plain mpiexec, its ranks' records,
and MDAnalysis run in a Python of its own."""
import json
import os
import signal
import subprocess
import sys

import numpy as np

from trajflow.tasks.stages import stage_specs
from trajflow.workflows.run.pipeline import task_environment


def analyze_records(plan):
    """The analyze ranks' (blocks') profile records of the run's last launch."""
    records = []
    for b in range(plan.n_blocks):
        with open(plan.profile_path(f"analyze.block_{b:05d}")) as fh:
            records.append(json.loads(fh.readline()))
    return records


def slowest_analyze_rank_s(plan):
    """The analyze stage's slowest rank's t_total, from its profile records."""
    return max(r["t_total"] for r in analyze_records(plan))


def mpiexec_stage_s(plan, plan_path, launches, cpus=None):
    """The analyze stage of a written MPI plan under plain `mpiexec -n N`, `launches`
    times: the slowest rank's t_total of each launch. `cpus`: mpiexec and its ranks
    pinned there."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    spec = stage_specs(plan, plan_path)["analyze"][0]
    pin = (lambda: os.sched_setaffinity(0, set(cpus))) if cpus else None
    times = []
    for _ in range(launches):
        subprocess.run([mpiexec, "-n", str(plan.n_blocks)] + spec.argv(sys.executable), check=True,
                       env={**os.environ, **task_environment()}, preexec_fn=pin)
        times.append(slowest_analyze_rank_s(plan))
    return times


MDA_TIMED = """
import json, sys, time, warnings
import numpy as np
warnings.simplefilter("ignore")
import MDAnalysis as mda
{imports}
top, path, n_workers, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
run_kw = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {{}}  # run()'s, and the analysis'
u = mda.Universe(top, path)
{setup}
t0 = time.perf_counter()
r = {analysis}
if n_workers == 1:
    r.run(**run_kw)
else:
    r.run(backend="multiprocessing", n_workers=n_workers, **run_kw)
seconds = time.perf_counter() - t0
np.save(out, r.results.{result})
print(json.dumps(seconds))
"""


def mda_timed_script(imports, analysis, result, setup=""):
    """A script for run_isolated: MDAnalysis' `analysis` (an expression of the Universe
    `u`) run serially or with N workers, its time printed and `results.<result>` saved:
    ARGS topology trajectory N out.npy [JSON of run()'s keywords, `run_kw` to the analysis
    expression, which may take its own from it]."""
    return MDA_TIMED.format(imports=imports, setup=setup, analysis=analysis, result=result)


MDA_RMSD = mda_timed_script("from MDAnalysis.analysis import rms", 'rms.RMSD(u, select="name CA")',
                            "rmsd")


def mda_rmsd(top, path, n_workers, workdir, timeout=3600):
    """(seconds, rmsd) of MDAnalysis' RMSD of CA over the file, serial or multiprocessing,
    timed inside a Python of its own (see run_isolated)."""
    out = os.path.join(workdir, f"mda_{n_workers}.npy")
    seconds = run_isolated(MDA_RMSD, top, path, str(n_workers), out, timeout=timeout)
    return seconds, np.load(out)


def run_isolated(script, *args, timeout=3600):
    """The last JSON line `python -c script args` prints, run as a user runs MDAnalysis:
    a Python of its own, in a session of its own, killed with its pool if it hangs.
    (MDAnalysis' 2-worker pool forked from the trajflow process, which holds
    radical.utils' fork hooks and threads, hung for good twice in CI: a worker blocked
    on the pool's queue lock outlived the pool's SIGTERM.)"""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its pool's workers with it
        proc.communicate()
        raise RuntimeError(f"MDAnalysis ({' '.join(args[:3])}) did not end within {timeout} s; "
                           "stopped")
    if proc.returncode != 0:
        raise RuntimeError(f"MDAnalysis ({' '.join(args[:3])}) failed: {stderr[-1000:]}")
    return json.loads(stdout.strip().splitlines()[-1])
