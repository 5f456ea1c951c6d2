"""The HTML report in a real headless browser (Debian's chromium): it renders, offline, not blank."""
import shutil
import subprocess

import numpy as np
import pytest

from stages import plan_and_run
from trajflow.workflows.inspection import inspect_runs
from trajflow.workflows.report_html import write_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed (apt-get install chromium)")
def test_report_renders_in_headless_chromium(tmp_path, adk):
    run = tmp_path / "run"
    plan_and_run(run, adk[0], [adk[1]], "rmsd", env={"TRAJFLOW_TEST_DELAY": "1:compute:0.5"},
                 mode="mpi", blocks=3, cpus=3)
    page = tmp_path / "report.html"
    write_html(inspect_runs([str(run)]), str(page))
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,1600",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    from matplotlib.image import imread
    img = imread(str(shot))[..., :3]
    not_white = np.mean(np.any(img < 0.95, axis=2))
    assert not_white > 0.05, f"the page is nearly blank ({not_white:.1%} of pixels drawn)"
    red = np.mean((img[..., 0] > 0.7) & (img[..., 1] < 0.3) & (img[..., 2] < 0.3))
    green = np.mean((img[..., 1] > 0.5) & (img[..., 0] < 0.3) & (img[..., 2] < 0.3))
    assert red > 0.001 and green > 0.001, "the timeline's wait (red) and compute (green) bars are missing"
