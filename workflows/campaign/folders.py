"""A campaign's folder: where each experiment's run, the resources' logs and the
campaign's own files are (CAMPAIGN_DIR/runs/RESOURCE/POINT-rN, logs/RESOURCE.log)."""
import contextlib
import os
import sys

CAMPAIGN_MARKER = ".trajflow-campaign"
EXPERIMENTS_FILE = "experiments.json"


def rundir(cdir, experiment) -> str:
    return os.path.join(cdir, "runs", experiment.resource, f"{experiment.point}-r{experiment.rep}")


def is_campaign_dir(path) -> bool:
    return os.path.exists(os.path.join(path, CAMPAIGN_MARKER))


@contextlib.contextmanager
def resource_log(cdir, label):
    """A resource process' output into logs/<label>.log, out of the terminal's
    foreground group (Ctrl-C comes from the campaign process, once)."""
    os.setpgid(0, 0)
    os.makedirs(os.path.join(cdir, "logs"), exist_ok=True)
    with open(os.path.join(cdir, "logs", f"{label}.log"), "a", buffering=1, encoding="utf-8") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout, sys.stderr = log, log
        yield
