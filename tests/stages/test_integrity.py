"""Truncated and damaged trajectories are found on the workstation, before any pilot,
named with their whole frames; --allow-truncated analyses exactly those frames."""
import os

import h5py
import numpy as np
import pytest

from run_stages import run_stages
from plans import make_plan
from trajflow.workflows.run.planning import InputError, write_plan


def cut(src, dst, keep_bytes):
    with open(src, "rb") as fh, open(dst, "wb") as out:
        out.write(fh.read(keep_bytes))
    return str(dst)


def serial_rmsd(top, traj, n):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    return rms.RMSD(mda.Universe(top, traj), select="name CA").run(stop=n).results.rmsd


def plan_or_error(top, trajs, out, **kw):
    return make_plan(top, trajs, "rmsd", str(out), mode="tasks", blocks=2, cpus=2, **kw)


@pytest.mark.parametrize("fmt", ["DCD", "XTC", "TRR"])
def test_a_truncated_trajectory_is_refused_then_analysed_by_its_whole_frames(tmp_path, adk,
                                                                              adk_xtc, fmt):
    import MDAnalysis as mda
    if fmt == "TRR":
        src = str(tmp_path / "adk.trr")
        u = mda.Universe(*adk)
        with mda.Writer(src, n_atoms=len(u.atoms)) as w:
            for _ in u.trajectory:
                w.write(u.atoms)
        top = adk[0]
    else:
        top, src = (adk[0], adk[1]) if fmt == "DCD" else adk_xtc
    size = os.path.getsize(src)
    broken = cut(src, tmp_path / f"broken.{fmt.lower()}", size - size // 200)  # mid last frame
    with pytest.raises(InputError) as err:
        plan_or_error(top, [broken], tmp_path / "refused")
    message = str(err.value)
    assert broken in message and "97 whole frame(s)" in message and "allow_truncated=True" in message
    assert not (tmp_path / "refused").exists()
    plan = plan_or_error(top, [broken], tmp_path / "run", allow_truncated=True)
    assert plan.n_frames == 97 and plan.truncated["frames_in_files"] in (97, 98)
    run_stages(plan, write_plan(plan))
    with h5py.File(plan.result_path()) as f:
        np.testing.assert_allclose(f["rmsd"][()], serial_rmsd(top, src, 97), atol=1e-4)
        assert "97" in f.attrs["truncated_input"]
    from trajflow.workflows.run.runs import Run
    from trajflow.tasks.rundir import record_outcome
    record_outcome(plan.workdir, "done")
    assert "TRUNCATED INPUT" in Run(plan.workdir).summary()


def test_only_the_last_file_of_a_chain_may_be_truncated(tmp_path, adk):
    broken = cut(adk[1], tmp_path / "broken.dcd", os.path.getsize(adk[1]) - 1000)
    with pytest.raises(InputError, match="Only the last trajectory file"):
        plan_or_error(adk[0], [broken, adk[1]], tmp_path / "run", allow_truncated=True)
    plan = plan_or_error(adk[0], [adk[1], broken], tmp_path / "ok", allow_truncated=True)
    assert plan.n_frames == 98 + 97


def test_an_h5md_whose_datasets_disagree_is_damaged(tmp_path, adk):
    import MDAnalysis as mda
    path = str(tmp_path / "adk.h5md")
    u = mda.Universe(*adk)
    with mda.Writer(path, n_atoms=len(u.atoms)) as w:
        for _ in u.trajectory[:10]:
            w.write(u.atoms)
    with h5py.File(path, "r+") as f:  # the time series stops short, as after a crash
        group = f["particles/trajectory/position"]
        for name in ("time", "step"):
            data, attrs = group[name][:7], dict(group[name].attrs)
            del group[name]
            group.create_dataset(name, data=data).attrs.update(attrs)
    with pytest.raises(InputError, match="datasets of different lengths"):
        plan_or_error(adk[0], [path], tmp_path / "run")
