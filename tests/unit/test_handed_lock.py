"""A run folder's lock handed to a held pilot with its run (workflows/run/rundir_lock.py):
the held pilot removes the lock file when the run is over there, its client having
perhaps ended first, but never a lock file that is no longer the one it was handed (nor
does a client's own release)."""
import os

from trajflow.tasks.rundir import LOCK, lock_held
from trajflow.workflows.run.rundir_lock import remove_handed_lock, RunLock


def test_the_held_pilot_removes_the_lock_it_was_handed(tmp_path):
    rundir = str(tmp_path / "run")
    lock = RunLock(rundir).acquire()
    handed = os.dup(lock.fd)  # what the holder gets over the socket: the same open file
    lock.let_go()             # the client ends (before the run's report is written)
    assert lock_held(rundir)  # the holder still holds it
    remove_handed_lock(rundir, handed)
    os.close(handed)
    assert not os.path.exists(os.path.join(rundir, LOCK)) and not lock_held(rundir)
    RunLock(rundir).acquire().release()  # free, and no stale holder to take over


def test_a_lock_file_that_is_not_the_handed_one_stays(tmp_path):
    rundir = str(tmp_path / "run")
    lock = RunLock(rundir).acquire()
    handed = os.dup(lock.fd)
    lock.release()                       # the client released it (file gone) ...
    newer = RunLock(rundir).acquire()    # ... and another run took the folder
    remove_handed_lock(rundir, handed)
    os.close(handed)
    assert os.path.exists(os.path.join(rundir, LOCK)) and lock_held(rundir)
    newer.release()


def test_a_release_leaves_a_lock_file_that_replaced_its_own(tmp_path):
    """Where flock fails, a refusal tells the user to remove the lock file of a run that
    is gone; if that run was not gone, its release must not remove the next run's lock."""
    rundir = str(tmp_path / "run")
    first = RunLock(rundir).acquire()
    os.unlink(os.path.join(rundir, LOCK))   # the user's rm, as the refusal says
    second = RunLock(rundir).acquire()      # another run takes the folder
    first.release()
    assert os.path.exists(os.path.join(rundir, LOCK)) and lock_held(rundir)
    assert os.stat(os.path.join(rundir, LOCK)).st_ino == os.fstat(second.fd).st_ino
    second.release()
    assert not os.path.exists(os.path.join(rundir, LOCK)) and not lock_held(rundir)
