"""A run's wall time is one number, from the call to its end, and its parts add up to it
(workflows/profile/wall_time.py); no pilot."""
import json

import pytest
from hypothesis import given, settings, strategies as st

from trajflow.workflows.profile.wall_time import (COLLECTING, describe, wall_time,
                                                  whole_from_outcome)


def task(uid, stage, queued, cores, stop, run="r"):
    """The record of a task's one rank, with the RADICAL events the run keeps."""
    return {"run": run, "task": stage, "rp_task_id": uid, "t_start": cores + 0.2, "t_stop": stop,
            "radical": {"queued": queued, "cores": cores, "launch_start": cores + 0.01,
                        "launch_stop": stop}}


def test_a_run_behind_others_on_a_held_pilot_has_every_second_named():
    records = [task("t.0", "split", 57.0, 57.0, 60.0),
               task("t.1", "analyze", 61.0, 61.0, 64.0),
               task("t.2", "analyze", 61.0, 64.0, 66.0),  # waits for its sibling's core
               task("t.3", "reduce", 67.0, 69.0, 70.0)]   # waits while another run holds both
    handover = {"handed_at": 51.0, "dispatched_at": 55.0}
    wall = wall_time(records, 50.0, handover, pilot=(40.0, 45.0), ended=71.0)
    assert wall["parts"] == pytest.approx({
        "planning": 1.0, "in the pilot's queue": 4.0, "pilot start": 0.0, "hand-over": 2.0,
        "split": 3.0, "analyze": 5.0, "reduce": 1.0, "in the agent's scheduler": 2.0,
        "between stages": 2.0, COLLECTING: 1.0})
    assert wall["whole"] == 21.0 == whole_from_outcome(50.0, {**handover, "ended": 71.0})
    assert describe(wall).startswith("21.0 s (1.0 s planning, 4.0 s in the pilot's queue, "
                                     "2.0 s hand-over, 3.0 s split")


def test_the_reduce_an_mpi_analyze_task_does_at_its_end_is_reduce_time():
    """The gather's root publishes the result in the analyze task (no RADICAL task of its
    own): its record's span, inside the analyze task's, is reduce's."""
    records = [task("t.1", "analyze", 10.0, 10.0, 14.0),
               {"run": "r", "task": "reduce", "rp_task_id": None, "t_start": 12.5,
                "t_stop": 13.5, "within_task": "analyze", "radical": {}}]
    wall = wall_time(records, 9.0, {"handed_at": 9.5, "dispatched_at": 9.5}, ended=14.5)
    assert wall["parts"] == pytest.approx({
        "planning": 0.5, "in the pilot's queue": 0.0, "hand-over": 0.5, "analyze": 3.0,
        "reduce": 1.0, "in the agent's scheduler": 0.0, "between stages": 0.0,
        COLLECTING: 0.5})


def test_a_pilot_started_for_the_run_is_its_own_part():
    records = [task("t.0", "analyze", 80.0, 80.0, 90.0)]
    wall = wall_time(records, 50.0, {"handed_at": 52.0, "dispatched_at": 52.5},
                     pilot=(53.0, 75.0), ended=91.0)
    assert wall["parts"]["pilot start"] == pytest.approx(22.5)
    assert wall["parts"]["hand-over"] == pytest.approx(5.0)


def test_a_folder_without_the_moments_still_adds_up():
    """An older run (no handover moments, no scheduler events) and a campaign's
    experiment (no call: timed from its hand-over)."""
    rec = {"run": "r", "task": "analyze", "t_start": 100.0, "t_stop": 104.0, "t_launch": 1.0}
    wall = wall_time([rec], 90.0, None, None, 105.0)
    assert wall["parts"] == pytest.approx({"before the first task": 9.0, "analyze": 5.0,
                                           "in the agent's scheduler": 0.0, "between stages": 0.0,
                                           COLLECTING: 1.0})
    assert wall_time([rec], 0.0, {"handed_at": 95.0}, None, 105.0)["whole"] == 10.0
    assert whole_from_outcome(0.0, {"handed_at": 95.0, "ended": 105.0}) == 10.0
    assert whole_from_outcome(0.0, {"ended": 105.0}) is None


moment = st.floats(1.0, 200.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(asked=moment, handed=st.none() | moment, dispatched=st.none() | moment,
       pilot=st.none() | st.tuples(moment, st.none() | moment),
       tasks=st.lists(st.tuples(st.sampled_from(["split", "analyze", "reduce"]),
                                moment, st.floats(0, 20), st.floats(0, 20)), max_size=8),
       ended=st.none() | moment)
def test_the_parts_are_never_negative_and_add_up_to_the_whole(asked, handed, dispatched, pilot,
                                                             tasks, ended):
    records = [task(f"t.{i}", stage, q, q + wait, q + wait + run)
               for i, (stage, q, wait, run) in enumerate(tasks)]
    handover = {k: v for k, v in (("handed_at", handed), ("dispatched_at", dispatched)) if v}
    wall = wall_time(records, asked, handover, pilot, ended)
    assert all(s >= 0 for s in wall["parts"].values()), wall
    assert sum(wall["parts"].values()) == pytest.approx(wall["whole"], abs=1e-9)
    if ended and ended >= max([asked, handed or 0, dispatched or 0]
                              + [q + w + r for _, q, w, r in tasks]):
        assert wall["whole"] == pytest.approx(whole_from_outcome(asked, {**handover,
                                                                         "ended": ended}))
    json.dumps(wall)  # what inspect --json gives


def test_the_scheduler_and_pilot_lines_are_kept_in_the_run_folder(tmp_path):
    """collect() keeps, beside each task's RADICAL files, its lines of the agent
    scheduler's profile, and the pilot's own lines: the run folder alone then says when
    a task waited for cores and when its pilot became active."""
    from trajflow.workflows.profile.advice import pilot_active
    from trajflow.workflows.profile.inspection import radical_task_events
    from trajflow.workflows.run.outcomes import (keep_pilot_events, keep_task_files,
                                                 TaskOutcome)
    pilot = tmp_path / "re.session.x1" / "pilot.0000"
    (pilot / "task.000001").mkdir(parents=True)
    (pilot / "task.000001" / "task.000001.prof").write_text(
        "12.0,launch_start,,M,task.000001,AGENT_EXECUTING,\n")
    (pilot / "agent_scheduling.0000.prof").write_text(
        "10.0,advance,agent_scheduling.0000,T,task.000001,AGENT_SCHEDULING,\n"
        "10.0,advance,agent_scheduling.0000,T,task.000009,AGENT_SCHEDULING,\n"  # another run's
        "11.5,schedule_ok,agent_scheduling.0000,T,task.000001,,\n")
    (pilot / "bootstrap_0.prof").write_text("1.0,bootstrap_0_start,b,M,pilot.0000,P,\n")
    (pilot / "agent_0.prof").write_text("5.0,advance,agent_0,M,pilot.0000,PMGR_ACTIVE,\n"
                                        "10.0,advance,agent_0,M,task.000001,X,\n")
    run = tmp_path / "run"
    run.mkdir()
    o = TaskOutcome("p", "analyze", 1, "analyze", "DONE", 0, str(pilot / "task.000001"), "")
    keep_task_files(o, str(run / "radical"))
    keep_pilot_events([o], str(run / "radical"))
    events = radical_task_events(str(run))
    kept = {"queued": 10.0, "cores": 11.5, "launch_start": 12.0}
    assert events == {("re.session.x1", "task.000001"): kept, (None, "task.000001"): kept}
    assert pilot_active(str(run)) == (1.0, 5.0)


def test_a_resumed_runs_earlier_attempt_is_not_in_its_wall_time():
    """The records of an attempt that ended before this one was asked for are not this
    attempt's: its time before its tasks is named, not put "between stages"."""
    records = [task("t.0", "split", 10.0, 10.0, 12.0),       # the first attempt's
               task("t.0", "analyze", 61.0, 61.0, 64.0, run="r")]
    records[1]["rp_task_id"] = "t.5"
    wall = wall_time(records, 50.0, {"handed_at": 52.0, "dispatched_at": 53.0}, None, 65.0)
    assert wall["parts"]["hand-over"] == pytest.approx(8.0)
    assert wall["parts"]["between stages"] == 0.0 and "split" not in wall["parts"]


def test_an_interrupted_run_has_no_end_and_its_tasks_still_count():
    """A client killed mid-run leaves the handover's record (its `ended` the moment of
    the handover): no wall time in `runs`, and `inspect` counts to the last task."""
    from trajflow.tasks.rundir import INTERRUPTED
    from trajflow.workflows.profile.wall_time import ended_at
    outcome = {"status": "failed", "error": INTERRUPTED, "ended": 51.0, "handed_at": 51.0}
    assert ended_at(outcome) is None and whole_from_outcome(50.0, outcome) is None
    wall = wall_time([task("t.1", "analyze", 60.0, 60.0, 70.0)], 50.0, outcome, None,
                     ended_at(outcome))
    assert wall["whole"] == 20.0 and not wall["ended"]


def test_a_planted_record_cannot_take_a_parts_name():
    wall = wall_time([task("t.1", "collecting", 60.0, 60.0, 70.0)], 50.0, None, None, 75.0)
    assert wall["parts"]["collecting (tasks)"] == 10.0 and wall["parts"]["collecting"] == 5.0
    assert sum(wall["parts"].values()) == pytest.approx(wall["whole"])


def test_a_resumed_runs_task_ids_repeat_in_its_new_session():
    """EnTK numbers a new client's tasks from task.000000 again: a kept record of the
    first attempt and a task of the second with the same id are two tasks."""
    old = task("task.000001", "analyze", 10.0, 10.0, 20.0)
    old["rp_session"] = "re.session.1"
    new = task("task.000001", "reduce", 220.0, 229.0, 231.5)
    new["rp_session"] = "re.session.2"
    wall = wall_time([old, new], 200.0, {"handed_at": 201.0, "dispatched_at": 202.0}, None,
                     240.0)
    assert wall["parts"] == pytest.approx({
        "planning": 1.0, "in the pilot's queue": 1.0, "hand-over": 18.0, "reduce": 2.5,
        "in the agent's scheduler": 9.0, "between stages": 0.0, COLLECTING: 8.5})
