"""`python -m trajflow.workflows.bench.manycore`: the scaling rows and the set-up growth
(scaling.py) on a machine that has MPI, MDAnalysis and trajflow's task code but not
RADICAL's stack (a many-core node lent for minutes: ../shared/manycore/README.md).

It keeps to a deadline: the set-up growth first, then one case at a time, cheapest
first, each skipped (and said so) when the time left is under what it was estimated
to take; the JSON is rewritten after each, so a stop from outside loses one case at most.
"""
import argparse
import json
import logging
import os
import time

from trajflow.workflows.bench import scaling
from trajflow.workflows.bench.large import build_large

# rough seconds a case takes at 1-16 ranks over 3,000 frames, 3 launches, on 16 cores
ESTIMATE_S = {"setup": 40, "xtc_ca": 40, "dcd_ca": 40, "h5md_ca": 40, "xtc_all": 80}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m trajflow.workflows.bench.manycore",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=0.5, help="the large XTC's size (default 0.5)")
    p.add_argument("--ranks", type=int, nargs="+", default=None,
                   help="rank counts (default: 1 2 4 ... up to the cores, and the cores)")
    p.add_argument("--setup-ranks", type=int, nargs="+", default=list(scaling.SETUP_RANKS))
    p.add_argument("--cases", nargs="+", default=["xtc_ca", "dcd_ca", "h5md_ca", "xtc_all"],
                   choices=tuple(scaling.CASES))
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--no-mda", action="store_true", help="leave out MDAnalysis' rows")
    p.add_argument("--budget", type=float, default=420, help="seconds for all of it")
    p.add_argument("--json", required=True, help="where the numbers go (rewritten as they come)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # not every guess of MDAnalysis
    t0 = time.time()
    cores = len(os.sched_getaffinity(0))
    ranks = args.ranks or sorted({2 ** k for k in range(cores.bit_length()) if 2 ** k <= cores}
                                 | {cores})
    say = lambda msg: print(f"[+{time.time() - t0:5.0f}s] {msg}", flush=True)  # noqa: E731
    out = {"cores": cores, "ranks": ranks, "skipped": []}

    def save():
        with open(args.json + ".tmp", "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
        os.replace(args.json + ".tmp", args.json)

    def time_for(what):
        left = args.budget - (time.time() - t0)
        if left < ESTIMATE_S[what]:
            say(f"{what}: skipped, {left:.0f} s left of the budget (needs ~{ESTIMATE_S[what]} s)")
            out["skipped"].append(what)
            save()
            return False
        return True

    if time_for("setup"):
        out["setup"] = scaling.run_setup_growth(args.setup_ranks, args.launches, say=say)
        print("\n".join(scaling.format_setup_growth(out["setup"])), flush=True)
        save()
    files = build_large(args.gb, say)
    out["large"] = {"copies": files["copies"], "bytes": files["bytes"]}
    result = {"frames": {}, "scaling": {}, "ranks": ranks, "launches": args.launches,
              "cores": cores}
    for case in args.cases:
        if not time_for(case):
            continue
        one = scaling.run_scaling(files, ranks, args.launches, (case,), ceiling=True,
                                  with_mda=not args.no_mda, say=say)
        result["frames"].update(one["frames"])
        result["scaling"].update(one["scaling"])
        out["scaling"] = result
        save()
        print("\n".join(scaling.format_scaling(result)), flush=True)
    say("done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
