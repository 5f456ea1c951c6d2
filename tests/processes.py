"""Processes of a test's trajflow runs: start one with sleeping tasks, find what runs, stop it."""
import glob
import os
import signal
import subprocess
import sys
import time

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")


def processes_mentioning(text):
    """pids whose command line contains `text` (from /proc, no extra dependency)."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as fh:
                if text.encode() in fh.read():
                    found.append(int(cmdline.split("/")[2]))
        except OSError:
            pass
    return [p for p in found if p != os.getpid()]


def start_with_sleeping_tasks(args, delay="0:compute:300,1:compute:300"):
    """`trajflow ARGS` in a session of its own (as a terminal would run it), its
    blocks 0 and 1 sleeping 300 s in compute, so that there is time to press Ctrl-C."""
    env = {**os.environ, "TRAJFLOW_TEST_DELAY": delay}
    return subprocess.Popen([TRAJFLOW] + args, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def analyze_tasks(marker=""):
    """pids of analyze tasks (of the run whose folder is `marker`, if given)."""
    return [p for p in processes_mentioning("trajflow.tasks.analyze")
            if marker in open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace")]


def wait_for_analyze(proc, patience_s=240, marker=""):
    deadline = time.time() + patience_s
    while time.time() < deadline and not analyze_tasks(marker):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(1)
    assert analyze_tasks(marker), "the analyze tasks never started"


def stop(proc):
    """If a check failed mid-run: Ctrl-C first, so the pilot is cancelled in order
    (a SIGKILL would orphan it), then SIGKILL whatever is left of the group."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
