"""EnTK and RADICAL-Pilot's client, as trajflow holds it on a workstation.

Each function here works around one thing measured in EnTK 1.103 /
RADICAL-Pilot 1.103 that cost every run time, a core, or a clean folder:
  working_dir        RP put its session folder in the user's cwd ($PWD stale)
  new_appmanager     AppManager() slept 1 s after starting its ZMQ queue;
                     each RADICAL client process was a new Python importing
                     RADICAL (component_starter forks them from one)
  early_task_manager run() started its task manager (a RADICAL session, its
                     bridges and components: 2.4 s) only once the pilot was
                     active, so no task went before then
  pace_entk          three client loops spun a core or slept 10 s
  quiet_components   RP's subscribers took up to 0.5 s each to stop, and its
                     listeners, timed callbacks and watchers woke 10-100 times a
                     second for nothing (tasks/quiet_components.py)
  LiveWorkflow       AppManager.run() took one fixed set of pipelines: a
                     run sent meanwhile waited for the whole set to end
  cancel_tasks       EnTK could not cancel one run's tasks: its stage never
                     completed with a CANCELED task in it
  shutdown           EnTK stopped its threads before cancelling the pilot;
                     a local pilot's bootstrapper waited ~4 s for profiles
                     that RP's own bridges never end
  reap_local_tasks   a cancelled local pilot left its tasks running
Every patch is to the client process only, and is skipped, harmlessly, if
the code it expects is not there.
"""
import contextlib
import glob
import logging
import os
import queue as std_queue
import re
import shutil
import signal
import threading
import time
import types
import weakref

from trajflow.tasks.client_guard import remove_task_tmp
from trajflow.tasks import procfs
from trajflow.tasks.component_starter import use_forked_starts
from trajflow.tasks.task_server import SERVER_COMMAND as TASK_SERVER_TITLE

log = logging.getLogger(__name__)


@contextlib.contextmanager
def working_dir(path):
    """chdir, and $PWD with it: RADICAL-Pilot puts its client session under
    ${RADICAL_PILOT_BASE:$PWD}, and os.chdir() alone left every run's RP
    session folder in the user's working directory (seen)."""
    old, old_pwd = os.getcwd(), os.environ.get("PWD")
    os.makedirs(path, exist_ok=True)
    os.chdir(path)
    os.environ["PWD"] = os.path.abspath(path)
    try:
        yield
    finally:
        os.chdir(old)
        if old_pwd is None:
            os.environ.pop("PWD", None)
        else:
            os.environ["PWD"] = old_pwd


def new_appmanager(resource_desc, **kwargs):
    """An EnTK AppManager for the pilot `resource_desc`, paced (see pace_entk;
    after the description is set, which makes EnTK a new resource manager: a
    pacing done before is lost, seen), made without the fixed 1 s
    sleep its constructor takes after starting its ZMQ queue bridge: the
    bridge's sockets are bound before start() returns (radical.utils binds them
    in its constructor), and ZMQ queues what is sent before the bridge thread
    polls, so there is nothing to wait for. RADICAL's client processes start
    by fork from then on (component_starter), and EnTK's queue bridge waits for
    messages (quiet_bridges)."""
    use_forked_starts()
    import radical.entk as re
    from radical.entk.appman import appmanager as module
    from trajflow.tasks.quiet_bridges import EntkQueue, quiet_bridges_of
    from trajflow.tasks.quiet_components import quiet_components
    quiet_bridges_of(module, EntkQueue)
    quiet_components()  # the client's RADICAL listeners, timed callbacks, watchers
    real_time = module.time
    module.time = _TimeWithoutSleep()
    try:
        appman = re.AppManager(**kwargs)
    finally:
        module.time = real_time
    appman.resource_desc = resource_desc
    pace_entk(appman)
    early_task_manager(appman)
    cancellable_tasks()
    return appman


def early_task_manager(appman, poll_s=0.05):
    """Start EnTK's task manager while the pilot starts, not once it is active.

    EnTK's run() requests the pilot and waits until it is active; only then does
    it make its TaskManager, whose thread starts a RADICAL-Pilot session with its
    bridges and components (2.4 s of a cold local run, measured) before any task
    can go. Here, as soon as the pilot is submitted (its request still waiting),
    the TaskManager is made as EnTK makes it; its start overlaps the pilot's
    bootstrap, and run()'s _start_all_comps finds it made (EnTK makes one only
    when there is none: a lock keeps the two apart). If making it fails here,
    EnTK makes it as before."""
    rmgr = getattr(appman, "_rmgr", None)
    submit = getattr(rmgr, "submit_resource_request", None)
    start_all = getattr(appman, "_start_all_comps", None)
    if submit is None or start_all is None or not hasattr(appman, "_task_manager") \
            or getattr(submit, "_trajflow_early", False):
        return
    lock = threading.Lock()

    def make_task_manager():
        from radical.entk.execman.rp import TaskManager
        with lock:
            if appman._task_manager is not None:
                return
            manager = TaskManager(sid=appman._sid, rmgr=rmgr, zmq_info=appman._zmq_info)
            manager.start_manager()
            try:
                appman._submit_rts_tmgr(rmgr.get_rts_info())
            except BaseException:
                manager.terminate_manager()
                raise
            appman._task_manager = manager  # only once it has the pilot

    def once_submitted(requested):
        import radical.pilot as rp
        launched = (rp.PMGR_ACTIVE_PENDING, rp.PMGR_ACTIVE)
        while not requested.wait(poll_s):
            # once the pilot's job is launched: a submission refused at once (a bad queue)
            # fails the pilot first, and the session is closed with no manager starting
            if getattr(rmgr.pilot, "state", None) in launched:
                try:
                    make_task_manager()
                except Exception as exc:  # EnTK's run() makes it then, as before
                    log.warning("starting EnTK's task manager early failed (%s: %s)",
                                type(exc).__name__, exc)
                return

    def submit_and_start():
        requested = threading.Event()
        helper = threading.Thread(target=once_submitted, args=(requested,), daemon=True,
                                  name="trajflow-early-task-manager")
        helper.start()
        try:
            return submit()
        finally:
            requested.set()
            helper.join()

    def start_all_comps():
        with lock:
            return start_all()
    submit_and_start._trajflow_early = True
    rmgr.submit_resource_request = submit_and_start
    appman._start_all_comps = start_all_comps


class _TimeWithoutSleep:
    """`time`, with sleep() a no-op: what AppManager's module sees while it is made."""
    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(_seconds):
        pass


class _Wakes:
    """What ends a paced loop's pause at once, instead of at `poll_s`: a pipeline joining
    the workflow (LiveWorkflow.add) or a task of it ending (EnTK's dequeue thread) wakes
    the WFprocessor's enqueue loop (the next stage may be ready) and the run() loop (a
    pipeline may have completed). Measured before: a run sent to a held pilot waited
    0.05 s before EnTK saw it, and up to 0.05 s after its last task for its end."""

    enqueue = threading.Event()
    run_loop = threading.Event()

    @classmethod
    def news(cls):
        cls.enqueue.set()
        cls.run_loop.set()

    @staticmethod
    def pause(event, poll_s):
        event.wait(poll_s)
        event.clear()


def pace_entk(appman, poll_s=0.05):
    """Make EnTK's client threads wait instead of spinning, and hear terminate() sooner.

    Seen here (py-spy on the process holding EnTK, a task sleeping): the
    process used a whole core all run long, which on a 2-core workstation is
    one core taken from the tasks. Three loops of EnTK 1.103 are paced, each
    at the one call it makes per turn:
    - WFprocessor's enqueue thread calls `_create_workload()` back to back:
      after a turn with nothing to submit it now pauses `poll_s`;
    - AppManager's `_run_workflow` loop polls the pipelines with no pause: its
      per-turn `get_resource_allocation_state()` now pauses `poll_s` first;
    - the task manager's submit thread waits on its queue with get(timeout=10)
      and terminate() joins it, so every teardown waited up to 10 s: its
      module's queue now waits at most 0.5 s per get (an empty get is already
      "look again" there).
    A pause ends early when there is news (_Wakes): new pipelines, stages and ended
    pipelines are seen at once, and otherwise within `poll_s`.
    """
    from radical.entk.appman import wfprocessor
    from radical.entk.execman.rp import task_manager

    create = wfprocessor.WFprocessor._create_workload
    if not getattr(create, "_trajflow_paced", False):
        def paced_create(self):
            workload, stages = create(self)
            if not workload:
                _Wakes.pause(_Wakes.enqueue, poll_s)
            return workload, stages
        paced_create._trajflow_paced = True
        wfprocessor.WFprocessor._create_workload = paced_create

    dequeued = wfprocessor.WFprocessor._update_dequeued_task
    if not getattr(dequeued, "_trajflow_paced", False):
        def dequeued_and_said(self, deq_task):
            try:
                return dequeued(self, deq_task)
            finally:
                _Wakes.news()
        dequeued_and_said._trajflow_paced = True
        wfprocessor.WFprocessor._update_dequeued_task = dequeued_and_said

    rmgr = getattr(appman, "_rmgr", None)
    get_state = getattr(rmgr, "get_resource_allocation_state", None)
    if get_state is not None and not getattr(get_state, "_trajflow_paced", False):
        def paced_state():
            _Wakes.pause(_Wakes.run_loop, poll_s)
            return get_state()
        paced_state._trajflow_paced = True
        rmgr.get_resource_allocation_state = paced_state

    if getattr(task_manager, "queue", None) is std_queue:
        class _PromptQueue(std_queue.Queue):
            def get(self, block=True, timeout=None):
                if block and timeout is not None and timeout > 0.5:
                    timeout = 0.5
                return super().get(block, timeout)
        task_manager.queue = types.SimpleNamespace(Queue=_PromptQueue, Empty=std_queue.Empty)


class LiveWorkflow:
    """EnTK's workflow, grown while AppManager.run() runs (see run_live).

    EnTK 1.103's run() takes one set of pipelines, counts them once, and
    returns when that many have completed: a run sent to a held pilot while
    another ran waited for the other's whole batch (measured: ten runs from
    ten clients took 18.6 s, batch after batch). Here pipelines join while
    EnTK runs. EnTK's threads (its WFprocessor's, its synchronizer, run()'s
    own loop) iterate the workflow while another thread adds to it, so each
    iteration is over a snapshot taken under a lock."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pipelines = []
        self.closed = False  # no more pipelines will come: run() ends once these have
        self.error = None    # what failed in the thread feeding it: run() ends with it

    def add(self, pipeline):
        pipeline._validate()  # what AppManager's workflow setter checks of each
        with self._lock:
            self._pipelines.append(pipeline)
        _Wakes.news()

    def discard(self, pipeline):
        with self._lock:
            if pipeline in self._pipelines:
                self._pipelines.remove(pipeline)

    def close(self):
        self.closed = True
        _Wakes.news()

    def fail(self, exc):
        """The thread feeding the workflow failed: run_live raises `exc` (as the cause of
        a CompletionFailed), rather than wait for pipelines that will never come."""
        self.error = exc
        self.closed = True
        _Wakes.news()

    def __iter__(self):
        with self._lock:
            return iter(list(self._pipelines))

    def __len__(self):
        with self._lock:
            return len(self._pipelines)

    def __bool__(self):  # never "no workflow assigned" to run(): it may fill later
        return True


class CompletionFailed(Exception):
    """run_live's on_completed raised inside EnTK's run(), or the workflow's feeder failed
    (LiveWorkflow.fail); the original is its __cause__."""


def run_live(appman, workflow, on_completed):
    """appman.run() over a LiveWorkflow, until it is closed and every pipeline in it
    has completed; `on_completed(pipeline)` is called in this thread as each one
    completes (it has left the workflow by then). Its loop is EnTK's own
    (AppManager._run_workflow: restart a dead synchronizer or WFprocessor, resubmit
    a pilot that ended, up to `reattempts`), but counts pipelines as they come.
    An exception of on_completed ends run() (EnTK then terminates the pilot), and
    is raised here as the __cause__ of a CompletionFailed."""
    from radical.entk import states
    from radical.entk.exceptions import EnTKError

    def run_workflow():
        final = appman._rmgr.get_completed_states()
        while not (workflow.closed and not len(workflow)):
            if appman._cur_attempt > appman._reattempts or appman._term.is_set():
                break
            if workflow.error is not None:
                raise CompletionFailed() from workflow.error
            for pipe in workflow:
                if pipe.state == states.FAILED:
                    raise EnTKError("Pipeline %s failed" % pipe.uid)
                with pipe.lock:
                    completed = pipe.completed
                if completed:
                    workflow.discard(pipe)
                    try:
                        on_completed(pipe)
                    except Exception as exc:
                        raise CompletionFailed() from exc
            if _restart_dead_components(appman) | _resubmit_ended_pilot(appman, final):
                appman._wfp.reset_workflow()
        if appman._cur_attempt > appman._reattempts:
            raise EnTKError("Too many failures in synchronizer, wfp or task manager")

    # not its setter, which validates each pipeline in it (LiveWorkflow.add did: a second
    # validation raises "Task ID ... already exists")
    appman._workflow = workflow
    appman._run_workflow = run_workflow  # EnTK's run() calls self._run_workflow()
    try:
        appman.run()
    except Exception as exc:
        if isinstance(exc.__cause__, CompletionFailed):
            raise exc.__cause__  # (its own __cause__, the original, kept)
        raise
    finally:
        del appman._run_workflow


def _restart_dead_components(appman):
    """What AppManager._run_workflow does when its synchronizer or WFprocessor died."""
    restarted = False
    if not appman._sync_thread.is_alive():
        appman._sync_thread = threading.Thread(target=appman._synchronizer,
                                               name="synchronizer-thread")
        appman._sync_thread.start()
        restarted = True
    if not appman._wfp.check_processor():
        appman._wfp.terminate_processor()
        appman._wfp.start_processor()
        restarted = True
    return restarted


def _resubmit_ended_pilot(appman, final):
    """What AppManager._run_workflow does when its pilot has ended: request another,
    while attempts remain (the call is paced: see pace_entk)."""
    if appman._rmgr.get_resource_allocation_state() not in final:
        return False
    appman._cur_attempt += 1
    if appman._cur_attempt > appman._reattempts:
        return False
    appman._rmgr.submit_resource_request()
    appman._submit_rts_tmgr(rts_info=appman._rmgr.get_rts_info())
    return True


_TASK_MANAGERS = weakref.WeakSet()  # RADICAL-Pilot's TaskManagers made in this process


def cancellable_tasks():
    """Let one run's tasks be cancelled while other runs go on (a held pilot's client's
    Ctrl-C). EnTK 1.103 offers no cancel: its RADICAL-Pilot TaskManager is a local
    of its task-manager thread, so each one made is remembered here (cancel_tasks);
    and a stage completes only when each task is DONE or FAILED, so a CANCELED task
    would have left its run's pipeline waiting for ever: it counts as ended too.

    A stage completes once. EnTK checks a task's stage after every update it dequeues
    for the task and, finding every task ended, runs the stage's post_exec and moves
    its pipeline on a stage, without asking whether it did so already: a second
    update of an ended task (seen in CI: a killed run resumed on a held pilot) ran
    the analyze stage's post_exec twice, added a second reduce and moved the pipeline
    past it, and the run failed with that reduce "ended SUBMITTING" beside a complete
    result. A stage already DONE is not complete again."""
    import radical.pilot as rp
    from radical.entk import states
    from radical.entk.stage import Stage
    init = rp.TaskManager.__init__
    if not getattr(init, "_trajflow_remembered", False):
        def remembered_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            _TASK_MANAGERS.add(self)
        remembered_init._trajflow_remembered = True
        rp.TaskManager.__init__ = remembered_init
    complete = Stage._check_stage_complete
    if not getattr(complete, "_trajflow_cancelled", False):
        def complete_or_cancelled(self):
            return self.state != states.DONE and all(
                task.state in (states.DONE, states.FAILED, states.CANCELED)
                for task in self._tasks)
        complete_or_cancelled._trajflow_cancelled = True
        Stage._check_stage_complete = complete_or_cancelled


def cancel_tasks(uids):
    """Ask RADICAL-Pilot to cancel these tasks (EnTK's task uids are RP's): the agent
    ends their processes, and they come back CANCELED. It does not wait."""
    for tmgr in list(_TASK_MANAGERS):
        try:
            tmgr.cancel_tasks(list(uids))
        except Exception as exc:  # noqa: a closed task manager; the others are asked all the same
            log.warning("cancelling tasks %s: %s: %s", ", ".join(uids), type(exc).__name__, exc)


def shutdown(appman, local=False):
    """Stop EnTK and the pilot, the slow parts side by side.

    EnTK's terminate() first stops its threads (see pace_entk) and only then
    cancels the pilot (RP waits up to 20 s for the agent). Cancelling the
    pilot in a thread meanwhile overlaps the two (4.7 s less, measured when
    the task manager still slept 10 s). On a local resource EnTK is also kept
    from downloading the pilot's profiles, which are on this disk already, and
    the bootstrapper is ended once its work is done (see end_local_bootstrapper).
    """
    rmgr = getattr(appman, "_rmgr", None)  # EnTK keeps its resource manager private
    pilot, pmgr = getattr(rmgr, "pilot", None), getattr(rmgr, "pmgr", None)
    helpers = []
    if pilot is not None and pmgr is not None:
        helpers.append(threading.Thread(target=pmgr.cancel_pilots, args=(pilot.uid,),
                                        kwargs={"_timeout": 20}, daemon=True))
        if local:
            helpers.append(threading.Thread(target=end_local_bootstrapper, args=(pmgr, pilot),
                                            daemon=True))
    for helper in helpers:
        helper.start()
    if local and "RADICAL_PROFILE" in os.environ:
        # EnTK downloads the pilot's profiles at close when this is set; on a
        # local resource they are on this disk already (the agent sandbox), and
        # the copy cost seconds of every run's teardown. The agent was started
        # with it, so the profiles are still written.
        del os.environ["RADICAL_PROFILE"]
    appman.terminate()
    for helper in helpers:
        helper.join(30)


def local_sandbox(pilot):
    """The pilot's sandbox as a path on this disk, or None while RP does not know it."""
    import radical.utils as ru
    sandbox = getattr(pilot, "pilot_sandbox", None)
    return ru.Url(sandbox).path.rstrip("/") if sandbox else None


def end_local_bootstrapper(pmgr, pilot, patience_s=20.0):
    """End a cancelled local pilot's bootstrapper once it has recorded END.

    RP's bootstrap_0.sh, after its agent has gone and its cleanup is done,
    writes END to bootstrap_0.prof and then waits `FINAL_SLEEP` (5 s, ~4 s of
    sleep) for every *.prof in the sandbox to end with END before it tars them
    for the client to download. RP's bridges and several agent components never
    write END (16 of 20 files, every run seen), so the wait always runs out.
    On a local resource nothing downloads those tarballs (see shutdown), so
    the pilot job is killed through RP (`kill_pilots`) as soon as END is
    there; the profiles themselves stay in the sandbox, complete. The pilot
    then ends CANCELED rather than DONE. Without RP profiling (no END) this
    gives up after `patience_s` and RP's own wait runs.
    """
    import radical.pilot as rp
    sandbox = local_sandbox(pilot)
    prof = os.path.join(sandbox, "bootstrap_0.prof")
    deadline = time.time() + patience_s
    while time.time() < deadline and pilot.state not in rp.FINAL:
        if _last_event(prof) == "END":
            pmgr.kill_pilots(pilot.uid)
            return
        wake_bootstrapper(sandbox)
        time.sleep(0.1)


def wake_bootstrapper(sandbox):
    """Once a local pilot's agent has gone, end the `sleep 3` its bootstrapper polls
    the agent with: bootstrap_0.sh looks for its agent every 3 s, so a cancel waited
    0-3 s more (2.6 s in three runs of one cold rmsd, seen) for nothing."""
    if not os.path.exists(os.path.join(sandbox, "agent_0.out")):
        return  # its agent never started: a sleep now is another wait of the bootstrapper's
    script = os.path.join(sandbox, "bootstrap_0.sh").encode()
    every = procfs.processes()
    boot = [p for p in every if _script_of(p.cmdline) == script]
    if len(boot) != 1:
        return
    children = [p for p in every if p.parent == boot[0].pid and p.state != "Z"]
    polls = [p for p in children if p.cmdline.split(b"\0")[:2] == [b"sleep", b"3"]]
    if polls and len(polls) == len(children):  # nothing but its poll: the agent is gone
        for p in polls:
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGTERM)


AGENT_LOGS = ("bootstrap_0.out", "bootstrap_0.err", "agent_0.log", "agent_0.out", "agent_0.err")


def remove_local_sandbox(appman, session_dir, keep_logs=False):
    """Remove a local pilot's session sandbox (~/radical.pilot.sandbox/<sid>: ~1.1 MB
    per run, 748 KB of it a copied `gtod` binary, plus ~18 KB per task, never
    removed by RADICAL-Pilot, seen) and its tasks' temp folder, keeping the
    pilot's own profiles (its start and end) in the client's session folder,
    <session_dir>/<pilot uid>/; with `keep_logs` (a pilot that failed or never
    came up) its bootstrapper's and agent's logs too: the only account of why."""
    pilot = getattr(getattr(appman, "_rmgr", None), "pilot", None)  # EnTK's, private
    pilot_sandbox = local_sandbox(pilot)
    if not pilot_sandbox:
        return
    session_sandbox = os.path.dirname(pilot_sandbox)
    if os.path.basename(session_sandbox) != appman.sid:
        return  # not the layout expected: leave it
    keep = os.path.join(session_dir, os.path.basename(pilot_sandbox))
    os.makedirs(keep, exist_ok=True)
    logs = [os.path.join(pilot_sandbox, name) for name in AGENT_LOGS] if keep_logs else []
    for path in glob.glob(os.path.join(pilot_sandbox, "*.prof")) + logs:
        if os.path.exists(path):
            shutil.copy2(path, keep)
    shutil.rmtree(session_sandbox, ignore_errors=True)
    remove_task_tmp(appman.sid)


def remove_id_counters(sid):
    """Remove radical.utils' id counters of a session that has ended
    ($RADICAL_BASE/.radical/utils/<sid>/, ~36 KB per session, never removed: 130
    folders after a day of runs here)."""
    import radical.utils as ru
    folder = os.path.join(ru.get_radical_base("utils"), sid)
    if sid and os.path.basename(folder) == sid:
        shutil.rmtree(folder, ignore_errors=True)


def _script_of(cmdline):
    """The script a shell's command line runs (its first argument that is not an
    option), normalised; None for anything else (psij's wrapper names the bootstrapper
    among its arguments, after a script of its own)."""
    args = cmdline.split(b"\0")
    if not args or os.path.basename(args[0]) not in (b"bash", b"sh"):
        return None
    script = next((a for a in args[1:] if not a.startswith(b"-")), None)
    return os.path.normpath(script) if script else None


def _last_event(prof_path):
    """The event name on a RADICAL profile's last line, or None."""
    try:
        with open(prof_path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 512))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    fields = lines[-1].split(",") if lines else []
    return fields[1] if len(fields) > 1 else None


def is_task_of_session(pid, sid):
    """Whether `pid` runs a task of session `sid`: RP's task environment says so, or it
    is a fork of the session's task server (tasks/task_server.py: a fork's environment
    as /proc shows it is the server's, and the server's command line names the pilot's
    sandbox)."""
    env = procfs.environment(pid)
    if b"RP_TASK_ID" in env and env.get(b"RP_SESSION_ID") == sid.encode():
        return True
    me = procfs.process(pid)
    server = procfs.process(me.parent) if me is not None else None
    return server is not None and TASK_SERVER_TITLE in server.title and sid in server.title


def reap_local_tasks(sid, grace_s=5.0):
    """End task processes a cancelled local pilot left behind.

    RADICAL-Pilot starts every task in a session of its own (its launch.sh)
    and, when the pilot is cancelled mid-run, does not end them: on a cluster
    the batch system does, on a workstation they would run on. They are found
    by their own launch script (<sid>/pilot.NNNN/task.N/task.N.launch.sh) in
    /proc and ended by process group id: SIGTERM, then SIGKILL after
    `grace_s`, each followed by SIGCONT (a rank stopped with SIGSTOP was left
    behind); their descendants that left the group (an MPI launcher's) too.
    Never the caller's own process group: the pilot job's wrapper
    (psij's single_launch.sh, also under the session's folder) and the agent
    share the group of the process holding the session, and a looser match
    once ended that process itself (seen: a bare EOFError in its parent). A
    bootstrapper still running (a start that hung) is ended by pid, with its
    descendants.
    """
    own = os.getpgid(0)
    groups, strays = _local_task_processes(sid, own)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            _signal_and_wake(os.killpg, pgid, sig)
        for pid in strays:
            _signal_and_wake(os.kill, pid, sig)
        deadline = time.time() + (grace_s if sig == signal.SIGTERM else 0)
        while True:  # found again: no pid signalled twice after its process is gone
            groups, strays = _local_task_processes(sid, own, groups, strays)
            if (not groups and not strays) or time.time() >= deadline:
                break
            time.sleep(0.2)
        if not groups and not strays:
            return


def _local_task_processes(sid, own, groups=(), before=()):
    """(process groups, single pids) of session `sid`'s task processes on this machine:
    the groups of their launch scripts (and `groups` still alive), the processes that
    left those groups (an MPI launcher's proxies and ranks), and those whose launch
    script is gone (RP's cancel ends launch.sh: a rank stopped with SIGSTOP outlived
    it, seen), known by the ids RP gives every task's environment. Never `own`."""
    pilot = rb"/" + re.escape(sid.encode()) + rb"/+pilot\.\d+/+"
    launcher = re.compile(pilot + rb"task\.\d+/+task\.\d+\.launch\.sh")
    every = [p for p in procfs.processes() if p.state != "Z"]  # a zombie is ended already
    alive = {p.group for p in every}
    found = ({p.group for p in every if launcher.search(p.cmdline)} | (set(groups) & alive))
    found.discard(own)
    members = {p.pid for p in every if p.group in found}
    strays = procfs.descendants(members, every) - members
    strays |= {p.pid for p in every if p.group != own and p.pid not in members
               and is_task_of_session(p.pid, sid)}
    # a bootstrapper still running after the cancel (a start that hung: RP's cancel
    # ends the pilot job's wrapper, not bootstrap_0.sh in its pre-bootstrap commands,
    # and the guard only 30 s later): it is in `own` group, so by pid, with what it started
    bootstrapper = re.compile(pilot + rb"bootstrap_0\.sh(?=[\s\x00]|$)")
    boot = {p.pid for p in every if bootstrapper.search(p.cmdline)}
    strays |= (boot | procfs.descendants(boot, every)) - members - {os.getpid()}
    # and those found before (a bootstrapper's children outlive it, reparented)
    strays |= set(before) & {p.pid for p in every}
    return found, strays


def _signal_and_wake(send, target, sig):
    """`sig`, then SIGCONT: a stopped process gets its SIGTERM now."""
    try:
        send(target, sig)
        send(target, signal.SIGCONT)
    except (ProcessLookupError, PermissionError):
        pass
