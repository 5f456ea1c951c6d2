"""500 single-core tasks with tiny blocks through a local pilot: the run completes, the result
is MDAnalysis', the client's memory stays bounded (measured and printed), and no more tasks
run at once than the pilot has cores."""
import h5py
import numpy as np
import pytest

from trajflow.workflows.datasets import adk_concatenated
from trajflow.workflows.run.execute import run_plans
from plans import make_plan
from trajflow.workflows.run.planning import write_plan
from trajflow.workflows.run.spec import PilotSpec

pytestmark = [pytest.mark.entk, pytest.mark.slow]


def test_500_task_pipeline_completes_with_bounded_client_memory(tmp_path):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    top, traj = adk_concatenated(6, "DCD", folder=str(tmp_path))  # 588 frames
    plan = make_plan(top, [traj], "rmsd", str(tmp_path / "run"), mode="tasks", blocks=500, cpus=2)
    report = run_plans([("many", plan, write_plan(plan))], PilotSpec(walltime=60, cpus=2),
                       retries=0)
    assert report.ok, "\n".join(o.describe() for o in report.failed[:5])
    assert sum(o.stage == "analyze" for o in report.outcomes) == 500
    expected = rms.RMSD(mda.Universe(top, traj), select="name CA").run().results.rmsd
    with h5py.File(report.results["many"]) as f:
        np.testing.assert_allclose(f["rmsd"][()], expected, atol=1e-4)
    print(f"500 tasks: {report.wall_s:.0f} s wall, client peak RSS {report.client_peak_rss_mib:.0f} MiB")
    assert report.client_peak_rss_mib < 2048
    # a 2-core pilot runs at most 2 tasks at once (RADICAL's launch_start to its rank_stop);
    # RADICAL's local.localhost alone declares 8 cores, and ran 8 at once
    from trajflow.workflows.profile.inspection import load_run
    _, records = load_run(plan.workdir)
    edges = sorted(e for r in records if r["task"] == "analyze"
                   for e in ((r["radical"]["launch_start"], 1), (r["radical"]["rank_stop"], -1)))
    running = [0]
    for _, step in edges:
        running.append(running[-1] + step)
    assert max(running) == 2, f"{max(running)} tasks ran at once on 2 cores"
