"""The client-side fixes to EnTK and RADICAL-Pilot (workflows/entk_client.py), off the pilot.

Their effect on a real run is measured by `trajflow bench` and exercised by
every pilot test; here each is checked to do exactly what it says and no more.
"""
import subprocess
import sys
import threading
import time
import types

import pytest

from trajflow.tasks import procfs
from trajflow.workflows.run import entk_client


def _prof(path, events):
    path.write_text("#time,event,comp,thread,uid,state,msg\n" + "".join(
        f"{1000.0 + i:.6f},{e},bootstrap_0,MainThread,pilot.0000,PMGR_ACTIVE,\n"
        for i, e in enumerate(events)))


def test_last_event_of_a_radical_profile(tmp_path):
    prof = tmp_path / "bootstrap_0.prof"
    assert entk_client._last_event(str(prof)) is None  # not there (yet)
    _prof(prof, ["bootstrap_0_start", "agent_gone", "END"])
    assert entk_client._last_event(str(prof)) == "END"
    _prof(prof, ["x" * 40] * 50 + ["cleanup_stop"])  # longer than the tail it reads
    assert entk_client._last_event(str(prof)) == "cleanup_stop"


class _Pilot:
    uid = "pilot.0000"

    def __init__(self, sandbox):
        self.pilot_sandbox = f"file://localhost{sandbox}/"
        self.state = "PMGR_ACTIVE"


class _PilotManager:
    def __init__(self):
        self.killed = []

    def kill_pilots(self, uid):
        self.killed.append(uid)


def test_local_bootstrapper_is_ended_only_once_it_has_recorded_END(tmp_path):
    prof = tmp_path / "bootstrap_0.prof"
    _prof(prof, ["bootstrap_0_start", "bootstrap_0_ok"])  # agent still running
    pilot, pmgr = _Pilot(tmp_path), _PilotManager()
    watcher = threading.Thread(target=entk_client.end_local_bootstrapper, args=(pmgr, pilot, 10))
    watcher.start()
    time.sleep(0.5)
    assert pmgr.killed == []
    _prof(prof, ["bootstrap_0_start", "bootstrap_0_ok", "agent_gone", "cleanup_stop", "END"])
    watcher.join(5)
    assert not watcher.is_alive() and pmgr.killed == ["pilot.0000"]


def test_a_bootstrapper_without_END_is_left_to_radical(tmp_path):
    _prof(tmp_path / "bootstrap_0.prof", ["gtod_stop"])  # what it writes without profiling
    pilot, pmgr = _Pilot(tmp_path), _PilotManager()
    entk_client.end_local_bootstrapper(pmgr, pilot, patience_s=0.5)
    assert pmgr.killed == []
    pilot.state = "DONE"  # ended on its own meanwhile: nothing to do, at once
    entk_client.end_local_bootstrapper(pmgr, pilot, patience_s=60)
    assert pmgr.killed == []


APPMANAGER_CHECK = """
import os, sys, time as real_time, traceback
try:
    from radical.entk.appman import appmanager as module
    from trajflow.workflows.run import entk_client
    slept = []
    real_time.sleep = lambda s: slept.append(s)
    pilot = {"resource": "local.localhost", "walltime": 10, "cpus": 1}
    appman = entk_client.new_appmanager(pilot, autoterminate=False, base_path=os.getcwd())
    # EnTK's own sleep(1) did not run (other threads' short polls may show here)
    assert module.time is real_time and not [s for s in slept if s >= 0.5], slept
    assert appman._zmq_info["put"] and appman._zmq_info["get"]  # its queue is there
    # paced after the pilot description made EnTK's resource manager anew
    assert getattr(appman._rmgr.get_resource_allocation_state, "_trajflow_paced", False)
    print("checked", flush=True)
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
os._exit(0)  # EnTK's bridge threads are never ended: no normal exit
"""


def test_appmanager_is_made_without_its_sleep_and_time_is_given_back(tmp_path):
    """In a Python of its own: an AppManager starts ZMQ bridge threads that nothing
    ends, and their context, collected later in a test worker, blocks in term() for
    good (a later, unrelated test of the worker hung 600 s in CI)."""
    child = subprocess.run([sys.executable, "-c", APPMANAGER_CHECK], cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0 and "checked" in child.stdout, child.stderr[-3000:]


@pytest.mark.serial  # gives its processes 0.3 s to start: run alone
def test_reaping_ends_a_stopped_task_whose_launcher_is_gone_by_its_environment():
    """RP's cancel ends a task's launch.sh; a rank stopped with SIGSTOP outlived it,
    orphaned. It is found by the ids RP puts in every task's environment: the task of
    this session goes (stopped or not), another session's task, a process of this
    session without a task id (an agent) and the caller's own group stay."""
    import os
    import signal
    import subprocess
    sid = "re.session.test-reap-env-0000"

    def fake(env, own_session=True):
        return subprocess.Popen(["sleep", "60"], start_new_session=own_session,
                                env={**os.environ, **env})
    task = {"RP_SESSION_ID": sid, "RP_TASK_ID": "task.000001"}
    stopped = fake(task)
    running = fake({**task, "RP_TASK_ID": "task.000002"})
    other_session = fake({**task, "RP_SESSION_ID": "re.session.other-0000"})
    agent = fake({"RP_SESSION_ID": sid})
    in_our_group = fake(task, own_session=False)
    os.kill(stopped.pid, signal.SIGSTOP)
    time.sleep(0.3)
    try:
        entk_client.reap_local_tasks(sid, grace_s=0.5)
        assert stopped.wait(timeout=5) == -signal.SIGTERM  # its SIGCONT delivered it
        assert running.wait(timeout=5) == -signal.SIGTERM
        for survivor in (other_session, agent, in_our_group):
            assert survivor.poll() is None
    finally:
        for p in (stopped, running, other_session, agent, in_our_group):
            p.kill()
            p.wait()


@pytest.mark.serial  # gives its processes 0.3 s to start: run alone
def test_reaping_ends_task_launchers_only_never_the_clients_own_group(tmp_path):
    """A task's launch script in a session of its own is ended; the pilot job's
    wrapper (psij's single_launch.sh, under the same session folder) and anything
    in the caller's own process group survive, even a look-alike launcher."""
    import os
    import subprocess
    sid = "re.session.test-reap-0000"
    base = f"{tmp_path}/{sid}"

    def fake(argv0, own_session):
        return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep 60'],
                                start_new_session=own_session)
    task = fake(f"{base}/pilot.0000/task.000003/task.000003.launch.sh", True)
    wrapper = fake(f"{base}/single_launch.sh", True)
    in_our_group = fake(f"{base}/pilot.0000/task.000004/task.000004.launch.sh", False)
    other_session = fake(f"{tmp_path}/re.session.other/pilot.0000/task.000000/task.000000.launch.sh",
                         True)
    time.sleep(0.3)
    try:
        entk_client.reap_local_tasks(sid, grace_s=0.5)
        assert task.wait(timeout=5) == -15
        for survivor in (wrapper, in_our_group, other_session):
            assert survivor.poll() is None
        assert os.getpgid(0) == os.getpgid(in_our_group.pid)
    finally:
        for p in (task, wrapper, in_our_group, other_session):
            p.kill()
            p.wait()


@pytest.mark.serial  # judges time: run alone (see the Makefile)
def test_reaping_ends_a_bootstrapper_left_running_and_what_it_started(tmp_path):
    """A pilot whose start hung is cancelled while its bootstrapper still sleeps in a
    pre-bootstrap command (seen: the `sleep` outlived the run by 30 s, until the guard
    ended it). The bootstrapper shares the caller's process group, so it and its
    children are ended by pid; another session's bootstrapper stays."""
    import os
    import subprocess
    sid = "re.session.test-reap-boot-0000"

    def bootstrapper(session, command):
        script = tmp_path / session / "pilot.0000" / "bootstrap_0.sh"
        script.parent.mkdir(parents=True)
        script.write_text(command + "\n")
        return subprocess.Popen(["bash", str(script).replace("/pilot.0000/", "/pilot.0000//"),
                                 "-s", session])  # as RP starts it, in our group
    ours = bootstrapper(sid, "sleep 60")  # a child, as a pre-bootstrap command is
    other = bootstrapper("re.session.other-boot-0000", "sleep 60")
    time.sleep(0.3)

    def children_of(pid):
        return [p for p in os.listdir("/proc") if p.isdigit() and
                open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(pid)]
    children, others = children_of(ours.pid), children_of(other.pid)
    assert children and others, "a bootstrapper's sleep did not start"
    try:
        entk_client.reap_local_tasks(sid, grace_s=2)
        assert ours.wait(timeout=5) != 0
        assert not any(os.path.exists(f"/proc/{p}") and procfs.state(int(p)) not in (None, "Z")
                       for p in children)
        assert other.poll() is None and all(procfs.state(int(p)) == "S" for p in others)
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
        for pid in children + others:  # not left for the next 60 s
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass


def test_a_paced_loop_wakes_at_news_and_otherwise_after_its_poll():
    """A pipeline joining the workflow (or a task ending) ends EnTK's paced pauses at once;
    with no news a pause lasts its poll (the loop's idle rate is unchanged)."""
    wakes = entk_client._Wakes
    wakes.enqueue.clear()
    wakes.run_loop.clear()  # (news of an earlier test in this process)
    t0 = time.monotonic()
    wakes.pause(wakes.enqueue, 0.2)
    assert 0.19 <= time.monotonic() - t0 < 2.0  # no news: the whole poll

    paused = []

    def loop(event):
        t = time.monotonic()
        wakes.pause(event, 30.0)
        paused.append(time.monotonic() - t)
    threads = [threading.Thread(target=loop, args=(e,)) for e in (wakes.enqueue, wakes.run_loop)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    entk_client.LiveWorkflow().add(types.SimpleNamespace(_validate=lambda: None))
    for t in threads:
        t.join(10)
    assert len(paused) == 2 and all(0.25 < p < 5.0 for p in paused), paused  # both woke
    assert not wakes.enqueue.is_set() and not wakes.run_loop.is_set()  # each took its news


def test_a_stage_completes_once_whatever_updates_of_its_ended_tasks_follow():
    """EnTK's dequeue checks a task's stage after each update it takes for the task: a
    second update of an ended task ran the stage's post_exec again (a second reduce)
    and moved the pipeline past its next stage, which never ran (CI: a reduce "ended
    SUBMITTING"). With cancellable_tasks' check, the stage completes once."""
    import logging
    import radical.entk as re
    from radical.entk import states
    from radical.entk.appman.wfprocessor import WFprocessor
    entk_client.cancellable_tasks()
    pipe, first, second = re.Pipeline(), re.Stage(), re.Stage()
    for stage, n in ((first, 2), (second, 1)):
        tasks = [re.Task() for _ in range(n)]
        for task in tasks:
            task.executable = "/bin/true"
        stage.add_tasks(tasks)
    post_execs = []
    first.post_exec = lambda: post_execs.append(first.uid)
    pipe.add_stages([first, second])
    wfp = WFprocessor.__new__(WFprocessor)  # its dequeue alone: no queues, no threads
    quiet = types.SimpleNamespace(prof=lambda *a, **k: None, ok=lambda *a: None,
                                  info=lambda *a: None, error=lambda *a: None)
    wfp.__dict__.update(_workflow=[pipe], _resubmit_failed=False, _uid="wfprocessor.test",
                        _logger=logging.getLogger("trajflow.test"), _prof=quiet, _report=quiet)

    def dequeued(task, state):
        wfp._update_dequeued_task(types.SimpleNamespace(
            uid=task.uid, parent_pipeline={"uid": pipe.uid}, parent_stage={"uid": first.uid},
            path=None, rts_uid=None, metadata={}, state=state, exception=None,
            exception_detail=None))

    a, b = list(first.tasks)
    dequeued(a, states.DONE)
    assert post_execs == [] and pipe._cur_stage == 1
    dequeued(b, states.DONE)
    assert post_execs == [first.uid] and pipe._cur_stage == 2 and first.state == states.DONE
    dequeued(b, states.DONE)  # a second update of an ended task
    dequeued(a, states.DONE)
    assert post_execs == [first.uid] and pipe._cur_stage == 2 and not pipe.completed
