"""Advice that tells the truth: too-short runs are not judged, the strategy used is named,
claims match the numbers, measured alternatives are compared at one rank count (no pilot)."""
import os

import h5py
import numpy as np
import pytest

from trajflow.tasks.plan import RunPlan
from trajflow.workflows.profile.advice import REFERENCES, advice, compare_strategies


def plan(tmp_path, io="shared", mode="mpi", gather="gatherv", n=2, name="run"):
    workdir = tmp_path / name
    workdir.mkdir(exist_ok=True)
    return RunPlan(workdir=str(workdir), topology="t.psf", trajectories=["t.dcd"], analysis="rmsd",
                   selection="name CA", io=io, mode=mode, gather=gather, n_frames=1000,
                   n_atoms=3341, blocks=[(i * 1000 // n, (i + 1) * 1000 // n) for i in range(n)],
                   input_checksum="abc")


def ranks(n=2, io=8.0, compute=2.0, comm=0.0, launch=1.0, t0=100.0, split=0.0):
    """n analyze ranks after an optional split task of `split` seconds."""
    records = []
    if split:
        records.append({"task": "split", "rank": 0, "t_start": t0, "t_stop": t0 + split,
                        "t_total": split, "t_launch": 0.5, "t_io": split, "t_compute": 0.0,
                        "t_comm": 0.0})
        t0 += split + 1.0
    for r in range(n):
        total = 0.1 + io + compute + comm
        records.append({"task": "analyze", "rank": r, "mode": "mpi", "t_start": t0,
                        "t_stop": t0 + total, "t_total": total, "t_open_topology": 0.1,
                        "t_io": io, "t_compute": compute, "t_comm": comm, "t_wait": 0.0,
                        "t_launch": launch})
    return records


def test_a_run_too_short_to_judge_gets_no_strategy_advice(tmp_path):
    p = plan(tmp_path)
    a = advice(p, ranks(io=0.2, compute=0.05, launch=30.0))
    assert a["text"].startswith("too short to judge a strategy: the analysis itself took 0.35 s")
    assert "30.0 s launching tasks" in a["text"] and "I/O bound" not in a["text"]
    assert "--io" in a["text"] and "frames or more" in a["text"]


def test_the_wait_for_the_pilot_is_counted_where_its_profile_was_kept(tmp_path):
    """A pilot started for the run: its start, to the moment RADICAL declared it active,
    is a part of the run's wall time, from the lines the run kept (or, in a folder made
    before those were kept, its session's profiles)."""
    p = plan(tmp_path)
    p.asked_at = 50.0
    session = tmp_path / "re.session.x"
    (session / "pilot.0000").mkdir(parents=True)
    (session / "pilot.0000" / "bootstrap_0.prof").write_text(
        "#time,event,comp,thread,uid,state,msg\n60.0,bootstrap_0_start,b,M,pilot.0000,,\n")
    (session / "pilot.0000" / "agent_0.prof").write_text(
        "90.0,advance,agent_0,M,pilot.0000,PMGR_ACTIVE,\n")
    (tmp_path / "run" / "radical_session").write_text(str(session))
    a = advice(p, ranks(io=0.2, compute=0.05, launch=2.0))  # first launch at t = 98
    wall = a["times"]["wall"]
    assert wall["parts"]["pilot start"] == pytest.approx(40.0)  # from the call: no handover
    assert wall["parts"]["before the first task"] == pytest.approx(8.0)
    assert a["times"]["whole"] == pytest.approx(100.35 - 50.0)
    assert "40.0 s pilot start" in a["text"]


def test_shared_io_bound_names_the_strategy_and_cites_by_author_and_year(tmp_path):
    a = advice(plan(tmp_path), ranks())
    assert a["text"].startswith("I/O bound with --io shared --mode mpi --gather gatherv "
                                "(t_compute/t_IO = 0.25)")
    assert "Khoshlessan et al. 2019" in a["text"] and "paper" not in a["text"]
    assert all(key in REFERENCES for key in ("Khoshlessan et al. 2019", "Jakupovic and Beckstein 2021"))


def test_h5md_advice_says_h5md_and_counts_the_conversion_apart(tmp_path):
    a = advice(plan(tmp_path, io="h5md"), ranks(split=11.8))
    assert a["text"].startswith("I/O bound with --io h5md")
    assert "converting to H5MD took 11.8 s, not counted in the analyze stage's" in a["text"]
    assert "split already" not in a["text"]


def test_the_gather_is_described_by_the_results_real_size(tmp_path):
    p = plan(tmp_path)
    with h5py.File(p.result_path(), "w") as f:
        f["rmsd"] = np.zeros(8000)  # 64 KB of values: a small result
    size_kb = os.path.getsize(p.result_path()) / 1e3
    a = advice(p, ranks(io=6.0, compute=2.0, comm=4.0))
    assert f"for a result of {size_kb:.0f} KB: small arrays" in a["text"]
    assert "large" not in a["text"] and "--gather rma" in a["text"]


def test_measured_alternatives_are_compared_at_the_same_rank_count(tmp_path):
    """h5md measured 2.2x slower than shared at N = 1, plus an 11.8 s conversion:
    the comparison says so, conversion counted; a strategy alone at N = 2 is not compared."""
    shared = (plan(tmp_path, n=1, name="s1"), ranks(n=1, io=4.0, compute=1.0))
    h5md = (plan(tmp_path, io="h5md", n=1, name="h1"), ranks(n=1, io=10.0, compute=1.0, split=11.8))
    alone = (plan(tmp_path, n=2, name="s2"), ranks(n=2))
    [line] = compare_strategies([shared, h5md, alone])
    assert line.startswith("rmsd at N = 1: --io shared --mode mpi --gather gatherv 6.10 s (fastest)")
    assert "--io h5md --mode mpi --gather gatherv 23.90 s (of which 11.80 s split/convert), 3.9x the fastest" in line
