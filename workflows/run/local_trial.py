"""Try a user's analysis here, in seconds, before any pilot (tasks/trial.py).

An error in a scientist's own code used to show after the pilot had started
and the task had been retried (40 s and more); the same error shows here in a
few seconds, with the user's traceback, as an InputError. The trial runs in a
fresh Python without the user's folders on its path, from a staged copy of
what the tasks will load, so a module that would not reach the pilot is found
here too. Its time per frame is the run's first estimate of the compute.
"""
import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile

from trajflow.tasks.exit_codes import ANALYSIS_RAISED
from trajflow.tasks.modes import TasksMode
from trajflow.tasks.plan import RunPlan
from trajflow.workflows.errors import InputError

log = logging.getLogger(__name__)

TRIAL_FRAMES = 5        # frames of the trial: enough to pass _prepare and a few frames
TRIAL_LIMIT_S = 120.0   # a trial still going after this is ended; the run goes on untried
STDERR_LINES = 25       # of the trial's traceback, shown in the message


@dataclasses.dataclass
class TrialResult:
    frames: int
    seconds: float

    @property
    def seconds_per_frame(self):
        return self.seconds / self.frames if self.frames else None


def try_analysis(inputs, label, write_code, chosen, frames=TRIAL_FRAMES, limit_s=TRIAL_LIMIT_S):
    """Run the trial of `inputs`' user analysis on the first `frames` of the run's
    `chosen` frames (`write_code(plan)` stages its code as for the tasks); a TrialResult,
    None if it ran out of time, InputError if it failed. `frames` 0: only load the
    analysis in a fresh Python (its data is not here)."""
    first = [int(f) for f in chosen[:max(frames, 1)]]
    with tempfile.TemporaryDirectory(prefix="trajflow-trial-") as staging:
        plan = RunPlan(workdir=staging, topology=inputs.topology,
                       trajectories=inputs.trajectories, analysis=inputs.analysis, selection="",
                       io="shared", mode=TasksMode.name, gather="gatherv", n_frames=len(first),
                       n_atoms=inputs.n_atoms, blocks=[(0, len(first))],
                       frame_selection={"frames": first}, input_frames=inputs.n_frames,
                       analysis_args=inputs.analysis_args, factory=inputs.factory,
                       universe=inputs.universe)
        plan.factory_pickle = inputs.factory_pickle
        write_code(plan)
        path = plan.save(os.path.join(staging, "plan.json"))
        # -P: not the current folder (as a task's Python, started elsewhere); the user
        # site-packages stay, as they do for the tasks (a `pip install --user` is common)
        argv = [sys.executable, "-P", "-m", "trajflow.tasks.trial", "--plan", path,
                "--frames", str(frames)]
        try:
            done = subprocess.run(argv, cwd=staging, capture_output=True, text=True,
                                  timeout=limit_s)
        except subprocess.TimeoutExpired:
            log.warning("%s: the local trial did not finish %d frames in %.0f s; the run goes "
                        "on untried (an error in the analysis will show on the pilot)",
                        label, frames, limit_s)
            return None
    if done.returncode == 0:
        result = TrialResult(**json.loads(done.stdout.strip().splitlines()[-1]))
        return result
    raise InputError(_failure(label, frames, done))


def _failure(label, frames, done):
    """The message of a failed trial: what failed, the traceback, what to do."""
    tail = "\n".join("    " + line for line in done.stderr.rstrip().splitlines()[-STDERR_LINES:])
    where = (f"on the first {frames} frame(s)" if frames else "when loaded")
    if "ModuleNotFoundError" in done.stderr or "No module named" in done.stderr:
        return (f"analysis {label!r} cannot be loaded where the tasks run: a module it needs "
                f"is neither installed nor one of your own that trajflow ships (modules "
                f"beside your script or factory file, loaded when you call trajflow):\n{tail}\n"
                "Install it into the tasks' Python (pip install), or import it at the top of "
                "your script or factory file so it travels with the analysis")
    if done.returncode == ANALYSIS_RAISED:
        return (f"analysis {label!r} failed {where}, tried on this machine before any pilot "
                f"(in a fresh Python, as a task runs it):\n{tail}\nFix it and run again: it would "
                "fail the same way on the pilot (pass trial=False / --no-trial to skip the trial "
                "when the data can only be read on the cluster)")
    return (f"analysis {label!r} could not be tried on this machine (a fresh Python, as a task "
            f"runs it, exited with {done.returncode}):\n{tail}")
