"""Claims before MPI_Init (tasks/launch_env.py, schedules.LaunchCounter): the launcher's
environment read right, a launch named only where it is sure, a counter shared by one
run's launch and by no one else's, and nothing planted by another user trusted."""
import os
import subprocess
import time

import numpy as np
import pytest

from trajflow.tasks.launch_env import Launch, launch_name, this_launch
from trajflow.tasks.schedules import CounterUnavailable, LaunchCounter

RP = {"RP_SESSION_ID": "re.session.x", "RP_PILOT_ID": "pilot.0000", "RP_TASK_ID": "task.000004"}


@pytest.mark.parametrize("env,expected", [
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4", **RP}, (1, 4, True)),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2", **RP}, (1, 4, False)),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": "prterun-x-1@1"}, (0, 2, True)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)",
      "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, (3, 16, False)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "4",
      "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}, (3, 4, True)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1",
      "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"}, (0, 3, False)),
    ({"PMI_RANK": "4", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4", **RP}, None),  # no such rank
    ({"PMI_RANK": "x", "PMI_SIZE": "4", **RP}, None),
    # the launch cannot be named: no job id, and this process' parent is no launcher
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}, None),
    ({}, None),
])
def test_the_launchers_environment(env, expected):
    launch = this_launch(env, parent=os.getpid())  # pytest itself: not a launcher
    if expected is None:
        assert launch is None
    else:
        assert (launch.rank, launch.size, launch.one_node) == expected


def test_a_launch_is_named_by_its_job_not_by_each_ranks_parent():
    """Under RADICAL-Pilot every rank runs under a shell of its own: the task's ids name
    the launch, the same for all its ranks and new for the task's next attempt."""
    assert launch_name(RP, parent=1) == launch_name(dict(RP), parent=os.getpid())
    assert launch_name({**RP, "RP_TASK_ID": "task.000005"}) != launch_name(RP)
    assert launch_name({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}) != \
        launch_name({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1"})
    assert launch_name({}, parent=os.getpid()) is None


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(LaunchCounter, "FOLDER", str(tmp_path))
    return tmp_path / f"trajflow-{os.getuid()}"


LAUNCH = Launch(0, 2, True, "re.session.x-pilot.0000-task.000004")


def test_the_ranks_of_a_launch_share_one_counter_and_rank_0_removes_it(shm, tmp_path):
    ranks = [LaunchCounter(LAUNCH, str(tmp_path / "run"), rank) for rank in (0, 1)]
    assert ranks[0].identity == ranks[1].identity
    claimed = [ranks[k % 2].claim().wait() for k in range(6)]
    assert claimed == list(range(6))
    other_run = LaunchCounter(LAUNCH, str(tmp_path / "other"), 0)  # same launch ids
    assert other_run.claim().wait() == 0 and other_run.identity != ranks[0].identity
    ranks[1].exhaust(100)
    assert ranks[0].claim().wait() >= 100  # a failed rank: the others stop claiming
    ranks[1].close()
    assert len(list(shm.iterdir())) == 2
    ranks[0].close()
    other_run.close()
    assert list(shm.iterdir()) == []


def test_a_counter_left_for_a_week_is_removed(shm, tmp_path):
    shm.mkdir(mode=0o700)
    stale = shm / ("claims-" + "0" * 32)
    stale.write_bytes(np.int64(7).tobytes())
    week = time.time() - LaunchCounter.STALE_S - 60
    os.utime(stale, (week, week))
    recent = shm / ("claims-" + "1" * 32)
    recent.write_bytes(bytes(8))
    dead = subprocess.Popen(["true"])
    dead.wait()
    ended = shm / ("claims-" + "2" * 32)  # a job aborted: its ranks registered, all ended
    ended.write_bytes(np.array([5, dead.pid, 0], dtype=np.int64).tobytes())
    LaunchCounter(LAUNCH, str(tmp_path / "run"), 0).close()
    assert not stale.exists() and not ended.exists()
    assert recent.exists()  # no rank registered yet: being made now


def test_a_folder_others_can_write_is_refused(shm, tmp_path):
    shm.mkdir(mode=0o700)
    os.chmod(shm, 0o777)
    with pytest.raises(CounterUnavailable, match="not this user's own folder"):
        LaunchCounter(LAUNCH, str(tmp_path / "run"), 0)


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another user's needs root")
def test_a_counter_planted_by_another_user_is_refused(shm, tmp_path):
    """Another user's file of that name would let them skip or repeat our chunks."""
    counter = LaunchCounter(LAUNCH, str(tmp_path / "run"), 1)  # makes the folder and file
    path = counter.path
    counter.close()
    os.chown(path, 65534, 65534)
    with pytest.raises(CounterUnavailable, match="not a chunk counter of this user's"):
        LaunchCounter(LAUNCH, str(tmp_path / "run"), 1)


def test_a_link_in_place_of_the_counter_is_not_followed(shm, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(8))
    counter = LaunchCounter(LAUNCH, str(tmp_path / "run"), 1)
    path = counter.path
    counter.close()
    os.unlink(path)
    os.symlink(target, path)
    with pytest.raises(OSError):
        LaunchCounter(LAUNCH, str(tmp_path / "run"), 1)
    assert target.read_bytes() == bytes(8)


def test_a_rank_that_ended_before_mpi_init_is_seen_gone(shm, tmp_path):
    """What the late MPI_Init's watchdog looks at: a rank that registered and ended."""
    import sys
    script = ("import sys; from trajflow.tasks.launch_env import Launch; "
              "from trajflow.tasks.schedules import LaunchCounter as C; "
              f"C.FOLDER = {str(tmp_path)!r}; "
              f"C(Launch(1, 2, True, {LAUNCH.id!r}), {str(tmp_path / 'run')!r}, 1)")
    mine = LaunchCounter(LAUNCH, str(tmp_path / "run"), 0)
    assert mine.ranks_gone() == []  # rank 1 has not started: not gone
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    assert mine.ranks_gone() == [1]
    mine.close()


def test_a_rank_that_died_before_the_others_came_is_still_seen_gone(shm, tmp_path):
    """The launch's own counter is never taken for a stale one: rank 1 registered and
    died before rank 0 arrived, and rank 0 must see it gone, not start a fresh count."""
    import sys
    script = ("from trajflow.tasks.launch_env import Launch; "
              "from trajflow.tasks.schedules import LaunchCounter as C; "
              f"C.FOLDER = {str(tmp_path)!r}; "
              f"C(Launch(1, 2, True, {LAUNCH.id!r}), {str(tmp_path / 'run')!r}, 1)")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    rank0 = LaunchCounter(LAUNCH, str(tmp_path / "run"), 0)
    assert rank0.ranks_gone() == [1]
    rank0.close()
