"""tasks/inputs.py: a run's inputs are checked by size and modification time."""
import os
import types

import pytest

from trajflow.tasks.inputs import check_unchanged, input_stats


def _plan(tmp_path, stats=True):
    top, traj = tmp_path / "top.pdb", tmp_path / "traj.dcd"
    top.write_bytes(b"t" * 10)
    traj.write_bytes(b"x" * 100)
    paths = [str(top), str(traj)]
    return types.SimpleNamespace(topology=paths[0], trajectories=paths[1:],
                                 input_stats=input_stats(paths) if stats else [])


def test_unchanged_inputs_pass(tmp_path):
    plan = _plan(tmp_path)
    assert [size for size, _ in plan.input_stats] == [10, 100]
    check_unchanged(plan, "analyze")


@pytest.mark.parametrize("change", ["grown", "touched", "removed"])
def test_a_changed_input_is_named(tmp_path, change):
    plan = _plan(tmp_path)
    traj = plan.trajectories[0]
    if change == "grown":
        with open(traj, "ab") as fh:
            fh.write(b"y")
    elif change == "touched":
        st = os.stat(traj)
        os.utime(traj, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # any file system
    else:
        os.remove(traj)
    with pytest.raises(SystemExit) as err:
        check_unchanged(plan, "analyze")
    text = str(err.value.code)
    assert text.startswith(f"analyze: input {traj!r}")
    assert ("cannot be read now" if change == "removed" else "changed since the run was planned") \
        in text
    if change == "grown":
        assert "101 bytes now, 100 planned" in text


def test_a_plan_without_stats_is_not_checked(tmp_path):
    plan = _plan(tmp_path, stats=False)
    os.remove(plan.trajectories[0])
    check_unchanged(plan, "analyze")  # written before plans recorded them: nothing to hold
