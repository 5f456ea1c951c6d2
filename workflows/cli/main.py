"""The `trajflow` command: run, demo, campaign, inspect, resources, bench.

Exit codes: 0 every task DONE and result.h5 complete; 1 a task failed or a
result is missing; 2 bad input (nothing was started or written); 130 Ctrl-C.
"""
import radical.utils  # noqa: F401  radical before logging, or fork() may deadlock (its own warning)
import argparse
import dataclasses
import json
import logging
import os
import sys
import time

from trajflow.tasks.analyses import ANALYSES
from trajflow.tasks.mda_analyses import parallelisable_classes
from trajflow.tasks.rundir import has_plan, REPORT
from trajflow.workflows.bench.small import format_table, run_bench, run_bench_large
from trajflow.workflows.campaign.folders import is_campaign_dir
from trajflow.workflows.campaign.run import Campaign
from trajflow.workflows.campaign.table import experiment_rows, summary_lines, write_table
from trajflow.workflows.cli.options import add_spec_options, flags_said, spec_from_args
from trajflow.workflows.datasets import adk_concatenated
from trajflow.workflows.errors import (EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK,
                                       InputError, Interrupted, RunFailed)
from trajflow.workflows.profile.inspection import inspect_runs, summary_text, write_csv, write_json
from trajflow.workflows.profile.report_html import write_campaign_html, write_html
from trajflow.workflows.profile.trace import write_trace
from trajflow.workflows.remote import client as remote
from trajflow.workflows.remote.client import add_remote_commands, add_remote_options
from trajflow.workflows.run import pilot, progress, resources
from trajflow.workflows.run.pilot import Pilot, plan_of, stop_on_signals
from trajflow.workflows.run.planning import make_plan
from trajflow.workflows.run.spec import command_line, PilotSpec, RunSpec

RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunSpec))
RESUMED_OPTIONS = ("retries", "progress")  # a resumed run's own; the rest are its plan's



def add_run_options(p):
    """Every option of a run and of its pilot (RunSpec, PilotSpec), and --resume."""
    add_spec_options(p, RunSpec)
    add_spec_options(p, PilotSpec)
    p.add_argument("--resume", metavar="RUNDIR", default=None,
                   help="instead of a new run: re-run only the blocks an interrupted run is "
                        "missing; refused if its inputs changed (default: a new run)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="trajflow",
        description="Parallel MD trajectory analysis (split -> analyze -> reduce) on RADICAL-EnTK.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a trajectory on a pilot",
                         description="Analyse a trajectory on a RADICAL pilot; writes RUNDIR/result.h5.")
    add_run_options(run)
    add_remote_options(run)
    demo = sub.add_parser("demo", help="the main job on its default: AdK x100, rmsd and dihedrals",
                          description="Build AdK (MDAnalysisTests PSF/DCD) concatenated 100x "
                                      "(9,800 frames) once in a cache folder, then run rmsd and "
                                      "dihedrals on one local pilot with 2 MPI ranks.")
    demo.add_argument("--out", default=None, metavar="DIR",
                      help="folder for the two runs (default: ./trajflow-demo-<time>)")
    demo.add_argument("--copies", type=int, default=100, metavar="K",
                      help="how many times to concatenate AdK's 98 frames (default: 100)")
    add_spec_options(demo, PilotSpec)
    add_spec_options(demo, RunSpec, only=RESUMED_OPTIONS)
    insp = sub.add_parser("inspect", help="phase table, stragglers and advice for finished runs",
                          description="Read RUNDIR(s) alone (plan, per-rank records, RADICAL task "
                                      "profiles) and print a phase table per task and rank, the "
                                      "stragglers with the numbers behind them, and the papers' "
                                      "advice; with several runs of one input, S(N) and E(N).")
    insp.add_argument("rundirs", nargs="*", metavar="RUNDIR",
                      help="one or more trajflow runs, or one campaign folder (then the "
                           "campaign table, and --html compares its resources)")
    insp.add_argument("--table", action="append", default=[], metavar="FILE.csv",
                      help="judge a per-rank timing table of any tool (columns: rank and any of "
                           "group, host, frames, t_open, t_io, t_compute, t_wait, t_comm, "
                           "t_write, t_total; see the README); repeat for several")
    insp.add_argument("--trace", default=None, metavar="FILE.json",
                      help="write the timeline as a Chrome Trace Event file for Perfetto or "
                           "chrome://tracing (default: none)")
    insp.add_argument("--html", default=None, metavar="FILE",
                      help="write a self-contained offline HTML report (default: none)")
    insp.add_argument("--json", default=None, metavar="FILE",
                      help="write every record and flag as JSON (default: none)")
    insp.add_argument("--csv", default=None, metavar="FILE",
                      help="write every record and flag as CSV (default: none)")
    camp = sub.add_parser("campaign", help="run the experiments of a campaign file on one or "
                                           "more resources, concurrently",
                          description="Expand a campaign file (TOML: input, analysis, resources, "
                                      "factors with levels) into experiments and run them: one "
                                      "pilot per resource, the resources side by side, every "
                                      "experiment in its own RUNDIR under CAMPAIGN_DIR/runs/, "
                                      "the table in CAMPAIGN_DIR/campaign.csv.")
    camp.add_argument("file", metavar="FILE.toml", help="the campaign file (see the README)")
    camp.add_argument("--out", default=None, metavar="CAMPAIGN_DIR",
                      help="the campaign's folder (default: ./<campaign name>)")
    camp.add_argument("--dry-run", action="store_true",
                      help="print the experiments and each resource's pilot; submit and write "
                           "nothing")
    camp.add_argument("--resume", action="store_true",
                      help="keep the experiments of CAMPAIGN_DIR that completed, run the rest")
    camp.add_argument("--only-resource", default=None, metavar="LABEL",
                      help="run only this resource's experiments, on this machine even where "
                           "the file says remote (how a remote resource's campaign runs there)")
    res = sub.add_parser("resources", help="list the resources trajflow can use, or show one",
                         description="List every RADICAL-Pilot resource label (RADICAL's own, "
                                     "trajflow's shipped configs, your ~/.radical), or show the "
                                     "merged config RADICAL-Pilot will use for one.")
    res.add_argument("show", nargs="?", metavar="LABEL", default=None,
                     help="show this resource's merged config as JSON (default: list all)")
    res.add_argument("--all", action="store_true",
                     help="list every RADICAL-Pilot label, not only the ones trajflow or you "
                          "configured")
    sub.add_parser("analyses", help="list the installed MDAnalysis analyses --analysis "
                                    "FILE.py:NAME can run (those that declare themselves "
                                    "parallelisable)",
                   description="List the analysis classes of the installed MDAnalysis that "
                               "declare themselves parallelisable, with their modules.")
    bench = sub.add_parser("bench", help="our kernels and readers against MDAnalysis, the papers' "
                                         "loops and mdtraj, side by side",
                           description="Measure, in one run on AdK concatenated K times (DCD, XTC "
                                       "and H5MD, built once in the cache), microseconds per frame "
                                       "and the ratios the targets are stated in.")
    bench.add_argument("--copies", type=int, default=100, metavar="K",
                       help="how many times to concatenate AdK's 98 frames (default: 100)")
    bench.add_argument("--repeats", type=int, default=3, metavar="R",
                       help="best of R runs for our code (default: 3)")
    bench.add_argument("--loop-frames", type=int, default=200, metavar="F",
                       help="frames timed for the slow per-frame baselines (default: 200)")
    bench.add_argument("--no-parallel", action="store_true",
                       help="skip the analyze stage under mpiexec -n 1 and -n 2, best of 5 launches "
                            "each (default: run it)")
    bench.add_argument("--no-entk", action="store_true",
                       help="skip the one-block EnTK run on a local pilot and two runs on one "
                            "kept pilot, ~45 s (default: run it)")
    bench.add_argument("--user-copies", type=int, default=20, metavar="K",
                       help="your-own-analysis row: InterRDF (water O-O) on the solvated AdK "
                            "(GRO/XTC, 10 frames) repeated K times, trajflow's 2 ranks against "
                            "MDAnalysis' 2-worker run; 0 skips it (default: 20)")
    bench.add_argument("--startup-launches", type=int, default=5, metavar="N",
                       help="launches of a task, warm and with empty caches, to time its "
                            "start-up and exit (default: 5)")
    bench.add_argument("--scale", choices=("small", "large"), default="small",
                       help="small: the AdK rows above; large: the solvated AdK (47,681 atoms) "
                            "repeated to --large-gb GB of XTC, also as DCD and H5MD (~3.5x each), "
                            "built once in the cache, trajflow 1 and 2 ranks against MDAnalysis "
                            "serial and 2 workers per format, the analyze stage in a kept pilot "
                            "against plain mpiexec, and a task's start-up (default: small)")
    bench.add_argument("--large-gb", type=float, default=2.0, metavar="GB",
                       help="--scale large: the XTC's size in GB (default: 2; the three files "
                            "take ~8x that on disk)")
    bench.add_argument("--launches", type=int, default=3, metavar="N",
                       help="--scale large: launches of each of our stages, best (pilot against "
                            "mpiexec: median) of N (default: 3)")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the numbers as JSON")
    add_remote_commands(sub)  # status, follow, fetch, cancel: remote runs
    return parser


def _run_and_report(plans, spec, pilot_spec, path, resume=False):
    """Run the plans on one pilot (the API's Pilot), each run's summary and HTML
    report written as soon as it has ended (while the pilot is shut down), then
    printed; the exit code."""
    import concurrent.futures
    t0 = time.time()
    runs, futures = {}, {}

    def finished(future):
        try:
            runs[future] = future.result()
        except RunFailed as exc:
            runs[future] = exc.run
    try:
        cpus = pilot_spec.cpus or max(pilot_spec.cores_for(plan) for plan in plans)
        own = dataclasses.replace(pilot_spec, cpus=cpus, path=path)
        with Pilot(progress=spec.progress, **dataclasses.asdict(own)) as pilot:
            futures = {pilot.submit_plan(plan, spec, resume=resume): plan for plan in plans}
            pilot.close(wait=False)  # no more runs: the pilot ends with the last one
            for future in concurrent.futures.as_completed(futures):
                finished(future)
    except Interrupted:  # the exit code must say what is on disk: complete results are done
        if not futures or not all(f.done() and not f.cancelled() and f.exception() is None
                                  for f in futures):
            raise
        print("trajflow: interrupted after every run had completed; the results are whole",
              file=sys.stderr)
        for future in futures:
            if future not in runs:
                finished(future)
    # summarised once the pilot has ended: its profile (the pilot's start and end) is kept
    summaries = {future: _summarise(runs[future]) for future in futures}
    failed = False
    for future, plan in futures.items():
        run = runs[future]
        outcome = run.outcome or {}
        for text in outcome.get("retried_tasks", []):
            print("retried (failed, then run again): " + text.splitlines()[0], file=sys.stderr)
        for text in outcome.get("failed_tasks", []):
            print(text, file=sys.stderr)
        name = future.request.name
        if outcome.get("error"):
            print(f"{name}: {outcome['error']}", file=sys.stderr)
        if outcome.get("stopped_at"):
            print(f"{name}: stopped after the {outcome['stopped_at']} stage failed; later stages "
                  "did not run", file=sys.stderr)
        failed |= not run.ok
        print(summaries[future])
    print(f"RADICAL session: {pilot.session_dir}   wall time: {time.time() - t0:.1f} s")
    return EXIT_FAILED if failed else EXIT_OK


def _summarise(run):
    """A finished run's summary (Run.summary) and its HTML report beside the result."""
    try:
        html_path = run.profile.to_html(run.plan.path(REPORT),
                                        f"trajflow run {run.path}")
        return (run.summary() + f"\n  timeline and phases: {html_path}  (trajflow inspect "
                f"{run.path} for the table)")
    except Exception as exc:  # the report must never hide the result
        return f"{run.path}: (no profile summary: {exc})"


def specs_from_args(args):
    """(RunSpec, PilotSpec) of the flags given; InputError for a bad value."""
    return spec_from_args(RunSpec, args), spec_from_args(PilotSpec, args)


def plan_from_args(args):
    """The run `trajflow run` asks for, planned (InputError for bad input, nothing written),
    with its specs: (plan, RunSpec, PilotSpec)."""
    spec, pilot_spec = specs_from_args(args)
    if args.resume:
        given = flags_said(args, RunSpec, [f for f in RUN_FIELDS if f not in RESUMED_OPTIONS])
        if given:
            raise InputError(f"--resume takes the run's options from its plan: drop "
                             f"{', '.join(given)}")
    return plan_of(spec, pilot_spec, args.resume), spec, pilot_spec


def run_planned(plan, spec, pilot_spec, resume=False):
    return _run_and_report([plan], spec, pilot_spec, plan.workdir, resume=resume)


def cmd_run(args):
    if args.remote_batch and not args.remote:
        raise InputError("--remote-batch needs --remote HOST: it submits the run's client as a "
                         "batch job there (here, run trajflow inside your own job with "
                         "--access-schema batch)")
    if args.remote:
        return remote.cmd_run_remote(args, *specs_from_args(args))
    return run_planned(*plan_from_args(args), resume=bool(args.resume))


def cmd_demo(args):
    spec, pilot_spec = specs_from_args(args)
    out = os.path.abspath(args.out or f"trajflow-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    ranks = pilot_spec.blocks_for(spec)
    print(f"building the demo trajectory (AdK x{args.copies}) in the cache, once ...")
    top, traj = adk_concatenated(args.copies, "DCD")
    print(f"  {traj}")
    plans = [make_plan(dataclasses.replace(spec, topology=top, trajectory=[traj], analysis=name,
                                           out=os.path.join(out, name), blocks=ranks), ranks)
             for name in ANALYSES]
    print(f"running {' and '.join(ANALYSES)} on {pilot_spec.resource} with {ranks} MPI "
          "ranks ...")
    return _run_and_report(plans, spec, pilot_spec, out)


def cmd_campaign(args):
    campaign = Campaign.load(args.file)
    if args.only_resource:
        if args.only_resource not in campaign.resources:
            raise InputError(f"--only-resource {args.only_resource!r}: the file's resources are "
                             f"{', '.join(campaign.resources)}")
        campaign = campaign.only(args.only_resource)
    if args.dry_run:
        print(campaign.dry_run(args.out, args.resume)["text"])
        print("\n--dry-run: nothing submitted, no campaign folder written")
        return EXIT_OK
    try:
        result = campaign.run(args.out, args.resume)
    except Interrupted as exc:
        print(exc.result.summary())
        print(f"trajflow: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(result.summary())
    print(f"campaign table: {result.table_path}\n(trajflow inspect {result.path} --html FILE "
          "compares the resources)")
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_resources(args):
    if args.show:
        try:
            resources.check_resource(args.show)
        except ValueError as exc:
            raise InputError(str(exc))
        sources = resources.resource_sources().get(args.show, [])
        print(f"# {args.show}: from {' + '.join(sources) or 'RADICAL-Pilot'} "
              "(later ones merged over earlier ones)")
        print(json.dumps(resources.merged_config(args.show), indent=2, sort_keys=True))
        return EXIT_OK
    sources = resources.resource_sources()
    shown = sorted(l for l, s in sources.items() if args.all or s != ["radical"])
    print(f"{'resource':32s} config from")
    for label in shown:
        print(f"{label:32s} {' + '.join(sources[label])}")
    if not args.all:
        print(f"({len(sources) - len(shown)} more of RADICAL-Pilot's own: --all lists them; "
              "`trajflow resources LABEL` shows one)")
    return EXIT_OK


def cmd_inspect(args):
    if not args.rundirs and not args.table:
        raise InputError("nothing to inspect: give one or more RUNDIRs (--out folders of "
                         "trajflow run), a campaign folder, or --table FILE.csv")
    if len(args.rundirs) == 1 and is_campaign_dir(args.rundirs[0]) and not args.table:
        return _inspect_campaign(args)
    for d in args.rundirs:
        if not has_plan(d):
            raise InputError(f"{d!r} is not a trajflow run (no plan.json): give a --out folder of "
                             "trajflow run")
    report = inspect_runs(args.rundirs, args.table)
    print(summary_text(report))
    if args.trace:
        write_trace(report, args.trace)
        print(f"trace (open in https://ui.perfetto.dev or chrome://tracing): {args.trace}")
    if args.html:
        write_html(report, args.html)
        print(f"HTML report: {args.html}")
    if args.json:
        write_json(report, args.json)
        print(f"JSON: {args.json}")
    if args.csv:
        write_csv(report, args.csv)
        print(f"CSV: {args.csv}")
    return EXIT_OK


def _inspect_campaign(args):
    cdir = os.path.abspath(args.rundirs[0])
    rows = experiment_rows(cdir)
    for line in summary_lines(rows):
        print(line)
    if args.html:
        write_campaign_html(rows, cdir, args.html)
        print(f"HTML report: {args.html}")
    if args.csv:
        print(f"CSV: {write_table(rows, args.csv)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1)
        print(f"JSON: {args.json}")
    return EXIT_OK


def cmd_bench(args):
    if min(args.copies, args.repeats, args.loop_frames, args.startup_launches, args.launches) < 1:
        raise InputError("--copies, --repeats, --loop-frames, --startup-launches and --launches "
                         "must be at least 1")
    if not args.large_gb > 0:
        raise InputError(f"--large-gb must be more than 0, got {args.large_gb}")
    if args.scale == "large":
        result = run_bench_large(args.large_gb, args.launches, with_entk=not args.no_entk,
                                 startup_launches=args.startup_launches)
    else:
        result = run_bench(args.copies, args.repeats, args.loop_frames,
                           with_parallel=not args.no_parallel, with_entk=not args.no_entk,
                           user_copies=args.user_copies, startup_launches=args.startup_launches)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
        print(f"numbers written to {args.json}")
    return EXIT_OK


def cmd_analyses(args):
    import MDAnalysis
    classes = parallelisable_classes()
    print(f"MDAnalysis {MDAnalysis.__version__}: {len(classes)} analyses can be split over "
          "blocks (build one in your factory: --analysis FILE.py:NAME)")
    for name, module in classes.items():
        print(f"  {name:28s} {module}")
    return EXIT_OK


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # trajflow's log records (progress, warnings) on stderr; --quiet: warnings only
    progress.show_on(sys.stderr, logging.INFO if getattr(args, "progress", True) else logging.WARNING)
    return run_guarded(_command, args)


def run_guarded(command, args):
    """`command(args)` with trajflow's stop signals and exit codes: 2 for bad input
    (the message on stderr), 130 or 128 + N for an interrupt."""
    try:
        with stop_on_signals(also_sigint=True), command_line():
            return command(args)
    except InputError as exc:
        print(f"trajflow: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("trajflow: interrupted", file=sys.stderr)
        return _interrupted_code()
    except Interrupted as exc:
        print(f"trajflow: {exc}", file=sys.stderr)
        return _interrupted_code()


def _interrupted_code():
    """130 for Ctrl-C; 128 + N for a stop signal N (143 SIGTERM, 129 SIGHUP), as shells do."""
    return 128 + pilot.stopped_by if pilot.stopped_by else EXIT_INTERRUPTED


def _command(args):
    return {"run": cmd_run, "demo": cmd_demo, "bench": cmd_bench, "campaign": cmd_campaign,
            "resources": cmd_resources, "inspect": cmd_inspect, "analyses": cmd_analyses,
            "status": remote.cmd_status, "follow": remote.cmd_follow, "fetch": remote.cmd_fetch,
            "cancel": remote.cmd_cancel}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
