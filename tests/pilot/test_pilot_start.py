"""A pilot whose start hangs is replaced, on a real local pilot.

The hang seen in CI (an agent up but never ready; the client waited out the
walltime) is imitated by a pilot whose bootstrap sleeps past the limit (45 s here,
against a start of 13-25 s seen): the
watch cancels it, a second pilot runs the run, and the result is MDAnalysis'.
"""
import glob
import logging
import os
import signal
import time

import numpy as np
import pytest

import trajflow
from processes import assert_nothing_left, remove_local_sandboxes, session_sandbox
from trajflow.tasks.agent_rpc import LOSE_FIRST_SEND


@pytest.mark.serial  # a healthy pilot's start must stay well inside the 45 s bound
def test_a_pilot_that_never_comes_up_is_replaced(tmp_path, adk, reference_results, monkeypatch,
                                                 capfd, caplog):
    monkeypatch.setenv("TRAJFLOW_TEST_PILOT_START_DELAY_S", "150")
    caplog.set_level(logging.INFO, logger="trajflow")
    t0 = time.time()
    run = trajflow.run(*adk, "rmsd", blocks=2, out=str(tmp_path / "rmsd"), limits="start=45")
    wall = time.time() - t0
    np.testing.assert_allclose(run.results.rmsd, reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                               atol=1e-4)
    # trajflow's lines go to stderr unless the `trajflow` logger has a handler of its own;
    # pytest (9) attaches its capture handler to every non-propagating logger, so after an
    # earlier test made trajflow's logger show on stderr, the lines land in caplog instead
    err = capfd.readouterr().err + caplog.text
    assert "did not report ready within 45 s" in err and "starting another" in err, err
    assert wall < 150, f"the hung pilot was waited for ({wall:.0f} s)"
    sessions = sorted(glob.glob(str(tmp_path / "rmsd" / "re.session.*")), key=os.path.getmtime)
    assert len(sessions) == 2, sessions
    hung, good = sessions
    with open(os.path.join(hung, "trajflow.closed")) as fh:
        assert "its start hung" in fh.read()
    # the hung pilot's bootstrap log is kept (the only account of why), not the good one's
    assert glob.glob(os.path.join(hung, "pilot.0000", "bootstrap_0.out"))
    assert not glob.glob(os.path.join(good, "pilot.0000", "bootstrap_0.out"))
    for session in sessions:
        assert_nothing_left(os.path.basename(session))
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and _is_the_delay(pid)]


def test_an_agent_whose_first_rpc_request_is_lost_still_comes_up(tmp_path, adk,
                                                                  reference_results,
                                                                  monkeypatch):
    """The start that hung in CI: the agent's first RPC request (preparing its `rp`
    environment) lost on its control channel. With every request's first send lost on
    purpose, the agent sends it again: its pilot comes up, is not replaced, and the run
    equals MDAnalysis'."""
    monkeypatch.setenv(LOSE_FIRST_SEND, "1")
    out = tmp_path / "rmsd"
    run = trajflow.run(*adk, "rmsd", blocks=2, out=str(out), limits="start=120",
                       keep_sandbox=True)
    np.testing.assert_allclose(run.results.rmsd, reference_results(adk[0], [adk[1]], "rmsd")["rmsd"],
                               atol=1e-4)
    sessions = [os.path.basename(s) for s in glob.glob(str(out / "re.session.*"))]
    try:
        assert len(sessions) == 1, sessions  # not replaced at the start bound
        with open(os.path.join(session_sandbox(sessions[0]), "pilot.0000", "agent_0.log")) as fh:
            log = fh.read()
        assert "(prepare_env) not answered after 1 send(s)" in log, log[-2000:]
        assert_nothing_left(sessions[0])
    finally:  # kept (keep_sandbox), so that its agent's log could be read
        remove_local_sandboxes(out)


def _is_the_delay(pid):
    """The testing hook's `sleep 150`, still running (the hung pilot's job not ended)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().split(b"\0")[:2] == [b"sleep", b"150"]
    except OSError:
        return False


def test_a_failed_pilot_is_reported_as_failed_not_as_a_ctrl_c(monkeypatch):
    """RADICAL-Pilot ends the main thread with SIGTERM when its pilot FAILED (a SLURM
    job ended by its time limit, seen in CI); that was reported "interrupted by the
    user". Off the pilot: the child's SIGTERM handler with a pilot FAILED, and not."""
    from trajflow.workflows.run import session

    class FailedPilot:
        uid, state = "pilot.0000", "FAILED"
    monkeypatch.setattr(session, "_PILOT_FAILED", [None])
    monkeypatch.setattr(session, "_STOPPED_BY", ["the user"])
    monkeypatch.setattr(session, "_SESSION_PILOT", [lambda: FailedPilot()])
    with pytest.raises(KeyboardInterrupt):
        session._terminated(signal.SIGTERM, None)
    assert session._interrupted_text().startswith("the pilot pilot.0000 failed")
    FailedPilot.state = "PMGR_ACTIVE"  # a kill of a healthy session stops it as a Ctrl-C
    monkeypatch.setattr(session, "_PILOT_FAILED", [None])
    with pytest.raises(KeyboardInterrupt):
        session._terminated(signal.SIGTERM, None)
    assert session._interrupted_text() == "interrupted by a SIGTERM; the pilot was cancelled"
