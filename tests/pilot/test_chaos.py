"""Faults below trajflow, as Dask's and Parsl's chaos tests do them (issue 32): real
processes of a real run are killed (-9) or stopped (SIGSTOP) while its analyze tasks
work. Whatever is hit, the run either recovers (its result MDAnalysis') or fails
within its phase's bound (the watchdog's, --limits) with the cause named in its
output and outcome.json; it leaves no process and no half-written result, and
`--resume` then finishes it, equal to MDAnalysis.

The analyze tasks sleep in compute (TRAJFLOW_TEST_DELAY) so that the fault lands
mid-stage; the bounds are short (STALL_S) so that a hang costs seconds.
"""
import glob
import json
import os
import signal
import subprocess
import time

import pytest
from processes import (analyze_tasks, assert_resumed_equal, assert_nothing_left, output_so_far, processes_mentioning,
                       session_name, START_LIMIT, start_with_sleeping_tasks, stop, TRAJFLOW, wait_for_analyze)

from trajflow.tasks.procfs import state as process_state
from trajflow.workflows.run.watchdog import NOTE_RADICAL_EVERY_S

pytestmark = pytest.mark.entk

STALL_S = 25          # the stall and first-task bounds of these runs
SHUTDOWN_S = 60 + 30  # the child's own shutdown limit, and the parent's grace after it
LIMITS = f"stall={STALL_S},task={STALL_S},{START_LIMIT}"
# the one case of each fault class whose --resume starts a pilot of its own, as a user's
# would; the others resume on the layer's held pilot (a stopped rank's, a killed process')
COLD_RESUME = ("tasks", "rp.tmgr_scheduling.0000")


def start(out, adk, mode="tasks", delay="0:compute:12,1:compute:12", limits=LIMITS, extra=()):
    return start_with_sleeping_tasks(
        ["run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
         "--mode", mode, "--blocks", "2", "--cpus", "2", "--retries", "0", "--walltime", "15",
         "--limits", limits, "--out", str(out), *extra], delay=delay)


def client_component(name, out):
    """The pid of RADICAL's client process `name` of the run in `out` (its cwd is the
    run's session folder; the agent's namesakes live in the pilot's sandbox)."""
    for pid in processes_mentioning(name):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == name[:15] and \
                    os.readlink(f"/proc/{pid}/cwd").startswith(str(out)):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no client process {name} of {out}")


def agent_component(name, session):
    for pid in processes_mentioning(name):
        try:
            if open(f"/proc/{pid}/comm").read().strip() == name[:15] and \
                    session in os.readlink(f"/proc/{pid}/cwd"):
                return pid
        except OSError:
            continue
    raise AssertionError(f"no agent process {name} of {session}")


def ended(proc, patience_s):
    try:
        code = proc.wait(timeout=patience_s)
    except subprocess.TimeoutExpired:
        print("the run's output:\n" + output_so_far(proc))
        stop(proc)
        raise AssertionError(f"the run was still silent {patience_s:.0f} s after the fault")
    return code, proc.stdout.read()


def assert_handled(code, output, out, session, reference, adk, recovered_ok=False, pilot=None):
    """Recovered with MDAnalysis' result, or failed with a cause named and nothing left;
    either way --resume (on the held pilot `pilot`, if given) or the run itself ends
    equal to MDAnalysis."""
    outcome = json.load(open(out / "outcome.json"))
    if code == 0:
        assert recovered_ok, output
        assert outcome["status"] == "done"
    else:
        assert code == 1, output
        assert outcome["status"] == "failed" and outcome["error"], outcome
        assert "interrupted by" not in outcome["error"], outcome
        assert not (out / "result.h5").exists()
    leftovers = [f for f in glob.glob(str(out / "**" / "*.tmp"), recursive=True)
                 if "re.session" not in f]
    assert leftovers == []
    assert_nothing_left(session)
    assert_resumed_equal(out, adk, reference, resume=code != 0, pilot=pilot)


@pytest.mark.parametrize("mode", ["tasks", "mpi"])
def test_a_stopped_rank_fails_the_run_at_the_stall_bound_and_is_ended(tmp_path, adk, mode,
                                                                      reference_results, request):
    """SIGSTOP of one analyze rank: before, the run said "50 %" and then nothing until an
    outside timeout, and the stopped rank outlived the pilot."""
    out = tmp_path / f"stopped-{mode}"
    proc = start(out, adk, mode)
    try:
        wait_for_analyze(proc, marker=str(out))
        session = session_name(out)
        time.sleep(2)
        victim = analyze_tasks(str(out))[0]
        os.kill(victim, signal.SIGSTOP)
        t0 = time.time()
        code, output = ended(proc, STALL_S + 12 + SHUTDOWN_S + 60)
    finally:
        stop(proc)
    took = time.time() - t0
    assert code == 1, output
    assert "for the analyze ranks to report frames done" in output, output
    assert f"stopped task processes here (state T, SIGSTOP): pid {victim}" in output, output
    assert took < STALL_S + 12 + SHUTDOWN_S, f"{took:.0f} s from the stop to the end"
    # ended: gone, or a zombie its new parent (this machine's init) has not reaped yet
    assert process_state(victim) in (None, "Z"), "the stopped rank was left behind"
    outcome = json.load(open(out / "outcome.json"))
    assert "--limits stall=S" in outcome["error"], outcome
    assert_handled(code, output, out, session, reference_results, adk,
                   pilot=None if mode == COLD_RESUME[0] else request.getfixturevalue("shared_pilot"))


# each RADICAL process killed in turn: (client or agent, its process title, the exit code
# and what outcome.json's error says, as docs/guide/reliability.md's table of faults states them)
COMPONENTS = [
    ("client", "rp.state_pubsub", 1, "every frame is done, but RADICAL has not reported"),
    ("client", "rp.control_pubsub", 0, None),  # recovered: the result, equal to MDAnalysis'
    ("client", "rp.tmgr_scheduling.0000", 1, "--limits task=S"),
    ("client", "rp.tmgr_staging_output.0000", 1, "--limits stall=S"),
    ("agent", "rp.agent.0", 1, "failed (RADICAL-Pilot"),  # the pilot failed at once
    ("agent", "rp.agent_executing.0000", 1, "--limits stall=S")]


@pytest.mark.parametrize("side,name,expected,said", COMPONENTS, ids=[c[1] for c in COMPONENTS])
def test_kill_9_of_a_radical_process_ends_as_the_readme_says(tmp_path, adk, side, name, expected,
                                                             said, reference_results, request):
    out = tmp_path / "killed"
    proc = start(out, adk)
    try:
        wait_for_analyze(proc, marker=str(out))
        session = session_name(out)
        # the watchdog notes RADICAL's processes every NOTE_RADICAL_EVERY_S; RADICAL starts
        # its task manager's just before the first task, so a process killed within that
        # time of its start is not named (said in the watchdog): kill it after that (the
        # agent's are up, and noted, when the pilot is active)
        if side == "client":
            time.sleep(NOTE_RADICAL_EVERY_S + 1)
        victim = (client_component(name, out) if side == "client"
                  else agent_component(name, session))
        os.kill(victim, signal.SIGKILL)
        t0 = time.time()
        code, output = ended(proc, 12 + STALL_S + SHUTDOWN_S + 60)
    finally:
        stop(proc)
    print(f"kill -9 {name} ({side}): exit {code} after {time.time() - t0:.0f} s\n{output}")
    assert code == expected, output
    if said is not None:
        outcome = json.load(open(out / "outcome.json"))
        assert said in outcome["error"], outcome
    if code != 0 and name != "rp.agent.0":  # the agent's death fails the pilot at once
        # the victim is named among the dead (others may follow it: in CI the agent died
        # after rp.state_pubsub was killed, and both were named)
        _, found, died = output.partition("RADICAL processes that died during the run: ")
        assert found and f"{name} (pid {victim})" in died.splitlines()[0].split(";")[0], output
    assert_handled(code, output, out, session, reference_results, adk, recovered_ok=expected == 0,
                   pilot=None if name in COLD_RESUME or code == 0 else request.getfixturevalue("shared_pilot"))


def test_a_client_stopped_longer_than_its_guard_allows_ends_named(tmp_path, adk,
                                                                  reference_results):
    """SIGSTOP of the process holding the pilot (a suspended laptop's client) beyond
    --client-timeout: the pilot's guard ends the pilot; once the client goes on, the run
    fails saying why, within the bounds, and --resume finishes it."""
    out = tmp_path / "suspended"
    proc = start(out, adk, extra=("--client-timeout", "10"))
    try:
        wait_for_analyze(proc, marker=str(out))
        session = session_name(out)
        holder = [p for p in processes_mentioning(str(out), "trajflow\x00run")
                  if p != proc.pid and os.getpgid(p) == p][0]
        os.kill(holder, signal.SIGSTOP)
        t0 = time.time()
        time.sleep(20)  # > --client-timeout: the guard ends the pilot meanwhile
        try:
            os.kill(holder, signal.SIGCONT)
        except ProcessLookupError:
            pass  # a local pilot's job shares the holder's process group: the guard ended both
        code, output = ended(proc, STALL_S + SHUTDOWN_S + 60)
    finally:
        stop(proc)
    print(f"client stopped 20 s: exit {code} after {time.time() - t0:.0f} s\n{output}")
    assert code == 1, output
    assert "the pilot's guard had ended the pilot: the client's heartbeat is" in output, output
    assert_handled(code, output, out, session, reference_results, adk, recovered_ok=False)


def test_a_run_stopped_by_timeout_names_sigterm_and_its_sender(tmp_path, adk):
    out = tmp_path / "timed-out"
    env = {**os.environ, "TRAJFLOW_TEST_DELAY": "0:compute:300,1:compute:300"}
    done = subprocess.run(["timeout", "--preserve-status", "-s", "TERM", "60", TRAJFLOW, "run", "--topology", adk[0],
                           "--trajectory", adk[1], "--analysis", "rmsd", "--mode", "tasks",
                           "--blocks", "2", "--cpus", "2", "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=240)
    assert "analyze submitted" in done.stderr, done.stderr  # stopped mid-run, not before
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "stopped by SIGTERM (probably `timeout` (pid" in done.stderr, done.stderr
    outcome = json.load(open(out / "outcome.json"))
    assert outcome["error"].startswith("stopped by SIGTERM (probably `timeout`"), outcome
    assert "by the user" not in done.stderr
    assert analyze_tasks(str(out)) == []
