"""The wait inside MPI_Init moved from a rank's set-up to its wait (init_wait.py), on
records shaped as tasks/timing.py writes them, and the straggler judge after it."""
import copy
import math

import pytest
from hypothesis import given, settings, strategies as st

from trajflow.workflows.profile.init_wait import attribute_init_waits
from trajflow.workflows.profile.stragglers import judge_group

PART_NAMES = ("plan", "imports", "kernels", "mpi_init", "inputs")


def rank_record(rank, host, arrive, imports, compute, init_cost=1.0, task_id="task.000000"):
    """A rank as RankTimer records it: main() at `arrive`, its imports, then MPI_Init,
    which returns on every rank when the last has come (`last_in`, set by mpi_task)."""
    return {"task": "analyze", "rank": rank, "block": rank, "host": host, "size": None,
            "frames": 100, "mode": "mpi", "rp_session": "re.session.x", "rp_task_id": task_id,
            "_arrive": arrive, "_imports": imports, "_compute": compute, "_init_cost": init_cost}


def mpi_task(ranks):
    """Fill in what each rank measured: MPI_Init ends for all when the last one entered
    plus the init's own cost; compute; the barrier's wait for the slowest."""
    for r in ranks:
        r["size"] = len(ranks)
        r["_entered"] = r["_arrive"] + 0.01 + r["_imports"] + 0.01
    init_end = max(r["_entered"] for r in ranks) + ranks[0]["_init_cost"]
    work_end = {r["rank"]: init_end + 0.01 + r["_compute"] for r in ranks}
    end = max(work_end.values())
    for r in ranks:
        a = r.pop("_arrive")
        parts = {"plan": 0.01, "imports": r.pop("_imports"), "kernels": 0.01,
                 "mpi_init": init_end - r.pop("_entered"), "inputs": 0.01}
        r.pop("_init_cost")
        compute = r.pop("_compute")
        setup_end = a + sum(parts.values())
        r.update(setup_parts=parts, t_start=a, t_stop=end, t_setup=setup_end - a,
                 t_compute=compute, t_wait=end - work_end[r["rank"]], t_total=end - a,
                 t_launch=0.0,
                 intervals=[["setup", a, setup_end], ["compute", setup_end, setup_end + compute],
                            ["wait", setup_end + compute, end]])
    return ranks


def with_work(ranks):
    for r in ranks:
        r["t_work"] = r["t_total"] - r["t_wait"] + r["t_launch"]
    return ranks


def slow_node_task():
    """Six ranks on three nodes; tfvc2's two import 9 s slower and compute 5x slower."""
    return mpi_task([rank_record(r, f"tfvc{r // 2 + 1}", arrive=0.0,
                                 imports=9.6 if r // 2 == 1 else 1.0,
                                 compute=9.5 if r // 2 == 1 else 1.9) for r in range(6)])


def test_a_slow_nodes_late_arrival_is_the_others_wait_and_the_node_one_clear_flag():
    before = with_work(slow_node_task())
    # counted as set-up, the others' wait in MPI_Init made them nearly as slow as the node
    [flag] = judge_group(copy.deepcopy(before), ("run", "analyze"))
    assert flag["ratio"] < 1.7  # just over the line of 1.5: any noise decides
    after = slow_node_task()
    attribute_init_waits(after)
    with_work(after)
    for b, a in zip(before, after):
        assert a["t_setup"] + a["t_wait"] == pytest.approx(b["t_setup"] + b["t_wait"])
        if a["host"] == "tfvc2":  # the last to come: MPI_Init's own cost stays set-up
            assert "t_init_wait" not in a and a["t_setup"] == b["t_setup"]
        else:  # they came 8.6 s sooner and waited that long in MPI_Init
            assert a["t_init_wait"] == pytest.approx(8.6)
            assert a["t_setup"] == pytest.approx(b["t_setup"] - 8.6)
    flags = judge_group(after, ("run", "analyze"))
    assert [(f["kind"], f["host"]) for f in flags] == [("host", "tfvc2")]
    assert flags[0]["ratio"] > 3.5
    assert flags[0]["victims_wait_s"] > 4 * 8.6  # the four others' wait in MPI_Init counts


def test_the_wait_is_drawn_where_the_rank_entered_mpi_init():
    ranks = slow_node_task()
    attribute_init_waits(ranks)
    early = ranks[0]
    entered = early["t_start"] + 0.01 + 1.0 + 0.01
    assert early["intervals"][:3] == [
        ["setup", early["t_start"], pytest.approx(entered)],
        ["wait", pytest.approx(entered), pytest.approx(entered + 8.6)],
        ["setup", pytest.approx(entered + 8.6),
         pytest.approx(early["t_start"] + sum(early["setup_parts"].values()))]]
    assert ranks[2]["intervals"][0][0] == "setup" and len(ranks[2]["intervals"]) == 3


@pytest.mark.parametrize("damage", [
    lambda r: r.pop("setup_parts"),
    lambda r: r["setup_parts"].pop("mpi_init"),
    lambda r: r.update(setup_parts="mpi_init"),
    lambda r: r["setup_parts"].update(mpi_init="12"),
    lambda r: r["setup_parts"].update(mpi_init=math.nan),
    lambda r: r["setup_parts"].update(mpi_init=-1.0),
    lambda r: r["setup_parts"].update(mpi_init=True),
    lambda r: r["setup_parts"].update(imports=math.inf),
    lambda r: r.update(size=1),
    lambda r: r.update(t_setup=None),
    lambda r: r.update(t_wait=None),
    lambda r: r.update(size="6"),
], ids=["no parts", "no init", "not a dict", "a string", "nan", "negative", "a bool",
        "another part inf", "one rank", "no setup", "no wait", "size a string"])
def test_a_record_not_as_trajflow_writes_it_is_left_as_it_is(damage):
    rec = slow_node_task()[0]
    damage(rec)
    others = slow_node_task()[1:]
    before = copy.deepcopy(rec)
    attribute_init_waits([rec] + others)
    assert rec == before


def test_each_mpi_task_is_judged_by_its_own_ranks():
    """Two tasks of one run: the first's rank 0 came 2 s before its rank 1; the second's
    ranks came together, each with 3 s of MPI_Init (its own cost, not a wait)."""
    first = mpi_task([rank_record(r, "n1", 0.0, 1.0 + 2.0 * r, 1.0, 1.0,
                                  task_id="task.000001") for r in range(2)])
    second = mpi_task([rank_record(r, "n2", 0.0, 1.0, 1.0, 3.0, task_id="task.000002")
                       for r in range(2)])
    attribute_init_waits(first + second)
    assert first[0]["t_init_wait"] == pytest.approx(2.0) and "t_init_wait" not in first[1]
    assert not any("t_init_wait" in r for r in second)


def test_two_launches_in_one_folder_without_ids_are_left_as_they_are():
    """An older trajflow's records (no RADICAL ids) of two attempts: ranks 0 and 1 twice."""
    attempts = [mpi_task([rank_record(r, "n1", 0.0, 1.0, 1.0, cost) for r in range(2)])
                for cost in (1.0, 3.0)]
    records = [r | {"rp_task_id": None, "rp_session": None} for a in attempts for r in a]
    before = copy.deepcopy(records)
    attribute_init_waits(records)
    assert records == before


def test_an_mpi_init_after_the_chunks_is_a_wait_already():
    """A dynamic schedule's early start times its late MPI_Init inside its wait phase."""
    ranks = [r | {"mpi_init_after_chunks": True} for r in slow_node_task()]
    before = copy.deepcopy(ranks)
    attribute_init_waits(ranks)
    assert ranks == before


def test_a_wait_that_no_setup_interval_holds_moves_nothing():
    """Numbers the intervals cannot show (a forged or damaged record) are not moved."""
    ranks = slow_node_task()
    ranks[0]["intervals"] = [["compute", ranks[0]["t_start"], ranks[0]["t_stop"]]]
    before = copy.deepcopy(ranks[0])
    attribute_init_waits(ranks)
    assert ranks[0] == before and ranks[1]["t_init_wait"] == pytest.approx(8.6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.floats(0.01, 20), st.floats(0.01, 20)),
                min_size=2, max_size=12), st.floats(0.0, 3.0))
def test_phases_still_add_up_and_the_intervals_still_tile_the_rank(specs, init_cost):
    ranks = mpi_task([rank_record(i, f"n{i % 3}", arrive, imports, compute, init_cost)
                      for i, (arrive, imports, compute) in enumerate(specs)])
    before = copy.deepcopy(ranks)
    attribute_init_waits(ranks)
    last = max(range(len(ranks)),
               key=lambda i: before[i]["t_start"] + before[i]["setup_parts"]["imports"])
    assert "t_init_wait" not in ranks[last] or ranks[last]["t_init_wait"] < 1e-6
    for b, a in zip(before, ranks):
        assert a["t_setup"] >= init_cost - 1e-6  # MPI_Init's own cost stays set-up
        assert a["t_setup"] + a["t_wait"] == pytest.approx(b["t_setup"] + b["t_wait"])
        spans = a["intervals"]
        assert spans[0][1] == a["t_start"] and spans[-1][2] == pytest.approx(a["t_stop"])
        assert all(x[2] == pytest.approx(y[1]) for x, y in zip(spans, spans[1:]))
        drawn_wait = sum(t1 - t0 for name, t0, t1 in spans if name == "wait")
        assert drawn_wait == pytest.approx(a["t_wait"], abs=1e-6)
