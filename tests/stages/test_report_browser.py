"""The HTML report in a real headless browser (Debian's chromium): it renders, offline, not
blank, and its interactive timeline draws hundreds of ranks."""
import random
import re
import shutil
import subprocess

import numpy as np
import pytest

from run_stages import plan_and_run
from trajflow.workflows.profile.inspection import group_key, inspect_runs
from trajflow.workflows.profile.report_html import write_html
from trajflow.workflows.profile.stragglers import judge

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(not CHROMIUM, reason="chromium is not installed "
                                                     "(apt-get install chromium)")


def screenshot(page, tmp_path, height=1600, width=1200):
    """The page as chromium draws it, offline, once its scripts have run (RGB in 0..1)."""
    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
                    f"--window-size={width},{height}", "--virtual-time-budget=10000",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists(), "chromium wrote no screenshot"
    from matplotlib.image import imread
    return imread(str(shot))[..., :3]


def share(img, rgb):
    """The share of pixels of one colour (a phase's, from report_html.COLOURS)."""
    want = np.array([int(rgb[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.mean(np.all(np.abs(img - want) < 0.03, axis=2))


@pytest.mark.serial  # judges time: run alone (see the Makefile)
def test_report_renders_in_headless_chromium(tmp_path, adk):
    run = tmp_path / "run"
    plan_and_run(run, adk[0], [adk[1]], "rmsd", env={"TRAJFLOW_TEST_DELAY": "1:compute:0.5"},
                 mode="mpi", blocks=3, cpus=3, schedule="static")  # the others wait for rank 1
    page = tmp_path / "report.html"
    write_html(inspect_runs([str(run)]), str(page))
    text = page.read_text()
    # self-contained: no address to fetch anything from, not even in the inlined scripts
    assert not re.search(r"""(src|href)\s*=\s*["']?https?:""", text)
    assert "<h2>Result: run</h2>" in text  # the RMSD against time, drawn
    for width in (1200, 700):  # a laptop's window and half of one: the bars are there
        img = screenshot(page, tmp_path, width=width)
        not_white = np.mean(np.any(img < 0.95, axis=2))
        assert not_white > 0.05, f"the page is nearly blank ({not_white:.1%} of pixels drawn)"
        assert share(img, "#d62728") > 0.001 and share(img, "#2ca02c") > 0.001, \
            f"the timeline's wait (red) and compute (green) bars are missing at {width} px"


def two_hundred_ranks():
    """An MPI task of 200 ranks on 4 hosts; host n3's 50 ranks read 3x slower, the others
    wait for them at the barrier."""
    rng = random.Random(0)
    records = []
    for r in range(200):
        t, io = 1000.0, (3.0 if r >= 150 else 1.0) + rng.uniform(0, 0.1)
        end = t + 1.1 + io
        records.append({"run": "big", "task": "analyze", "rank": r, "block": r, "host": f"n{r // 50}",
                        "frames": 100, "mode": "mpi", "t_start": t, "t_stop": 1004.3,
                        "t_total": 4.3, "t_open_topology": 0.1, "t_io": io, "t_compute": 1.0,
                        "t_wait": 1004.3 - end, "t_launch": 0.5,
                        "intervals": [["open_topology", t, t + 0.1], ["io", t + 0.1, t + 0.1 + io],
                                      ["compute", t + 0.1 + io, end], ["wait", end, 1004.3]],
                        "radical": {"launch_start": 999.2, "rank_start": 999.5,
                                    "rank_stop": 1004.4}})
        records[-1]["t_work"] = 4.3 - records[-1]["t_wait"] + 0.5
    return records


def test_the_timeline_of_200_ranks_is_interactive_offline_and_drawn(tmp_path):
    records = two_hundred_ranks()
    flags = judge(records, group_key)
    assert [(f["kind"], f["host"], f["cause"]) for f in flags] == [("host", "n3", "io")]
    page = tmp_path / "big.html"
    write_html({"runs": [], "records": records, "stragglers": flags, "advice": {},
                "scaling": []}, str(page))
    text = page.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=\"?https?:", text), "fetches from a network"
    assert "Bokeh.embed.embed_items" in text and "WheelZoomTool" in text and "HoverTool" in text
    assert all(f"big analyze rank {r}" in text for r in range(200))  # a row for every rank
    assert "ranks 150-199" in text
    img = screenshot(page, tmp_path, height=3200)
    # io (blue), compute (green), wait (red) and RADICAL's start-up (olive) bars, drawn by the
    # browser from the figure's data: a page whose script failed shows none of them
    for name, colour in (("io", "#1f77b4"), ("compute", "#2ca02c"), ("wait", "#d62728"),
                         ("start-up", "#bcbd22")):
        assert share(img, colour) > 0.01, f"no {name} bars drawn"
