"""The watchdog's bounds (workflows/run/watchdog.py) on a clock the test moves: each
phase says while it overruns and fails at its bound, with the phase, the layer and
the fix; a stage's first task and an analyze stage's frames are read from RUNDIR as
the tasks write them (tasks/rundir.py, tasks/timing.py)."""
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from trajflow.tasks.plan import RunPlan
from trajflow.tasks.rundir import mark_started
from trajflow.tasks.timing import write_progress
from trajflow.workflows.run.signals import describe_stop
from trajflow.tasks.procfs import state as process_state
from trajflow.workflows.run.watchdog import (bounds, parse_limits, PHASES, START_GRACE_S,
                                            stopped_tasks, Watchdog)


def plan_in(workdir, n_frames=100, blocks=2):
    step = n_frames // blocks
    return RunPlan(workdir=str(workdir), topology="/t.psf", trajectories=["/a.dcd"],
                   analysis="rmsd", selection="all", io="shared", mode="tasks", gather="auto",
                   n_frames=n_frames, n_atoms=10,
                   blocks=[(i * step, (i + 1) * step) for i in range(blocks)])


def watchdog(tmp_path, limits=""):
    said = []
    return Watchdog(limits, str(tmp_path), say=said.append), said


def analyze_started(tmp_path):
    """A run's analyze stage submitted on an active pilot and its first task started, under
    a stall bound of 100 s: (plan, watchdog, when)."""
    plan = plan_in(tmp_path)
    dog, _ = watchdog(tmp_path, "stall=100")
    t0 = time.time()
    dog.pilot_event("active", now=t0)
    dog.run_event("r", plan, "analyze", "submitted", now=t0)
    mark_started(plan.workdir, "analyze")
    return plan, dog, t0


def test_limits_are_parsed_and_bad_ones_name_the_fix():
    assert parse_limits("start=600, stall=0") == {"start": 600.0, "stall": 0.0}
    assert bounds("")["queue"] == 0 and bounds("")["session"] == PHASES["session"].default_s
    for bad, words in (("boot=5", "one of session, submit"), ("start", "NAME=SECONDS"),
                       ("start=-1", "0 or more"), ("start=soon", "0 or more")):
        with pytest.raises(ValueError, match=words):
            parse_limits(bad)


def test_each_pilot_phase_is_said_while_it_overruns_and_fails_at_its_bound(tmp_path):
    dog, said = watchdog(tmp_path, "session=40,submit=20,start=100")
    dog.pilot_event("batch", now=0)
    assert dog.check(now=9) is None and said == []
    assert dog.check(now=10) is None and len(said) == 1 and "waiting 10 s for RADICAL's client" in said[0]
    assert dog.check(now=11) is None and len(said) == 1  # each quarter once
    dog.pilot_event("submitted", now=12)
    dog.pilot_event("launched", now=13)  # the queue: unbounded by default
    assert dog.check(now=13 + 3000) is None
    assert any("waiting 50 min for the pilot's job to start (no bound" in line for line in said)
    dog.pilot_event("job started", now=5000)
    assert dog.check(now=5189) is None  # the child cancels and replaces a hung start first
    failure = dog.check(now=5190)
    assert failure.startswith("the pilot waited 190 s for the pilot's agent to report ready")
    assert "--limits start=S" in failure and "RADICAL agent" in failure
    dog.pilot_event("active", now=5101)
    assert dog.check(now=10 ** 6) is None


def test_the_session_phase_fails_naming_the_layer(tmp_path):
    dog, _ = watchdog(tmp_path, "session=30")
    dog.pilot_event("batch", now=0)
    failure = dog.check(now=31)
    assert "waited 31 s for RADICAL's client to start its session" in failure
    assert "waiting on: RADICAL client" in failure and "--limits session=S" in failure


def test_a_stage_whose_first_task_never_starts_fails_unless_the_pilot_is_busy(tmp_path):
    plan = plan_in(tmp_path)
    dog, said = watchdog(tmp_path, "task=60")
    dog.pilot_event("active", now=0)
    now = time.time()
    dog.run_event("r", plan, "split", "submitted", now=now)
    assert dog.check(now=now + 50) is None
    dog.activity(now + 50)  # another run's task ended: cores were taken, not a hang
    assert dog.check(now=now + 100) is None
    failure = dog.check(now=now + 111)
    assert failure.startswith("r's split stage waited 61 s for the first task of a stage to start")
    mark_started(plan.workdir, "split")  # ... a task did start
    assert dog.check(now=now + 112) is None
    dog.run_event("r", plan, "split", "done", now=now + 113)
    assert dog.check(now=now + 10 ** 5) is None


def test_a_full_session_disk_fails_a_bounded_wait_soon_and_says_why(tmp_path, monkeypatch):
    """RADICAL fails its state transitions on a full disk and does not go on: the wait
    ends once the disk has been full FULL_DISK_GRACE_S in it, not at its bound; a disk
    with room waits, and a fill freed again starts that count anew."""
    import collections
    import shutil
    from trajflow.workflows.run import watchdog as module
    free = {"bytes": 10 << 30}
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 0, free["bytes"]))
    plan = plan_in(tmp_path)
    dog, _ = watchdog(tmp_path, "task=300")
    dog.pilot_event("active", now=0)
    now = time.time()
    dog.run_event("r", plan, "reduce", "submitted", now=now)
    grace = module.FULL_DISK_GRACE_S
    assert dog.check(now=now + 100) is None  # room: the bound holds
    free["bytes"] = module.FULL_DISK_BYTES - 1
    assert dog.check(now=now + 101) is None  # full from here
    free["bytes"] = 10 << 30
    assert dog.check(now=now + 101 + grace) is None  # a moment's fill, freed again
    free["bytes"] = module.FULL_DISK_BYTES - 1
    assert dog.check(now=now + 102 + grace) is None  # full again, from here
    assert dog.check(now=now + 101 + 2 * grace) is None
    failure = dog.check(now=now + 102 + 2 * grace)
    assert failure.startswith(f"r's reduce stage waited {102 + 2 * grace:.0f} s for the first task "
                              "of a stage to start and gave up before its bound, the disk being "
                              "full (bound 300 s"), failure
    assert f"the file system of {tmp_path} is full (16.8 MB free" in failure, failure


def test_a_running_split_or_reduce_is_said_every_5_minutes_and_bounded_when_asked(tmp_path):
    for limits, stage in (("", "split"), ("stage=600", "reduce")):
        plan = plan_in(tmp_path / stage)
        dog, said = watchdog(tmp_path, limits)
        now = time.time()
        dog.pilot_event("active", now=now)
        dog.run_event("r", plan, stage, "submitted", now=now)
        mark_started(plan.workdir, stage)
        assert dog.check(now=now + 1) is None  # started: the stage clock runs from here
        assert dog.check(now=now + 299) is None and (not said) == (not limits), said
        failure = dog.check(now=now + 610)
        if not limits:  # no bound: said, never failed
            assert failure is None
            assert said[-1].startswith(f"r's {stage} stage: waiting 10 min for a running split "
                                       "or reduce task to end (no bound: --limits stage=S")
            assert dog.check(now=now + 10 ** 5) is None
        else:
            assert failure.startswith(f"r's {stage} stage waited 609 s for a running split or "
                                      "reduce task to end (bound 600 s, --limits stage=S")
            assert "waiting on: the tasks" in failure


def test_analyze_fails_when_its_frames_stop_advancing_and_names_the_quiet_block(tmp_path):
    plan, dog, t0 = analyze_started(tmp_path)
    assert dog.check(now=t0 + 1) is None  # started: now its frames are watched
    write_progress(plan.progress_path(0), 50)
    write_progress(plan.progress_path(1), 10)
    os.utime(plan.progress_path(1), (t0 - 300, t0 - 300))
    assert dog.check(now=t0 + 2) is None
    assert dog.check(now=t0 + 101) is None  # 99 s after the last change
    failure = dog.check(now=t0 + 103)
    assert "r's analyze stage waited 101 s for the analyze ranks to report frames done" in failure
    assert "60 of 100 frames done" in failure
    assert failure.index("block 1") < failure.index("block 0"), failure  # the quieter first
    assert "waiting on: the tasks" in failure


def test_an_analyze_task_publishing_the_result_restarts_its_stall_bound(tmp_path):
    """An MPI analyze's root reduces at its end, reporting no frames: reduce's start
    marker is a sign of life that restarts the stall bound, which still ends a stage
    whose end is never reported."""
    plan, dog, t0 = analyze_started(tmp_path)
    dog.check(now=t0)
    write_progress(plan.progress_path(0), 100)  # every frame done: the frames stop here
    assert dog.check(now=t0 + 1) is None
    mark_started(plan.workdir, "reduce")  # the root begins to publish, 80 s later
    assert dog.check(now=t0 + 80) is None
    assert dog.check(now=t0 + 150) is None  # past the stall bound (100 s) from the frames
    failure = dog.check(now=t0 + 181)  # ... not from the reduce's start
    assert failure and "not reported the stage's end for 101 s" in failure, failure
    # without the reduce's start the same silence fails at the bound from the frames
    other, dog2, t1 = analyze_started(tmp_path / "other")
    dog2.check(now=t1)
    write_progress(other.progress_path(0), 100)
    assert dog2.check(now=t1 + 1) is None and dog2.check(now=t1 + 150) is not None


def test_a_slow_analysis_gets_a_stall_bound_from_its_own_time_per_frame(tmp_path):
    plan, dog, t0 = analyze_started(tmp_path)
    dog.check(now=t0)
    write_progress(plan.progress_path(0), 2)  # 2 frames by 2 ranks in 40 s: 40 s per frame
    assert dog.check(now=t0 + 40) is None
    assert dog.check(now=t0 + 40 + 700) is None  # below 20 x 40 s
    assert dog.check(now=t0 + 40 + 801) is not None


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.sampled_from(["submitted", "launched", "job started", "active",
                                           "restarted"]), st.floats(0, 50)), max_size=12))
def test_the_pilot_is_never_failed_before_the_bound_of_the_phase_it_is_in(events):
    """Whatever order the child's events come in, a failure comes only once the current
    phase has lasted its bound, and then it comes."""
    dog = Watchdog("session=100,submit=100,start=100", "/")
    dog.say = lambda line: None
    now = 0.0
    dog.pilot_event("batch", now=now)
    for kind, gap in events:
        now += gap
        dog.pilot_event(kind, now=now)
        clock = dog.pilot
        assert dog.check(now=now + 99) is None
        if clock is None or clock.phase == "queue":  # active, or the queue's unbounded wait
            assert dog.check(now=now + 10 ** 6) is None
        else:  # and at its bound it does fail, naming the phase
            bound = 100 + (START_GRACE_S if clock.phase == "start" else 0)
            assert dog.check(now=clock.since + bound - 0.5) is None
            failure = dog.check(now=clock.since + bound + 0.01)  # (float rounding at the bound)
            assert failure is not None and f"--limits {clock.phase}=S" in failure, failure


def test_a_run_waits_for_the_pilot_and_for_the_runs_before_it_without_failing(tmp_path):
    """Stages are submitted before the pilot is up (the queue is not theirs to wait), and
    the runs of a one-at-a-time batch wait for each other by design."""
    first, second = plan_in(tmp_path / "a"), plan_in(tmp_path / "b")
    dog, _ = watchdog(tmp_path, "task=60")
    dog.pilot_event("batch", now=0)
    dog.pilot_event("submitted", now=1)
    dog.pilot_event("launched", now=2)
    dog.one_at_a_time(["a", "b"])
    dog.run_event("a", first, "split", "submitted", now=2)
    dog.run_event("b", second, "split", "submitted", now=2)
    assert dog.check(now=5000) is None  # still in the batch queue: unbounded
    dog.pilot_event("active", now=5000)
    assert dog.check(now=5059) is None
    assert dog.check(now=5061).startswith("a's split stage waited 61 s")
    mark_started(first.workdir, "split")
    assert dog.check(now=5062) is None
    dog.run_ended("a", now=9000)  # b's turn only now
    assert dog.check(now=9059) is None
    assert dog.check(now=9061).startswith("b's split stage waited 61 s")


def test_a_resumed_stage_is_seen_starting_by_its_marker_changing(tmp_path):
    """An earlier attempt's marker is there already; a file server's clock may differ:
    a change of the marker is what counts."""
    plan = plan_in(tmp_path)
    mark_started(plan.workdir, "reduce")
    os.utime(started := os.path.join(plan.workdir, "progress", "started.reduce"), (1e9, 1e9))
    dog, _ = watchdog(tmp_path, "task=60")
    dog.pilot_event("active", now=0)
    dog.run_event("r", plan, "reduce", "submitted", now=0)
    assert dog.check(now=61) is not None  # the old marker is not a start
    dog.run_event("r", plan, "reduce", "submitted", now=100)
    os.utime(started, (2e9, 2e9))  # a task touched it, with a clock far from ours
    assert dog.check(now=10 ** 6) is None


def test_stopped_processes_are_recognised(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "trajflow.tasks.analyze", str(tmp_path / "plan.json")])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.time() + 10
        while process_state(proc.pid) != "T" and time.time() < deadline:
            time.sleep(0.05)
        assert stopped_tasks(str(tmp_path)) == [proc.pid]
        dog = Watchdog("", str(tmp_path), child_pid=proc.pid)
        assert "is stopped (SIGSTOP" in dog._stopped_note()
    finally:
        proc.kill()
        proc.wait()


def test_a_stop_signal_is_named_with_who_likely_sent_it(monkeypatch):
    assert describe_stop(signal.SIGINT) == "interrupted by Ctrl-C (SIGINT)"
    assert describe_stop(signal.SIGHUP) == ("stopped by SIGHUP (its terminal or SSH connection "
                                            "closed)")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert "SLURM job 4242" in describe_stop(signal.SIGTERM)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    said = "import signal; from trajflow.workflows.run.signals import describe_stop; " \
           "print(describe_stop(signal.SIGTERM))"
    under_timeout = subprocess.run(["timeout", "60", sys.executable, "-c", said],
                                   capture_output=True, text=True, timeout=90, env=env)
    assert "probably `timeout` (pid" in under_timeout.stdout, under_timeout.stderr
    plain = subprocess.run([sys.executable, "-c", said], capture_output=True, text=True,
                           timeout=90, env=env)
    assert "stopped by SIGTERM (sent by another process" in plain.stdout, plain.stderr
