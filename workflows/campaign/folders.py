"""A campaign's folder: where each experiment's run, the resources' logs and RADICAL
sessions and the campaign's own files are (CAMPAIGN_DIR/runs/RESOURCE/POINT-rN,
logs/RESOURCE.log, sessions/RESOURCE); its names are here only."""
import contextlib
import os
import sys

CAMPAIGN_MARKER = ".trajflow-campaign"
EXPERIMENTS_FILE = "experiments.json"


RUNS, LOGS, SESSIONS = "runs", "logs", "sessions"


def resource_runs(cdir, label) -> str:
    """The folder of a resource's experiments' runs."""
    return os.path.join(cdir, RUNS, label)


def rundir(cdir, experiment) -> str:
    return os.path.join(resource_runs(cdir, experiment.resource),
                        f"{experiment.point}-r{experiment.rep}")


def session_root(cdir, label) -> str:
    """Where a resource's pilot keeps its RADICAL session."""
    return os.path.join(cdir, SESSIONS, label)


def is_campaign_dir(path) -> bool:
    return os.path.exists(os.path.join(path, CAMPAIGN_MARKER))


def resource_log_path(cdir, label) -> str:
    return os.path.join(cdir, LOGS, f"{label}.log")


@contextlib.contextmanager
def resource_log(cdir, label):
    """A resource process' output into logs/<label>.log, out of the terminal's
    foreground group (Ctrl-C comes from the campaign process, once)."""
    os.setpgid(0, 0)
    os.makedirs(os.path.join(cdir, LOGS), exist_ok=True)
    with open(resource_log_path(cdir, label), "a", buffering=1, encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout, sys.stderr = log, log
        yield
