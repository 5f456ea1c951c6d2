"""`trajflow`'s argument parser: its commands and their options (a run's from the specs)."""
import argparse

from trajflow import __version__

from trajflow.workflows.campaign.spec import MAX_EXPERIMENTS
from trajflow.workflows.cli.options import RESUMED_OPTIONS, add_spec_options
from trajflow.workflows.demo import DEFAULT_COPIES
from trajflow.workflows.run.held_client import DEFAULT_IDLE_MIN
from trajflow.workflows.remote.client import add_remote_commands
from trajflow.workflows.run.spec import PilotSpec, RemoteSpec, RunSpec
from trajflow.workflows.bench.scaling import CASES as SCALING_CASES, SETUP_RANKS


def add_run_options(p):
    """Every option of a run and of its pilot (RunSpec, PilotSpec), and --resume."""
    add_spec_options(p, RunSpec)
    add_spec_options(p, PilotSpec)
    p.add_argument("--pilot", metavar="NAME", default=None,
                   help="run on the held pilot NAME (`trajflow pilot start --name NAME`): no "
                        "pilot of its own to wait for; the pilot's options are then its own "
                        "(default: a pilot of the run's own, started and ended with it)")
    p.add_argument("--resume", metavar="RUNDIR", default=None,
                   help="instead of a new run: re-run only the blocks an interrupted run is "
                        "missing; refused if its inputs changed (default: a new run)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="trajflow",
        description="Parallel MD trajectory analysis (split -> analyze -> reduce) on RADICAL-EnTK.")
    parser.add_argument("--version", action="version",
                        version=f"trajflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="analyse a trajectory on a pilot",
                         description="Analyse a trajectory on a RADICAL pilot; writes RUNDIR/result.h5.")
    add_run_options(run)
    add_spec_options(run, RemoteSpec)
    demo = sub.add_parser("demo", help="the point in a minute: CA RMSD of the solvated AdK on a "
                                       "kept pilot beside MDAnalysis' serial and 2-worker runs",
                          description="Build the solvated AdK (MDAnalysisTests GRO/XTC, 47,681 "
                                      "atoms) repeated --copies times once in a cache folder, "
                                      "hold one local pilot, run CA RMSD on it with 2 MPI ranks "
                                      "beside MDAnalysis' serial and 2-worker runs (the three "
                                      "times, their ratios, the straggler verdict, the report), "
                                      "then a second analysis (backbone RMSD) on the same pilot.")
    demo.add_argument("--out", default=None, metavar="DIR",
                      help="folder for the two runs (default: ./trajflow-demo-<time>)")
    demo.add_argument("--copies", type=int, default=DEFAULT_COPIES, metavar="K",
                      help="how many times to repeat the solvated AdK's 10 frames "
                           f"(default: {DEFAULT_COPIES})")
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
                           "t_write, t_total; see docs/guide/inspecting.md); repeat for several")
    insp.add_argument("--trace", default=None, metavar="FILE.json",
                      help="write the timeline as a Chrome Trace Event file for Perfetto or "
                           "chrome://tracing (default: none)")
    insp.add_argument("--trust", action="store_true",
                      help="the HTML report may load results stored with pickle (your own "
                           "analysis' objects): unpickling runs code of whoever wrote the run "
                           "folder, so only for folders you trust (without it, nothing in a "
                           "folder is run)")
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
    camp.add_argument("file", metavar="FILE.toml", help="the campaign file (see docs/guide/campaigns.md)")
    camp.add_argument("--out", default=None, metavar="CAMPAIGN_DIR",
                      help="the campaign's folder (default: ./<campaign name>)")
    camp.add_argument("--dry-run", action="store_true",
                      help="print the experiments and each resource's pilot; submit and write "
                           "nothing")
    camp.add_argument("--yes", action="store_true",
                      help=f"take a campaign of more than {MAX_EXPERIMENTS:,} experiments "
                           "(refused without it)")
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
                     help="(every resource is listed; kept for old scripts)")
    runs = sub.add_parser("runs", help="list the runs under a folder",
                          description="List the trajflow runs in a folder and below it: name, "
                                      "analysis, state (done, failed, not ended), frames, the "
                                      "wall time from the call to the end, io and mode.")
    runs.add_argument("folder", nargs="?", default=".", metavar="DIR",
                      help="where to look (default: the current folder)")
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
                            "built once in the cache, trajflow's N-rank stage against MDAnalysis' "
                            "N workers per format and N (--ranks, --ceiling), the analyze stage "
                            "in a kept pilot against plain mpiexec, and a task's start-up "
                            "(default: small)")
    bench.add_argument("--ranks", type=int, nargs="+", default=None, metavar="N",
                       help="--scale large: the rank counts (default: 1, 2 and this machine's "
                            "cores)")
    bench.add_argument("--ceiling", action="store_true",
                       help="--scale large: add the machine's own ceiling per N: the same frames "
                            "cut N ways and run as N independent one-rank stages at once")
    bench.add_argument("--cases", nargs="+", default=None, choices=tuple(SCALING_CASES),
                       metavar="CASE", help="--scale large: the rows to measure, of "
                       f"{', '.join(SCALING_CASES)} (default: all)")
    bench.add_argument("--large-gb", type=float, default=None, metavar="GB",
                       help="--scale large, --readers, --model: the XTC's size in GB (default: "
                            "2, --model 0.2; the three files take ~8x that on disk)")
    bench.add_argument("--launches", type=int, default=3, metavar="N",
                       help="--scale large: launches of each of our stages, best (pilot against "
                            "mpiexec: median) of N (default: 3)")
    bench.add_argument("--stragglers", action="store_true",
                       help="instead: static blocks against --schedule dynamic with one of 2 MPI "
                            "ranks at a quarter of a core (a cgroup CPU quota; needs root), XTC "
                            "CA-RMSD and dihedrals of AdK x --copies, --launches each, and tasks "
                            "mode, 8 blocks on a 2-core local pilot, one task slowed (~5 min)")
    bench.add_argument("--readers", action="store_true",
                       help="instead: the readers side by side on the --large-gb solvated AdK: "
                            "XTC decoded whole by trajflow, MDAnalysis (xdrfile), mdtraj, "
                            "chemfiles and molly (built with cargo), in ns per atom, and "
                            "trajflow's selective path; H5MD one-frame chunks against the "
                            "selection layout (each compression) against DCD rows, and E(2)")
    bench.add_argument("--latency", action="store_true",
                       help="instead: what a run costs beside its analysis: with a pilot of "
                            "its own from the shell, and on a held pilot (the call to the "
                            "result, the shell to the exit, ten clients at once, InterRDF via "
                            "Backend against MDAnalysis' 2 workers), where a warm run's time "
                            "goes; medians of --repeats (~3 min)")
    bench.add_argument("--setup-growth", action="store_true",
                       help="instead: an analyze rank's set-up and finalize at --ranks ranks "
                            f"(default: {' '.join(map(str, SETUP_RANKS))}; beyond the cores "
                            "oversubscribed), the slowest rank and the median rank's parts")
    bench.add_argument("--model", action="store_true",
                       help="instead: the analyze stage's E(N) from 16 to 1,024 ranks on 1 to 32 "
                            "nodes, static and dynamic, predicted from measured numbers (this "
                            "machine's set-up growth, scaling rows with the ceiling and claims, "
                            "or --measured's), with its error on the measured rows")
    bench.add_argument("--measured", default=None, metavar="FILE",
                       help="--model: the numbers of `python -m trajflow.workflows.bench.manycore` "
                            "(e.g. a 16-core node's) instead of measuring here")
    bench.add_argument("--validate-on", default=None, metavar="RESOURCE",
                       help="--model: also run --cases' first case (default xtc_ca) on --nodes "
                            "nodes of this SLURM resource, a rank on each core, and put the "
                            "prediction beside each (the virtual cluster: sudo "
                            "tests/cluster/virtual.sh start 4)")
    bench.add_argument("--width", action="store_true",
                       help="instead: a pilot's start-up and its tasks' launch at --nodes nodes of "
                            "a SLURM resource, one pilot each, and their growth per node (start "
                            "the virtual cluster first: sudo tests/cluster/virtual.sh start 4)")
    bench.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4], metavar="N",
                       help="--width, --validate-on: the widths in nodes (default: 1 2 4)")
    bench.add_argument("--width-resource", default="local.vcluster", metavar="NAME",
                       help="--width: the resource (default: local.vcluster)")
    bench.add_argument("--json", default=None, metavar="FILE", help="also write the numbers as JSON")
    add_pilot_commands(sub)
    add_remote_commands(sub)  # status, follow, fetch, cancel: remote runs
    return parser


def add_pilot_commands(sub):
    """`trajflow pilot start|status|stop|list`: a pilot held for many runs."""
    pilot = sub.add_parser(
        "pilot", help="hold a pilot for many runs: start, status, stop, list",
        description="Hold a pilot that outlives the command, and send runs to it with "
                    "`trajflow run ... --pilot NAME` (Python: trajflow.Pilot.attach(NAME), "
                    "trajflow.Backend(pilot=NAME)): each run then starts in about a second, "
                    "without a pilot of its own. Only you can reach your held pilots (a "
                    "Unix socket in a private folder, $TRAJFLOW_PILOTS or "
                    "~/.trajflow/pilots). With --remote HOST the command runs on that cluster "
                    "over SSH and the pilot is held there, outliving the connection: "
                    "`trajflow run --remote HOST --pilot NAME` runs on it.")
    commands = pilot.add_subparsers(dest="pilot_command", required=True)
    start = commands.add_parser("start", help="start a held pilot and wait until it is active",
                                description="Start a pilot held by a background process of "
                                            "trajflow's, and return once it is active. It ends "
                                            "at `trajflow pilot stop`, at its walltime, or "
                                            "after --idle-timeout minutes without a run.")
    start.add_argument("--name", default="default", metavar="NAME",
                       help="the name runs give with --pilot (default: default)")
    start.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_MIN, metavar="MIN",
                       help="minutes without a run after which the pilot ends; 0: never "
                            f"(default: {DEFAULT_IDLE_MIN:g})")
    add_spec_options(start, PilotSpec)
    status = commands.add_parser("status", help="a held pilot's cores, runs, walltime left",
                                 description="Resource, cores busy and free, runs running and "
                                             "queued, walltime left and idle time of one held "
                                             "pilot, or of all.")
    status.add_argument("name", nargs="?", default=None, metavar="NAME",
                        help="the held pilot (default: every one)")
    stop = commands.add_parser("stop", help="end a held pilot",
                               description="End a held pilot: its runs in flight end as "
                                           "interrupted (`trajflow run --resume RUNDIR` goes "
                                           "on), the pilot is cancelled, nothing is left "
                                           "running.")
    stop.add_argument("name", metavar="NAME", help="the held pilot")
    listing = commands.add_parser("list", help="the held pilots, a line each",
                                  description="Every held pilot of yours, a line each; the "
                                              "folders of pilots whose holder has died are "
                                              "removed.")
    for command in (start, status, stop, listing):
        add_spec_options(command, RemoteSpec, only=("remote", "remote_python"))
