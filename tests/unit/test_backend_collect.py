"""trajflow.Backend's collect task (tasks/backend_part.py): the parts go into
results.pickle in order and still pickled, so the collect never imports MDAnalysis; a
part that is not a whole pickle fails it with nothing written."""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from trajflow.tasks import backend_part
from trajflow.tasks.plan import RunPlan

COLLECT = """
import sys
from trajflow.tasks import backend_part
from trajflow.tasks.plan import RunPlan
backend_part.collect(RunPlan.load(sys.argv[1]))
print("MDAnalysis" in sys.modules)
"""


def backend_run(tmp_path, n_parts=3):
    plan = RunPlan(workdir=str(tmp_path), topology="/t.psf", trajectories=["/a.dcd"],
                   analysis="mdanalysis:MDAnalysis.analysis.rms.RMSD", selection="",
                   io="shared", mode="tasks", gather="gatherv", n_frames=3 * n_parts, n_atoms=3,
                   blocks=[(3 * p, 3 * p + 3) for p in range(n_parts)], backend=True)
    for folder in ("parts", "backend"):
        os.makedirs(plan.path(folder))
    return plan


def test_the_parts_are_collected_in_order_without_mdanalysis(tmp_path):
    from MDAnalysis.analysis.results import Results
    plan = backend_run(tmp_path)
    for p in range(3):
        backend_part._write_pickle(backend_part.part_path(plan, p), types.SimpleNamespace(
            frames=np.arange(3 * p, 3 * p + 3), times=np.zeros(3), results=Results(part=p)))
    path = plan.save(plan.path("plan.json"))
    said = subprocess.run([sys.executable, "-c", COLLECT, path], capture_output=True,
                          text=True, timeout=120)
    assert said.returncode == 0 and said.stdout.split() == ["False"], said.stderr
    pieces = backend_part.read_pieces(plan.result_path())
    assert [p.results.part for p in pieces] == [0, 1, 2]
    np.testing.assert_array_equal(np.hstack([p.frames for p in pieces]), np.arange(9))


def test_a_part_that_is_not_a_whole_pickle_fails_the_collect(tmp_path):
    plan = backend_run(tmp_path, 2)
    for p in range(2):
        backend_part._write_pickle(backend_part.part_path(plan, p), {"part": p})
    with open(backend_part.part_path(plan, 1), "r+b") as fh:
        fh.truncate(os.path.getsize(backend_part.part_path(plan, 1)) - 2)
    with pytest.raises(SystemExit, match="not a whole pickle"):
        backend_part.collect(plan)
    assert not os.path.exists(plan.result_path())
    assert not backend_part._whole_pickle(b"") and backend_part._whole_pickle(b"N.")


def test_a_result_collected_before_0_19_still_reads(tmp_path):
    """Before 0.19 results.pickle held the parts unpickled: read as they are."""
    path = tmp_path / "results.pickle"
    old = [types.SimpleNamespace(frames=np.arange(2)), types.SimpleNamespace(frames=np.arange(2, 4))]
    backend_part._write_pickle(str(path), old)
    pieces = backend_part.read_pieces(str(path))
    np.testing.assert_array_equal(np.hstack([p.frames for p in pieces]), np.arange(4))
