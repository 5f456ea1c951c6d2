"""A held pilot's report drawer (workflows/run/report_drawer.py), off the pilot: it draws
a real run's report as the holder did, answers in order (a folder that is no run: no
report, and it goes on), runs below the tasks' priority, and ends with its holder."""
import os
import signal
import subprocess
import sys
import time

import pytest

from run_stages import plan_and_run
from trajflow.workflows.run.report_drawer import NICE, ReportDrawer
from trajflow.workflows.run.runs import Run


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_the_drawer_draws_in_order_and_goes_on_after_a_bad_folder(adk, tmp_path):
    run = tmp_path / "run"
    plan_and_run(run, adk[0], [adk[1]], "rmsd", mode="tasks", blocks=2)
    drawer = ReportDrawer(str(tmp_path / "holder"))
    try:
        futures = [drawer.draw(str(tmp_path)), drawer.draw(str(run))]  # no run, then a run
        assert futures[0].result(120) is None
        # (set as it began: nice +10 over its parent's)
        assert os.getpriority(os.PRIO_PROCESS, drawer._proc.pid) == min(
            19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
        assert futures[1].result(120) == str(run / "report.html")
        drawn = (run / "report.html").read_text()
        # what the holder drew itself before: the same report, the same run
        os.rename(run / "report.html", tmp_path / "drawn.html")
        Run(str(run), trust=True).write_report()
        assert drawn.count("<img") == (run / "report.html").read_text().count("<img") > 0
        assert f"trajflow run {run}" in drawn
    finally:
        drawer.close()
    assert drawer._proc.returncode == 0
    assert drawer.draw(str(run)).exception(5) is not None  # closed: said, not hung


@pytest.mark.timeout(120)
def test_the_drawer_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from trajflow.workflows.run.report_drawer import ReportDrawer\n"
         f"d = ReportDrawer({str(tmp_path)!r}); print(d._proc.pid, flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True)
    try:
        drawer = int(holder.stdout.readline())
        assert _alive(drawer)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
    deadline = time.time() + 30
    while _alive(drawer) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(drawer), "the report drawer outlived its killed holder"
