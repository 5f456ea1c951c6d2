"""The pilot's client guard (tasks/client_guard.py) hears its pilot's end at once."""
import subprocess
import threading
import time

import pytest

from trajflow.tasks import client_guard


@pytest.mark.timeout(60)
def test_the_guard_ends_as_soon_as_its_pilot_does(tmp_path):
    """Its poll is 5 s for a 300 s client timeout; the bootstrapper's end ends it sooner
    (tests wait 3 s for a stopped pilot's processes to be gone)."""
    session = tmp_path / "re.session.guard-test"
    session.mkdir()
    (session / client_guard.HEARTBEAT).write_text("")
    bootstrapper = subprocess.Popen(["sleep", "60"])
    returned = []
    guard = threading.Thread(target=lambda: returned.append(
        client_guard.guard(str(session), 300.0, bootstrapper.pid)))
    guard.start()
    time.sleep(1.0)  # a turn or two of its loop
    assert guard.is_alive()
    t0 = time.monotonic()
    bootstrapper.kill()
    bootstrapper.wait()
    guard.join(10)
    assert not guard.is_alive() and returned == [None]  # ended, not fired
    assert time.monotonic() - t0 < 2.0
    assert (session / client_guard.ENDED).exists()
