"""The `trajflow` command: run, demo, campaign, inspect, resources, bench.

Exit codes: 0 every task DONE and result.h5 complete; 1 a task failed or a
result is missing; 2 bad input (nothing was started or written); 130 Ctrl-C.
"""
import logging
import os
import sys

from trajflow.workflows.errors import EXIT_INPUT, EXIT_INTERRUPTED, EXIT_OK, InputError, Interrupted
from trajflow.workflows.run import progress, signals
from trajflow.workflows.run.signals import stop_on_signals
from trajflow.workflows.run.spec import command_line
from trajflow.workflows.cli.commands import (cmd_analyses, cmd_bench, cmd_campaign, cmd_demo,
                                             cmd_inspect, cmd_pilot, cmd_resources, cmd_run,
                                             cmd_runs)
from trajflow.workflows.cli.parser import build_parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if runs_radical_here(args):
        # before logging has a handler: radical.utils makes logging's locks safe across
        # fork() then, and warns when it is too late (its own warning)
        import radical.utils  # noqa: F401
    # trajflow's log records (progress, warnings) on stderr; --quiet: warnings only
    progress.show_on(None, logging.INFO if getattr(args, "progress", True) else logging.WARNING)
    try:
        return run_guarded(_command, args)
    except BrokenPipeError:  # `trajflow resources | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return EXIT_OK


def runs_radical_here(args):
    """Whether the command may run RADICAL in this process: all but a run sent to a held
    pilot on this machine, whose client only talks to the holder (radical.utils' import,
    0.1 s, was a tenth of such a command's time)."""
    return not (args.command == "run" and getattr(args, "pilot", None)
                and not getattr(args, "remote", None))


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
    return 128 + signals.stopped_by if signals.stopped_by else EXIT_INTERRUPTED


def _command(args):
    if args.command in REMOTE_COMMANDS:
        from trajflow.workflows.remote import client as remote  # (0.15 s: only for these)
        return getattr(remote, f"cmd_{args.command}")(args)
    return {"run": cmd_run, "demo": cmd_demo, "bench": cmd_bench, "campaign": cmd_campaign,
            "resources": cmd_resources, "inspect": cmd_inspect, "analyses": cmd_analyses,
            "runs": cmd_runs, "pilot": cmd_pilot}[args.command](args)


# the commands about a remote run, each remote.client's cmd_<name>
REMOTE_COMMANDS = ("status", "follow", "fetch", "cancel")


if __name__ == "__main__":
    sys.exit(main())
