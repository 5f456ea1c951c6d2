"""`trajflow bench --model`: the analyze stage's efficiency E(N) from 16 to 1,024 ranks on
1 to 32 nodes, static and dynamic schedules, predicted from measured numbers.

A rank's time is the sum of what its record names (tasks/timing.py), each term fed
with a measurement:
  set-up     own part (after the last rank arrived) + its growth per log2 N, from
             `--setup-growth`; the launch's arrival skew (the wait for the last rank),
             except where a dynamic schedule's ranks claim before MPI_Init (one node);
  work       frames x the one-rank time per frame, divided by N and by the node's own
             efficiency at its ranks per node: the ceiling rows (N independent one-rank
             stages at once) of `--scale large --ceiling`;
  claims     dynamic: a claim's round trip where it is not hidden behind a chunk
             (a shared-memory add on one node; MPI_Rget_accumulate to rank 0 across
             nodes), measured by `measure_claims`;
  gather     a latency per log2 N level, from the measured 2-rank gather;
  stragglers the papers' (Khoshlessan et al. 2019, Fig. 2: 11 of 72 ranks ~3x the mean
             beyond one node on a shared file; none on one node, none with split files
             or parallel HDF5): static waits for the slowest rank, dynamic gives it fewer
             chunks and waits one chunk at its pace.
E(N) = T(1) / (N T(N)). Validation: the model's prediction beside every measured row it
was not fitted on.
"""
import json
import math
import statistics
import os
import subprocess
import sys

from trajflow.tasks.schedules import chunks_in_block, RemoteCounter

STRAGGLER_SHARE, STRAGGLER_FACTOR = 11 / 72, 3.0  # Khoshlessan et al. 2019, Fig. 2
MODEL_RANKS = (16, 32, 64, 128, 256, 512, 1024)
PAPER_FRAMES = 2_512_200  # the trajectory of Khoshlessan et al. 2019: what a cluster run reads
# rank 0's progress thread serves every remote claim: MPICH's handling of one
# MPI_Rget_accumulate, an assumption (a claim's round trip is measured; its service
# time at rank 0 cannot be told apart from it with one claimer)
CLAIM_SERVICE_S = 2e-6


def _by_n(table):
    """JSON's string keys back to rank counts."""
    return {int(n): v for n, v in table.items()}


class Inputs:
    """The measured numbers the model uses, from one bench JSON (manycore.json or
    `trajflow bench --json`): its setup growth and one case's scaling rows."""

    def __init__(self, measured, case="xtc_ca", claims=None):
        setup, scaling = measured["setup"], measured["scaling"]
        self.cores = measured["cores"]
        self.case = case
        self.frames = scaling["frames"][case]
        rows = _by_n(scaling["scaling"][case])
        self.after_arrival = _by_n(setup["after_arrival"])
        self.skew = _by_n(setup["arrival_skew"])
        self.setup_1 = self.after_arrival[1]
        # growth of the own set-up per log2 N on the node (oversubscribed rows left out)
        ns = [n for n in self.after_arrival if 1 < n <= self.cores]
        self.setup_per_level = max(0.0, max(
            (self.after_arrival[n] - self.setup_1) / math.log2(n) for n in ns)) if ns else 0.0
        seconds = lambda us: us * self.frames / 1e6  # noqa: E731
        self.work_1 = seconds(rows[1]["ours_us"]) - self.setup_1  # one rank's frames
        self.node_efficiency = {}  # k ranks on one node: the machine's own share each gets
        for k, row in rows.items():
            if row.get("ceiling_us"):
                alone = seconds(row["ceiling_us"]) - self.setup_1
                self.node_efficiency[k] = self.work_1 / (k * alone)
        self.measured = rows
        self.claims = claims or {"shared_s": 2e-7, "remote_s": 2 * RemoteCounter.POKE_S}
        self.gather_level_s = measured.get("gather_level_s", 5e-4)

    def efficiency_on_node(self, k):
        """The node's efficiency at k ranks: measured, interpolated in log2 k, flat past
        the last measured (a node has no more cores)."""
        known = sorted(self.node_efficiency)
        if k in self.node_efficiency:
            return self.node_efficiency[k]
        lo = max([n for n in known if n < k], default=known[0])
        hi = min([n for n in known if n > k], default=known[-1])
        if lo == hi:
            return self.node_efficiency[lo]
        t = (math.log2(k) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        return self.node_efficiency[lo] + t * (self.node_efficiency[hi] - self.node_efficiency[lo])


def model_inputs_check(measured, case="xtc_ca"):
    """Raise (KeyError, TypeError, ValueError) unless `measured` holds what Inputs reads."""
    Inputs(measured, case)


def chunks(frames, ranks):
    """How many chunks a dynamic run cuts `frames` into at N blocks (schedules.Dynamic)."""
    return ranks * chunks_in_block(frames // ranks)


def predict(inputs, ranks, nodes, schedule, frames=None, early_claims=True, shared_file=True,
            parts=False, host_cores=None):
    """Seconds of the analyze stage's slowest rank (its t_total); `parts`: the terms;
    `host_cores`: the nodes are virtual, sharing that many cores of one host."""
    frames = frames or inputs.frames
    per_node = math.ceil(ranks / nodes)
    on_host = min(ranks, host_cores) if host_cores else per_node
    work = inputs.work_1 * frames / inputs.frames / ranks / inputs.efficiency_on_node(on_host)
    if host_cores and ranks > host_cores:  # more ranks than the host has cores
        work *= ranks / host_cores
    setup = inputs.setup_1 + inputs.setup_per_level * math.log2(ranks)
    # the launch's skew as measured on one node at this many ranks (across nodes: all of
    # them, at most the node's cores: a launch across nodes is not measured faster)
    skew = inputs.skew.get(min(ranks if nodes > 1 else per_node, inputs.cores),
                           max(inputs.skew.values()))
    hides_skew = schedule == "dynamic" and nodes == 1 and early_claims
    wait_for_launch = 0.0 if hides_skew else skew
    gather = inputs.gather_level_s * math.ceil(math.log2(ranks)) if ranks > 1 else 0.0
    stragglers = STRAGGLER_SHARE if (nodes > 1 and shared_file) else 0.0
    claims = rank0_load = 0.0
    if schedule == "static":
        p_any = 1 - (1 - stragglers) ** ranks
        work *= 1 + (STRAGGLER_FACTOR - 1) * p_any
    else:
        n_chunks = chunks(frames, ranks)
        per_chunk = work * ranks / n_chunks
        speed = (1 - stragglers) + stragglers / STRAGGLER_FACTOR  # of a rank's, on average
        work = work / speed + (STRAGGLER_FACTOR * per_chunk if stragglers else per_chunk)
        claim = inputs.claims["remote_s" if nodes > 1 else "shared_s"]
        # a claim is made while the last chunk runs: only what a chunk does not hide waits
        claims = (n_chunks / ranks) * max(0.0, claim - per_chunk)
        if nodes > 1:  # rank 0's progress thread serves every claim of the run
            rank0_load = n_chunks * CLAIM_SERVICE_S / (work + claims)
            claims += max(0.0, n_chunks * CLAIM_SERVICE_S - work)  # it cannot keep up
    total = setup + wait_for_launch + work + claims + gather
    if parts:
        return {"total": total, "setup": setup, "wait_for_launch": wait_for_launch,
                "work": work, "claims": claims, "gather": gather, "rank0_claim_load": rank0_load}
    return total


def nodes_for(ranks, cores):
    return max(1, math.ceil(ranks / cores))


def run_model(inputs, ranks=MODEL_RANKS, most_nodes=32, frames=PAPER_FRAMES, cores_per_node=None):
    """{"efficiency": {schedule: {N: E}}, "nodes": {N: nodes}, "terms": {N: {...}},
    "validation": [...]}: E(N) over `frames` frames at the measured costs per frame,
    N spread over the fewest nodes of `inputs.cores` cores that hold it (at most
    `most_nodes`), and the prediction beside each measured row not fitted on (their own
    frames; MPI_Init first, as they were measured)."""
    cores = cores_per_node or max(inputs.cores, math.ceil(max(ranks) / most_nodes))
    out = {"case": inputs.case, "frames": frames, "cores_per_node": cores,
           "measured_cores": inputs.cores, "efficiency": {}, "nodes": {}, "terms": {},
           "validation": []}
    for schedule in ("static", "dynamic"):
        t1 = predict(inputs, 1, 1, schedule, frames)
        out["efficiency"][schedule] = {}
        for n in ranks:
            k = min(most_nodes, nodes_for(n, cores))
            out["nodes"][n] = k
            out["efficiency"][schedule][n] = t1 / (n * predict(inputs, n, k, schedule, frames))
            if schedule == "dynamic":
                out["terms"][n] = predict(inputs, n, k, schedule, frames, parts=True)
    for n, row in sorted(inputs.measured.items()):
        if n == 1:
            continue  # fitted on
        measured = row["ours_us"] * inputs.frames / 1e6
        predicted = predict(inputs, n, 1, "dynamic",  # as the row was measured
                            early_claims=row.get("claims_before_mpi_init", False))
        out["validation"].append({"nodes": 1, "ranks": n, "measured_s": measured,
                                  "predicted_s": predicted, "error": predicted / measured - 1})
    return out


def bottlenecks(model):
    """Where a term the ranks share bites: the first N whose claims or gather exceed a
    tenth of its work, or rank 0's progress thread is busier than half a core."""
    notes = []
    for term, test in (("claims", lambda t: t["claims"] > 0.1 * t["work"]),
                       ("gather", lambda t: t["gather"] > 0.1 * t["work"]),
                       ("rank 0's claim thread", lambda t: t["rank0_claim_load"] > 0.5),
                       ("set-up", lambda t: t["setup"] + t["wait_for_launch"] > 0.1 * t["work"])):
        bites = [n for n, t in sorted(model["terms"].items()) if test(t)]
        notes.append((term, bites[0] if bites else None))
    return notes


def format_model(model):
    lines = [f"\nmodel: E(N) of the analyze stage, {model['case']} over {model['frames']:,} frames "
             f"at the measured costs, {model['cores_per_node']} cores a node (N over the fewest "
             "nodes that hold it); the dynamic schedule's terms, seconds",
             f"  {'N':>5s} {'nodes':>5s} {'static':>7s} {'dynamic':>8s} {'set-up':>7s} "
             f"{'launch':>7s} {'work':>8s} {'claims':>7s} {'gather':>7s} {'rank 0':>7s}"]
    for n in sorted(model["efficiency"]["static"]):
        t = model["terms"][n]
        lines.append(f"  {n:5d} {model['nodes'][n]:5d} {model['efficiency']['static'][n]:7.3f} "
                     f"{model['efficiency']['dynamic'][n]:8.3f} {t['setup']:7.3f} "
                     f"{t['wait_for_launch']:7.3f} {t['work']:8.3f} {t['claims']:7.3f} "
                     f"{t['gather']:7.3f} {t['rank0_claim_load']:7.0%}")
    if model["cores_per_node"] > model["measured_cores"]:
        lines.append(f"  a node's efficiency beyond {model['measured_cores']} ranks is that at "
                     f"{model['measured_cores']} (measured no further)")
    for term, n in bottlenecks(model):
        lines.append(f"  {term}: " + (f"bites from N = {n}" if n else "does not bite to N = "
                                      f"{max(model['terms'])}"))
    if model["validation"]:
        errors = [abs(v["error"]) for v in model["validation"]]
        lines.append("  validation (measured rows not fitted on): " + "; ".join(
            f"{v['nodes']} node(s) x {v['ranks']} ranks {v['measured_s']:.3f} s measured, "
            f"{v['predicted_s']:.3f} s predicted" for v in model["validation"]))
        lines.append(f"  prediction error: median {statistics.median(errors):.0%}, "
                     f"most {max(errors):.0%}")
    return lines


CLAIMS_SCRIPT = r"""
import json, sys, time
import numpy as np
from mpi4py import MPI
from trajflow.tasks.schedules import RemoteCounter, SharedMemoryCounter
comm = MPI.COMM_WORLD
K, out = 400, {}
for name, make in (("shared_s", lambda: SharedMemoryCounter(comm)),
                   ("remote_s", lambda: RemoteCounter(comm, 60))):
    counter = make()
    comm.Barrier()
    if comm.rank == 1:  # claims one after another; rank 0 computes meanwhile, as in a run
        t0 = time.perf_counter()
        for _ in range(K):
            counter.claim().wait()
        out[name] = (time.perf_counter() - t0) / K
    else:
        a = np.random.rand(256, 256)
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            a = a @ a
            a /= np.abs(a).max()
    comm.Barrier()
    counter.close()
if comm.rank == 1:
    print(json.dumps(out))
"""


def measure_claims(timeout=120):
    """{"shared_s", "remote_s"}: one claim's round trip, a shared-memory add and an
    MPI_Rget_accumulate on rank 0 while rank 0 computes (2 ranks, mpiexec)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", CLAIMS_SCRIPT],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"the claims' measurement failed: {proc.stderr[-1000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_here(case="xtc_ca", gb=0.2, launches=3, say=print):
    """The model's inputs measured on this machine, in the layout of manycore.json: the
    set-up growth up to the cores and the case's scaling rows with the ceiling."""
    from trajflow.workflows.bench import scaling
    from trajflow.workflows.bench.large import build_large
    cores = len(os.sched_getaffinity(0))
    ranks = scaling.default_ranks(cores)
    setup = scaling.run_setup_growth(ranks, launches, say=say)
    rows = scaling.run_scaling(build_large(gb, say), ranks, launches, (case,), ceiling=True,
                               with_mda=False, say=say)
    return {"cores": cores, "setup": setup, "scaling": rows}


def run_model_bench(measured=None, case="xtc_ca", gb=0.2, launches=3, validate_on=None,
                    widths=(2, 4), say=print):
    """The model from `measured` (a manycore.json's numbers) or from numbers measured here
    now, with this machine's claim costs; `validate_on`: also run the case on `widths`
    nodes of that SLURM resource and put the prediction beside each."""
    say("  the claims' round trips ...")
    claims = measure_claims()
    data = measured if measured is not None else measure_here(case, gb, launches, say)
    model = run_model(Inputs(data, case, claims))
    model["claims"] = claims
    if validate_on:
        here = data if measured is None else measure_here(case, gb, launches, say)
        model["validation"] += validate_on_resource(validate_on, widths, here, case, gb, say=say)
    return model


def validate_on_resource(resource, widths, measured, case_name="xtc_all", gb=0.5,
                         folder=None, say=print):
    """[{"nodes", "ranks", "measured_s", "predicted_s", "error"}]: the case's analyze stage
    on `widths` nodes of a SLURM resource (a rank on each of their cores), one pilot for
    all, beside the model's prediction from `measured` (this machine's numbers). The
    virtual cluster's nodes share this machine's cores and disk: the prediction is told
    so (less what the pilot's own processes used of them meanwhile, sampled), and the
    papers' shared-file stragglers are left out."""
    import tempfile
    import trajflow
    from trajflow.workflows.bench import scaling
    from trajflow.workflows.bench.large import build_large, CpuSampler
    from trajflow.workflows.bench.width import cores_per_node
    from trajflow.workflows.run.resources import resolve_resource
    cores = cores_per_node(resolve_resource(resource))
    case = scaling.CASES[case_name]
    files = build_large(gb, say)
    inputs = Inputs(measured, case_name, measure_claims())
    host = len(os.sched_getaffinity(0))
    folder = folder or tempfile.mkdtemp(prefix="trajflow-bench-model-")
    rows = []
    with trajflow.Pilot(resource, cpus=cores * max(widths), walltime=20, progress=False,
                        path=os.path.join(folder, "pilot")) as pilot:
        for n in widths:
            say(f"  {case_name} on {n} node(s) of {resource} ...")
            with CpuSampler() as cpu:
                run = pilot.run(files["top"], files[case.fmt], "rmsd", select=case.select,
                                stop=case.frames(files), io="shared", mode="mpi",
                                schedule="dynamic", blocks=cores * n,
                                out=os.path.join(folder, f"n{n}"))
            if not run.ok:
                raise RuntimeError(f"the {n}-node run failed: {run.path}")
            ranks = [r for r in run.profile.records if r["task"] == "analyze"]
            nodes = len({r["host"] for r in ranks})
            measured_s = max(r["t_total"] for r in ranks)
            # what RADICAL's agent, client and EnTK used of the host's cores meanwhile
            others = cpu.cores_besides(min(r["t_start"] for r in ranks),
                                       max(r["t_stop"] for r in ranks), "trajflow.tasks.analyze")
            left = max(0.5, host - (others if others == others else 0.0))
            predicted = predict(inputs, len(ranks), nodes, "dynamic", case.frames(files),
                                shared_file=False, host_cores=left)
            rows.append({"nodes": nodes, "ranks": len(ranks), "measured_s": measured_s,
                         "predicted_s": predicted, "error": predicted / measured_s - 1,
                         "host_cores_left": left})
    return rows
