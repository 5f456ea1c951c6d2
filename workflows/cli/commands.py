"""The `trajflow` commands: each parses nothing and prints what its library call gives.
Each imports what only it uses when it runs (`trajflow run --pilot` is a second's
command: the bench, campaign, profile and remote modules were 0.15-0.2 s of it)."""
import dataclasses
import json
import os
import shlex
import sys
import time

from trajflow.tasks.mda_analyses import parallelisable_classes
from trajflow.tasks.rundir import has_plan
from trajflow.workflows.cli.options import flags_said, RESUMED_OPTIONS, RUN_FIELDS, spec_from_args
from trajflow.workflows.errors import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK,
                                       InputError, Interrupted, RunFailed)
from trajflow.workflows.run import held_client, resources
from trajflow.workflows.run.api import plan_of
from trajflow.workflows.run.pilot import Pilot
from trajflow.workflows.run.planning import own_pilot
from trajflow.workflows.run.runs import find_runs
from trajflow.workflows.run.spec import PilotSpec, RemoteSpec, RunSpec


def _run_and_report(plans, spec, pilot_spec, path, resume=False, held=None, asked_at=None):
    """Run the plans on one pilot (the API's Pilot, or the held pilot named `held`),
    each run's summary and HTML report written as soon as it has ended (while the
    pilot is shut down), then printed; the exit code. No plans, a held pilot: `spec`'s
    run, planned there (HeldPilot.submit_spec), asked for at `asked_at`."""
    import concurrent.futures
    t0 = time.time()
    runs, futures, errors = {}, {}, {}

    def finished(future):
        try:
            runs[future] = future.result()
        except RunFailed as exc:
            runs[future] = exc.run
            errors[future] = str(exc)  # said below if outcome.json could not say it
    try:
        if held:
            chosen = held_client.HeldPilot(held, progress=spec.progress)
        else:
            own = own_pilot(plans, pilot_spec, path)
            chosen = Pilot(progress=spec.progress, **dataclasses.asdict(own))
        with chosen as pilot:
            futures = ([pilot.submit_plan(plan, spec, resume=resume) for plan in plans]
                       or [pilot.submit_spec(spec, asked_at)])
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
    summaries = {future: _summarise(runs[future], getattr(future, "report", None),
                                    getattr(future, "report_due", None))
                 for future in futures}
    failed = False
    for future in futures:
        run = runs[future]
        outcome = run.outcome or {}
        for text in outcome.get("retried_tasks", []):
            print("retried (failed, then run again): " + text.splitlines()[0], file=sys.stderr)
        for text in outcome.get("failed_tasks", []):
            print(text, file=sys.stderr)
        name = future.name
        if outcome.get("error"):
            print(f"{name}: {outcome['error']}", file=sys.stderr)
        elif future in errors:
            print(errors[future], file=sys.stderr)  # "run NAME failed: ..."
        if outcome.get("stopped_at"):
            print(f"{name}: stopped after the {outcome['stopped_at']} stage failed; later stages "
                  "did not run", file=sys.stderr)
        failed |= not run.ok
        print(summaries[future])
    print(f"RADICAL session: {pilot.session_dir}   wall time: {time.time() - t0:.1f} s")
    return EXIT_FAILED if failed else EXIT_OK


def _summarise(run, html_path=None, due=None):
    """A finished run's summary (Run.summary) and its HTML report beside the result
    (written here unless `html_path` says where it was written already, or `due` where a
    held pilot draws it after the result)."""
    try:
        said = html_path or (f"{due} (the held pilot draws it after the result)" if due
                             else run.write_report())
        return (run.summary() + f"\n  timeline and phases: {said}  (trajflow inspect "
                f"{shlex.quote(run.path)} for the table)")
    except Exception as exc:  # the report must never hide the result
        return f"{run.path}: (no profile summary: {exc})"


def specs_from_args(args):
    """(RunSpec, PilotSpec) of the flags given; InputError for a bad value."""
    return spec_from_args(RunSpec, args), spec_from_args(PilotSpec, args)


def plan_from_args(args, held_cpus=None):
    """The run `trajflow run` asks for, planned (InputError for bad input, nothing written),
    with its specs: (plan, RunSpec, PilotSpec); `held_cpus`: a held pilot's cores, which
    are all it needs (no PilotSpec is made of the flags then: checking a resource costs
    RADICAL-Pilot's import and its configs, ~0.2 s of a held run's client)."""
    spec = spec_from_args(RunSpec, args)
    pilot_spec = None if held_cpus is not None else spec_from_args(PilotSpec, args)
    if args.resume:
        given = flags_said(args, RunSpec, [f for f in RUN_FIELDS if f not in RESUMED_OPTIONS])
        if given:
            raise InputError(f"--resume takes the run's options from its plan: drop "
                             f"{', '.join(given)}")
    return plan_of(spec, pilot_spec, args.resume, cpus=held_cpus), spec, pilot_spec


def run_planned(plan, spec, pilot_spec, resume=False):
    return _run_and_report([plan], spec, pilot_spec, plan.workdir, resume=resume)


def run_planned_on_held(plan, spec, held, resume=False):
    return _run_and_report([plan], spec, None, plan.workdir, resume=resume, held=held)


def _remote_client():
    """trajflow.workflows.remote.client, imported by the commands that go to a cluster
    only (0.15 s of every other command)."""
    from trajflow.workflows.remote import client
    return client


def cmd_run(args):
    where = spec_from_args(RemoteSpec, args)
    if args.pilot:
        return _run_on_held(args, where)
    if where.remote:
        return _remote_client().cmd_run_remote(where, args.resume, *specs_from_args(args))
    return run_planned(*plan_from_args(args), resume=bool(args.resume))


def _run_on_held(args, where):
    """`trajflow run --pilot NAME`: planned here for the held pilot's cores, run there
    (with --remote: planned and run on the cluster, where the pilot is held)."""
    given = flags_said(args, PilotSpec)
    if given:
        raise InputError(f"{', '.join(given)}: options of a pilot, and --pilot {args.pilot} "
                         "is held with its own: drop them (or leave out --pilot)")
    if where.remote:
        if where.remote_batch:
            raise InputError(f"--remote-batch with --pilot {args.pilot}: the held pilot's "
                             "allocation is its own; leave out one of them")
        return _remote_client().cmd_run_remote(where, args.resume, spec_from_args(RunSpec, args), PilotSpec(),
                                     held=args.pilot)
    asked_at = time.time()
    status = held_client.held_status(args.pilot)
    spec = spec_from_args(RunSpec, args)
    if not args.resume and held_client.can_plan_there(spec, status):  # no MDAnalysis here
        return _run_and_report([], spec, None, None, held=args.pilot, asked_at=asked_at)
    plan, spec, _ = plan_from_args(args, held_cpus=status["cpus"])
    return run_planned_on_held(plan, spec, args.pilot, resume=bool(args.resume))


# a `trajflow pilot` command's own arguments and PilotSpec's fields: what --remote sends
PILOT_REQUEST_KEYS = frozenset(("pilot_command", "name", "idle_timeout",
                                *(f.name for f in dataclasses.fields(PilotSpec))))


def cmd_pilot(args):
    """`trajflow pilot start|status|stop|list` (with --remote: on that cluster)."""
    where = spec_from_args(RemoteSpec, args)
    if where.remote:
        return _remote_client().cmd_pilot_remote(where, pilot_request(args))
    try:
        return _pilot_command(args)
    except RuntimeError as exc:  # the pilot did not start, or its holder did not stop
        print(f"trajflow: {exc}", file=sys.stderr)
        return EXIT_FAILED


def pilot_request(args):
    """A `trajflow pilot` command's own arguments, as the cluster's side takes them."""
    return {k: v for k, v in vars(args).items() if k in PILOT_REQUEST_KEYS}


def _pilot_command(args):
    if args.pilot_command == "start":
        pilot_spec = spec_from_args(PilotSpec, args)
        held_client.start_held(args.name, pilot_spec, args.idle_timeout)
        return EXIT_OK
    if args.pilot_command == "stop":
        status = held_client.stop_held(args.name)
        print(f"pilot {args.name} stopped ({status['running']} run(s) were running, "
              f"{status['queued']} queued)")
        return EXIT_OK
    held = ([held_client.held_status(args.name)] if getattr(args, "name", None)
            else held_client.list_held())
    if not held:
        print("no held pilot (trajflow pilot start --name NAME holds one)")
        return EXIT_OK
    for status in held:
        print(_held_line(status))
    return EXIT_OK


def _held_line(status):
    if status.get("state") != "active" or "running" not in status:
        return f"{status['name']}: {status['state']} ({status['resource']}, {status['cpus']} cores)"
    left_min = max(0.0, status["walltime_left_s"] / 60)
    idle = f", idle {status['idle_s'] / 60:.1f} min of {status['idle_timeout_s'] / 60:g}" \
        if status["idle_timeout_s"] else ", no idle limit"
    return (f"{status['name']}: active on {status['resource']}, {status['busy_cores']} of "
            f"{status['cpus']} cores busy, {status['running']} run(s) running, "
            f"{status['queued']} queued, {left_min:.1f} min of walltime left{idle}; "
            f"session {status['session_dir']}")


def cmd_demo(args):
    from trajflow.workflows.demo import run_demo
    spec, pilot_spec = specs_from_args(args)
    out = os.path.abspath(args.out or f"trajflow-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    return run_demo(out, args.copies, pilot_spec, spec)


def cmd_campaign(args):
    from trajflow.workflows.campaign.run import Campaign
    campaign = Campaign.load(args.file, yes=args.yes)
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
    print(f"campaign table: {result.table_path}\n(trajflow inspect {shlex.quote(result.path)} --html FILE "
          "compares the resources)")
    return EXIT_OK if result.ok else EXIT_FAILED


def cmd_resources(args):
    if args.show:
        try:
            label = resources.resolve_resource(args.show)
            resources.check_resource(label)
        except ValueError as exc:
            raise InputError(str(exc))
        config = resources.merged_config(label)
        sources = resources.resource_sources().get(label, [])
        print(f"# {label}: from {' + '.join(sources) or 'RADICAL-Pilot'} "
              "(later ones merged over earlier ones)")
        for key in ("description", "notes"):
            if config.get(key):
                print(f"# {key}: {config[key]}")
        print(json.dumps(config, indent=2, sort_keys=True))
        return EXIT_OK
    configs, sources = resources.all_configs(), resources.resource_sources()
    print(f"{'resource':30s} {'batch':8s} {'cores':>5s}  {'access (default first)':32s} "
          "config from")
    for label, config in sorted(configs.items()):
        schemas = sorted(config.get("schemas") or {}, key=lambda k: k != config.get("default_schema"))
        print(f"{label:30s} {str(config.get('resource_manager') or '?'):8s} "
              f"{str(config.get('cores_per_node') or '?'):>5s}  {', '.join(schemas):32s} "
              f"{' + '.join(sources.get(label, ['radical']))}")
    print(f"({len(configs)} resources; `trajflow resources LABEL` shows one's notes and whole "
          "config; a label's platform alone, e.g. expanse, names it when no other has that name)")
    return EXIT_OK


def cmd_inspect(args):
    from trajflow.workflows.campaign.folders import is_campaign_dir
    from trajflow.workflows.profile.inspection import inspect_runs, summary_text, write_csv, \
        write_json
    from trajflow.workflows.profile.report_html import write_html
    from trajflow.workflows.profile.trace import write_trace
    if not args.rundirs and not args.table:
        raise InputError("nothing to inspect: give one or more RUNDIRs (--out folders of "
                         "trajflow run), a campaign folder, or --table FILE.csv")
    if len(args.rundirs) == 1 and is_campaign_dir(args.rundirs[0]) and not args.table:
        return _inspect_campaign(args)
    args.rundirs = [run for d in args.rundirs for run in _runs_in(d)]
    names = [os.path.basename(os.path.abspath(d)) for d in args.rundirs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # a run is known by its folder's name in the report
        both = [d for d, n in zip(args.rundirs, names) if n == twice[0]]
        raise InputError(f"two runs named {twice[0]!r} ({', '.join(both)}): the report knows a "
                         "run by its folder's name; inspect them one at a time, or rename one")
    _check_targets(args)
    report = inspect_runs(args.rundirs, args.table, trust=args.trust)
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
    # 1 when a run did not end done (its lines above say what failed and where)
    return EXIT_OK if all(e["ok"] for e in report["endings"].values()) else EXIT_FAILED


def _runs_in(folder):
    """`folder` if it is a run, else the runs under it (as `trajflow runs` lists them);
    InputError if it holds none."""
    if has_plan(folder):
        return [folder]
    found = find_runs(folder) if os.path.isdir(folder) else []
    if not found:
        raise InputError(f"{folder!r} is not a trajflow run (no plan.json) and holds none: give a "
                         "--out folder of trajflow run, or a folder of runs (`trajflow runs "
                         "FOLDER` lists them)")
    return [run.path for run in found]


def _check_targets(args):
    """Each file to write (--html, --json, --csv, --trace) can be: its folder exists."""
    for flag in ("html", "json", "csv", "trace"):
        target = getattr(args, flag, None)
        if target is None:
            continue
        folder = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(folder):
            raise InputError(f"--{flag} {target!r}: the folder {folder!r} does not exist: "
                             "create it, or name a file in a folder that exists")


def _inspect_campaign(args):
    from trajflow.workflows.campaign.report import write_campaign_html
    from trajflow.workflows.campaign.table import experiment_rows, summary_lines, write_table
    _check_targets(args)
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


# each option of `trajflow bench` that only some of its measurements take, and those
BENCH_OPTION_USERS = {"ranks": ("--scale large", "--setup-growth"),
                      "ceiling": ("--scale large",), "cases": ("--scale large", "--model"),
                      "measured": ("--model",), "validate_on": ("--model",)}


def check_bench_options(args):
    """One measurement at a time, and no option it would ignore (InputError)."""
    instead = [flag for flag, on in (("--stragglers", args.stragglers), ("--readers", args.readers),
                                     ("--latency", args.latency), ("--width", args.width),
                                     ("--setup-growth", args.setup_growth),
                                     ("--model", args.model)) if on]
    if len(instead) > 1:
        raise InputError(f"{' and '.join(instead)}: one measurement at a time")
    mode = instead[0] if instead else f"--scale {args.scale}"
    for option, users in BENCH_OPTION_USERS.items():
        if getattr(args, option) not in (None, False) and mode not in users:
            raise InputError(f"--{option.replace('_', '-')} goes with {' or '.join(users)}, "
                             f"not {mode}")
    if args.ranks is not None and (min(args.ranks) < 1 or len(set(args.ranks)) != len(args.ranks)):
        raise InputError(f"--ranks: distinct counts of 1 rank or more, got {args.ranks}")


def cmd_bench(args):
    from trajflow.workflows.bench.cpu_quota import unavailable as cpu_quota_unavailable
    from trajflow.workflows.bench.latency import format_latency, run_latency
    from trajflow.workflows.bench.model import format_model, model_inputs_check, run_model_bench
    from trajflow.workflows.bench.readers import format_readers, run_readers
    from trajflow.workflows.bench.scaling import format_setup_growth, run_setup_growth, \
        SETUP_RANKS
    from trajflow.workflows.bench.small import format_table, run_bench, run_bench_large
    from trajflow.workflows.bench.stragglers import format_stragglers, run_stragglers
    from trajflow.workflows.bench.width import cores_per_node, format_width, run_width
    if min(args.copies, args.repeats, args.loop_frames, args.startup_launches, args.launches) < 1:
        raise InputError("--copies, --repeats, --loop-frames, --startup-launches and --launches "
                         "must be at least 1")
    check_bench_options(args)
    gb = args.large_gb if args.large_gb is not None else (0.2 if args.model else 2.0)
    if not gb > 0:
        raise InputError(f"--large-gb must be more than 0, got {gb}")
    if args.width and (min(args.nodes) < 1 or len(set(args.nodes)) != len(args.nodes)):
        raise InputError(f"--nodes: distinct widths of 1 node or more, got {args.nodes}")
    if args.width:
        try:
            resource = resources.resolve_resource(args.width_resource)
            cores = cores_per_node(resource)
        except ValueError as exc:
            raise InputError(f"--width-resource: {exc}")
        result = {"width": run_width(resource, cores, sorted(args.nodes))}
        print("\n".join(format_width(result["width"])))
    elif args.stragglers:
        reason = cpu_quota_unavailable()
        if reason:
            raise InputError(f"--stragglers slows a rank with a cgroup CPU quota, and {reason}: "
                             "run it as root on a Linux machine with the cgroup cpu controller")
        result = {"stragglers": run_stragglers(args.copies, args.launches,
                                               with_tasks=not args.no_entk)}
        print("\n".join(format_stragglers(result["stragglers"])))
    elif args.readers:
        result = {"readers": run_readers(gb, args.launches)}
        print(format_readers(result["readers"]))
    elif args.latency:
        result = run_latency(args.repeats)
        print(format_latency(result))
    elif args.model:
        measured = None
        if args.measured:
            try:
                with open(args.measured, encoding="utf-8") as fh:
                    measured = json.load(fh)
                model_inputs_check(measured, (args.cases or ["xtc_ca"])[0])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise InputError(f"--measured {args.measured}: not the numbers of "
                                 f"trajflow.workflows.bench.manycore ({exc}); run it, or leave "
                                 "--measured out to measure here")
        result = {"model": run_model_bench(measured, (args.cases or ["xtc_ca"])[0],
                                           gb,
                                           args.launches, args.validate_on, args.nodes)}
        print("\n".join(format_model(result["model"])))
    elif args.setup_growth:
        result = run_setup_growth(args.ranks or SETUP_RANKS, args.launches)
        print("\n".join(format_setup_growth(result)))
    elif args.scale == "large":
        result = run_bench_large(gb, args.launches, with_entk=not args.no_entk,
                                 startup_launches=args.startup_launches, ranks=args.ranks,
                                 ceiling=args.ceiling, cases=args.cases)
    else:
        result = run_bench(args.copies, args.repeats, args.loop_frames,
                           with_parallel=not args.no_parallel, with_entk=not args.no_entk,
                           user_copies=args.user_copies, startup_launches=args.startup_launches)
    if not (args.stragglers or args.width or args.readers or args.latency or args.setup_growth
            or args.model):
        print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
        print(f"numbers written to {args.json}")
    if args.latency and not result["all_equal"]:
        return EXIT_FAILED  # a fast wrong answer is no answer
    return EXIT_OK


def analysis_label(analysis):
    """A run's analysis as `runs` shows it: a factory file without its folder, an
    MDAnalysis class run on the Backend by its class name."""
    text = str(analysis)
    if text.startswith("mdanalysis:"):
        return "mdanalysis:" + text.rpartition(".")[2]
    return os.path.basename(text)


def cmd_runs(args):
    """The runs under a folder, a line each."""
    unreadable = []
    found = find_runs(args.folder, unreadable=unreadable)
    if not found and not unreadable:
        print(f"no trajflow run in {os.path.abspath(args.folder)} (nor 4 levels below)")
        return EXIT_OK
    names = [os.path.relpath(run.path, args.folder) for run in found]
    width = max(len(n) for n in names + ["run"])
    labels = [analysis_label(run.plan.analysis) for run in found]
    shown = max(len(label) for label in labels + ["analysis"])  # whole names, never cut
    print(f"{'run':{width}s} {'analysis':{shown}s} {'state':9s} {'frames':>7s} {'wall s':>8s}  "
          "io/mode")
    for name, analysis, run in zip(names, labels, found):
        try:
            wall = "-" if run.wall_s is None else f"{run.wall_s:.1f}"
            line = (f"{name:{width}s} {analysis:{shown}s} {run.state:9s} "
                    f"{run.plan.n_frames:7d} {wall:>8s}  {run.plan.io}/{run.plan.mode}, "
                    f"{run.plan.n_blocks} blocks")
        except Exception as exc:  # noqa: one damaged folder never hides the others
            unreadable.append((run.path, f"{type(exc).__name__}: {exc}"))
            continue
        print(line)
    for path, why in unreadable:
        print(f"{os.path.relpath(path, args.folder)}: UNREADABLE: {why.splitlines()[0]}")
    return EXIT_OK


def cmd_analyses(args):
    import MDAnalysis
    classes = parallelisable_classes()
    print(f"MDAnalysis {MDAnalysis.__version__}: {len(classes)} analyses can be split over "
          "blocks (build one in your factory: --analysis FILE.py:NAME)")
    for name, module in classes.items():
        print(f"  {name:28s} {module}")
    return EXIT_OK
