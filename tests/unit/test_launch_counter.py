"""Claims before MPI_Init (tasks/launch_env.py, schedules.LaunchCounter): the launcher's
environment read right, a counter shared by one launch's ranks and by no one else's,
and nothing planted by another user trusted."""
import os
import subprocess

import numpy as np
import pytest

from trajflow.tasks.launch_env import Launch, launch_id, this_launch
from trajflow.tasks.schedules import LaunchCounter

LAUNCHER = launch_id(os.getppid())


@pytest.mark.parametrize("env,expected", [
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"}, (1, 4, True)),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}, (1, 4, False)),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (0, 2, True)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)"},
     (3, 16, False)),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "4"}, (3, 4, True)),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_STEP_TASKS_PER_NODE": "2,1"},
     (0, 3, False)),
    ({"PMI_RANK": "4", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "4"}, None),  # no such rank
    ({"PMI_RANK": "x", "PMI_SIZE": "4"}, None),
    ({}, None),
])
def test_the_launchers_environment(env, expected):
    launch = this_launch(env)
    if expected is None:
        assert launch is None
    else:
        assert (launch.rank, launch.size, launch.one_node) == expected
        assert launch.id == LAUNCHER  # named by this process' parent and its start time


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(LaunchCounter, "FOLDER", str(tmp_path))
    return tmp_path / f"trajflow-{os.getuid()}"


def launch(pid_and_start=LAUNCHER):
    return Launch(0, 2, True, pid_and_start)


def test_the_ranks_of_a_launch_share_one_counter_and_rank_0_removes_it(shm):
    ranks = [LaunchCounter(launch(), "abc" * 8, rank) for rank in (0, 1)]
    claimed = [ranks[k % 2].claim().wait() for k in range(6)]
    assert claimed == list(range(6))
    other = LaunchCounter(launch(), "def" * 8, 0)  # another run's launch: its own count
    assert other.claim().wait() == 0
    ranks[1].close()
    assert len(list(shm.iterdir())) == 2
    ranks[0].close()
    other.close()
    assert list(shm.iterdir()) == []


def test_a_counter_of_a_launch_gone_is_removed(shm):
    dead = subprocess.Popen(["true"])
    dead.wait()
    shm.mkdir(mode=0o700)
    stale = shm / f"claims-{'0' * 16}-{dead.pid}-12345"
    stale.write_bytes(np.int64(7).tobytes())
    being_made = shm / f"claims-{'0' * 16}-{dead.pid}-12345.{dead.pid}.tmp"  # another's, now
    being_made.write_bytes(bytes(8))
    LaunchCounter(launch(), "abc" * 8, 0).close()
    assert not stale.exists()
    assert being_made.exists()  # a rank of a live launch is linking it into place


def test_a_folder_others_can_write_is_refused(shm):
    shm.mkdir(mode=0o700)
    os.chmod(shm, 0o777)
    with pytest.raises(RuntimeError, match="not this user's own folder"):
        LaunchCounter(launch(), "abc" * 8, 0)


@pytest.mark.skipif(os.getuid() != 0, reason="making a file of another user's needs root")
def test_a_counter_planted_by_another_user_is_refused(shm):
    """Another user's file of that name would let them skip or repeat our chunks."""
    counter = LaunchCounter(launch(), "abc" * 8, 1)  # makes the folder and the file
    path = counter.path
    counter.close()
    os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeError, match="not a chunk counter of this user's"):
        LaunchCounter(launch(), "abc" * 8, 1)


def test_a_link_in_place_of_the_counter_is_not_followed(shm, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(8))
    counter = LaunchCounter(launch(), "abc" * 8, 1)
    path = counter.path
    counter.close()
    os.unlink(path)
    os.symlink(target, path)
    with pytest.raises(OSError):
        LaunchCounter(launch(), "abc" * 8, 1)
    assert target.read_bytes() == bytes(8)
