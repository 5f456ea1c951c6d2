"""entk_client's live workflow: pipelines join while EnTK's run() runs, each is handed
on as it completes, run() ends when the workflow is closed and empty, and a failure
of the thread feeding it (or of the handing on) is raised as itself. EnTK's
AppManager is stood in for by its run() and the attributes run_live's loop uses (its
mock RTS does not complete pipelines in 1.103); the real one runs in tests/pilot."""
import threading
import time

import pytest

from trajflow.workflows.run.entk_client import CompletionFailed, LiveWorkflow, run_live


class Pipe:
    def __init__(self, name):
        self.name, self.uid, self.state = name, f"pipeline.{name}", "SCHEDULING"
        self.lock = threading.Lock()
        self.completed = False
        self.validated = 0

    def _validate(self):
        self.validated += 1


class Resources:
    def get_completed_states(self):
        return ["DONE", "FAILED", "CANCELED"]

    def get_resource_allocation_state(self):
        time.sleep(0.01)
        return "PMGR_ACTIVE"


class Alive:
    def is_alive(self):
        return True

    def check_processor(self):
        return True


class AppManager:
    """What run_live uses of EnTK's AppManager; run() as EnTK's: its loop, an exception
    wrapped in an error of its own (EnTKError there) from the original."""

    def __init__(self):
        self._rmgr, self._sync_thread, self._wfp = Resources(), Alive(), Alive()
        self._cur_attempt, self._reattempts = 1, 3
        self._term = threading.Event()
        self._workflow = None

    def _run_workflow(self):
        raise AssertionError("EnTK's own loop ran, not run_live's")

    def run(self):
        try:
            self._run_workflow()
        except Exception as exc:
            raise RuntimeError(exc) from exc


def test_pipelines_join_while_it_runs_and_each_is_handed_on_once():
    workflow, appman, done = LiveWorkflow(), AppManager(), []
    first = Pipe("first")
    workflow.add(first)

    def feed():
        later = [Pipe(f"p{i}") for i in range(5)]
        for pipe in later:
            workflow.add(pipe)   # while run_live iterates its snapshots
            time.sleep(0.02)
        for pipe in [first] + later:
            with pipe.lock:
                pipe.completed = True
            time.sleep(0.02)
        workflow.close()
    feeder = threading.Thread(target=feed)
    feeder.start()
    run_live(appman, workflow, lambda pipe: done.append(pipe.name))
    feeder.join(10)
    assert done == ["first"] + [f"p{i}" for i in range(5)]
    assert len(workflow) == 0 and first.validated == 1  # validated once: EnTK refuses twice
    assert appman._run_workflow.__func__ is AppManager._run_workflow  # EnTK's loop back


def test_an_empty_live_workflow_is_not_missing_and_a_closed_one_ends_at_once():
    workflow = LiveWorkflow()
    assert workflow and len(workflow) == 0  # EnTK's run() refuses a falsy workflow
    workflow.close()
    run_live(AppManager(), workflow, lambda pipe: None)


def test_an_error_of_handing_on_a_pipeline_is_raised_as_itself():
    workflow, pipe = LiveWorkflow(), Pipe("full")
    pipe.completed = True
    workflow.add(pipe)

    def handed_on(_pipe):
        raise OSError(28, "No space left on device")
    with pytest.raises(CompletionFailed) as raised:
        run_live(AppManager(), workflow, handed_on)
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.__cause__.errno == 28


def test_a_failure_of_the_thread_feeding_it_ends_run_with_that_failure():
    workflow = LiveWorkflow()
    workflow.add(Pipe("never"))
    threading.Timer(0.1, workflow.fail, args=(ValueError("a bad batch"),)).start()
    with pytest.raises(CompletionFailed) as raised:
        run_live(AppManager(), workflow, lambda pipe: None)
    assert str(raised.value.__cause__) == "a bad batch"


def test_a_failed_pipeline_fails_the_run_as_entk_does():
    workflow, pipe = LiveWorkflow(), Pipe("bad")
    pipe.state = "FAILED"
    workflow.add(pipe)
    with pytest.raises(RuntimeError, match="Pipeline pipeline.bad failed"):
        run_live(AppManager(), workflow, lambda pipe: None)
