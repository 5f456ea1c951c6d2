"""`trajflow inspect --table`: per-rank timing tables of any tool, judged; bad tables named;
the Chrome trace of a table (no pilot)."""
import csv
import json
import os
import subprocess
import sys

import pytest

from trajflow.workflows.errors import InputError
from trajflow.workflows.profile.inspection import inspect_runs
from trajflow.workflows.profile.timing_tables import read_table
from trajflow.workflows.profile.trace import trace_events

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")


def write(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def slow_node_table(path):
    """8 ranks on 2 hosts; host b's 4 ranks read 3x slower; the others wait at the barrier.
    No t_total (summed from the phases) and a column of the tool's own (ignored)."""
    rows = []
    for rank in range(8):
        io = 3.0 if rank >= 4 else 1.0 + 0.01 * rank
        work = 0.2 + io + 1.0 + 0.05
        rows.append([rank, "a" if rank < 4 else "b", 100, 0.2, io, 1.0, 4.25 - work, 0.05, "x"])
    return write(path, ["rank", "host", "frames", "t_open", "t_io", "t_compute", "t_wait",
                        "t_comm", "mem_gb"], rows)


def test_a_slow_node_in_a_table_is_one_host_flag_with_its_victims(tmp_path):
    table = slow_node_table(tmp_path / "mine.csv")
    records, ignored = read_table(table)
    assert ignored == ["mem_gb"]
    assert records[0]["t_total"] == pytest.approx(4.25)  # the phases summed, wait included
    report = inspect_runs([], [table])
    [flag] = report["stragglers"]
    assert (flag["kind"], flag["host"], flag["ranks"], flag["cause"]) == ("host", "b", [4, 5, 6, 7], "io")
    baseline = (2.26 + 2.27) / 2  # the fast mode's median work: ranks 0-3
    assert flag["baseline_s"] == pytest.approx(baseline) and flag["ratio"] == pytest.approx(4.25 / baseline)
    # ranks 0-3 waited at the barrier for host b: 4.25 - their own work, each counted up to
    # host b's excess over the baseline
    waits = [4.25 - (2.25 + 0.01 * r) for r in range(4)]
    assert flag["victims_wait_s"] == pytest.approx(sum(min(w, 4.25 - baseline) for w in waits))


def test_the_command_judges_tables_and_writes_json_and_a_trace(tmp_path):
    table = slow_node_table(tmp_path / "mine.csv")
    groups = write(tmp_path / "two.csv", ["group", "rank", "t_total"],
                   [["rdf", 0, 10.0], ["rdf", 1, 10.2], ["rdf", 2, 9.9], ["rdf", 3, 30.0],
                    ["msd", 0, 5.0], ["msd", 1, 5.1], ["msd", 2, 5.0], ["msd", 3, 4.9]])
    out = subprocess.run([TRAJFLOW, "inspect", "--table", table, "--table", groups,
                          "--json", str(tmp_path / "r.json"), "--trace", str(tmp_path / "t.json")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "columns ignored (not known): mem_gb" in out.stdout
    assert "[host] host b (ranks 4-7)" in out.stdout
    assert "two.csv rdf [rank] rank 3:" in out.stdout  # each group judged on its own
    flags = json.load(open(tmp_path / "r.json"))["stragglers"]
    assert sorted((f["task"], f["kind"]) for f in flags) == [("ranks", "host"), ("rdf", "rank")]
    trace = json.load(open(tmp_path / "t.json"))["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X"]
    assert len(spans) == 16 and {e["name"] for e in spans} == {"rank"}
    rank3 = next(e for e in spans if e["args"]["run"] == "two.csv" and e["args"]["task"] == "rdf"
                 and e["args"]["rank"] == 3)
    assert rank3["dur"] == pytest.approx(30.0e6)
    instants = [e for e in trace if e["ph"] == "i"]
    assert len(instants) == 2 and any("host b" in e["args"]["flag"] for e in instants)


@pytest.mark.parametrize("header, rows, message", [
    (["host", "t_io"], [["a", 1.0]], "no 'rank' column (columns found: host, t_io)"),
    (["rank", "host"], [[0, "a"]], "no time column: give t_total or any of t_open"),
    (["rank", "t_io"], [], "a header but no rows"),
    (["rank", "t_io"], [[0, 1.0], [1, "1,5"]], "row 3, column t_io: '1,5' is not a number"),
    (["rank", "t_io"], [[0, 1.0], ["one", 1.0]], "row 3, column rank: 'one' is not an integer"),
    (["rank", "t_io"], [[0, 1.0], [0, 1.2]], "row 3, column rank: rank 0 appears twice"),
    (["rank", "t_io"], [[0, -1.0]], "row 2, column t_io: '-1.0' is negative"),
    (["rank", "t_io", "t_total"], [[0, 2.0, 1.0]], "row 2, column t_total: 1.0 s is less than"),
    (["rank", "t_io"], [[0, ""]], "row 2, column t_io: empty"),
])
def test_a_bad_table_is_refused_naming_row_and_column(tmp_path, header, rows, message):
    table = write(tmp_path / "bad.csv", header, rows)
    with pytest.raises(InputError, match=None) as err:
        read_table(table)
    assert message in str(err.value) and "bad.csv" in str(err.value)
    out = subprocess.run([TRAJFLOW, "inspect", "--table", table], capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_nothing_to_inspect_is_refused(tmp_path):
    out = subprocess.run([TRAJFLOW, "inspect"], capture_output=True, text=True)
    assert out.returncode == 2 and "--table FILE.csv" in out.stderr
    out = subprocess.run([TRAJFLOW, "inspect", "--table", str(tmp_path / "no.csv")],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "no.csv" in out.stderr and "does not exist" in out.stderr


def test_a_trace_holds_every_interval_and_radicals_share():
    t = 1000.0
    rec = {"run": "r", "task": "analyze", "rank": 1, "host": "n1", "block": 1, "frames": 10,
           "mode": "mpi", "rp_task_id": "task.000003", "t_start": t, "t_stop": t + 3.0,
           "t_total": 3.0, "intervals": [["io", t, t + 1.0], ["compute", t + 1.0, t + 2.5],
                                         ["wait", t + 2.5, t + 3.0]],
           "radical": {"launch_start": t - 2.0, "rank_start": t - 1.5, "rank_stop": t + 3.25}}
    trace = trace_events({"records": [rec], "stragglers": []})
    spans = {e["name"]: e for e in trace["traceEvents"] if e["ph"] == "X"}
    assert set(spans) == {"io", "compute", "wait", "launch", "start-up", "exit"}
    for e in trace["traceEvents"]:  # the format's required fields, per kind of event
        assert {"name", "ph", "pid"} <= set(e) and (e["ph"] != "X" or {"ts", "dur", "tid"} <= set(e))
    # microseconds on RADICAL's clock: the launch starts at RADICAL's launch_start
    assert (spans["launch"]["ts"], spans["launch"]["dur"]) == (pytest.approx((t - 2.0) * 1e6),
                                                               pytest.approx(0.5e6))
    assert spans["start-up"]["dur"] == pytest.approx(1.5e6)
    assert spans["compute"]["ts"] == pytest.approx((t + 1.0) * 1e6)
    assert spans["exit"]["dur"] == pytest.approx(0.25e6)
    assert spans["io"]["args"] == {"run": "r", "task": "analyze", "rank": 1, "host": "n1",
                                   "block": 1, "frames": 10, "seconds": 1.0}
    names = {e["name"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"
             and e["name"] in ("process_name", "thread_name")}
    assert names == {"process_name": "r analyze (task.000003)", "thread_name": "rank 1 on n1"}


@pytest.mark.serial  # judges time: run alone (see the Makefile)
def test_a_runs_records_written_as_a_table_give_the_same_flags(tmp_path, adk):
    """A real MPI run with 1 s of I/O injected into rank 2, its records written in the
    documented format (as a user's own script would), judged from the table: the
    same flag, member, cause and numbers as from the run itself."""
    from run_stages import plan_and_run
    from trajflow.workflows.profile.inspection import load_run
    run = tmp_path / "run"
    plan_and_run(run, adk[0], [adk[1]], "rmsd", env={"TRAJFLOW_TEST_DELAY": "2:io:1.0"},
                 mode="mpi", blocks=4, cpus=4, chunk=8, schedule="static")
    _, records = load_run(str(run))
    ranks = [r for r in records if r["task"] == "analyze"]
    table = write(tmp_path / "ranks.csv",
                  ["rank", "host", "frames", "t_open", "t_io", "t_compute", "t_wait", "t_comm",
                   "t_write", "t_total"],
                  [[r["rank"], r["host"], r["frames"],
                    r.get("t_open_topology", 0) + r.get("t_open_trajectory", 0), r["t_io"],
                    r["t_compute"], r["t_wait"], r["t_comm"],
                    r.get("t_write", 0) + r.get("t_convert", 0), r["t_total"]] for r in ranks])
    [from_run] = inspect_runs([str(run)])["stragglers"]
    [from_table] = inspect_runs([], [table])["stragglers"]
    # what was injected, not what the judge computed: 98 frames in 4 static blocks, one
    # extra second of I/O on rank 2, which the others waited for
    assert sorted(r["frames"] for r in ranks) == [24, 24, 25, 25]
    for flag in (from_run, from_table):
        assert (flag["kind"], flag["rank"], flag["cause"]) == ("rank", 2, "io")
        assert flag["excess_s"] == pytest.approx(1.0, abs=0.3)
        assert flag["victims_wait_s"] == pytest.approx(3.0, abs=0.9)
    for key in ("kind", "rank", "host", "cause", "baseline"):
        assert from_table[key] == from_run[key], key
    for key in ("duration_s", "baseline_s", "excess_s", "victims_wait_s"):
        assert from_table[key] == pytest.approx(from_run[key], abs=1e-3), key


def test_a_published_t_total_rounded_below_the_phases_sum_is_accepted(tmp_path):
    """A table from another tool rounds each number: a t_total one unit of its last
    digit below the phases' sum (1076.428852 against 1076.428853) is whole; two units
    of each printed number in a coarser table too; a clearly short one is refused."""
    rows = [[0, "1000.000001", "76.428852", "1076.428852"],
            [1, "1000.000001", "76.428852", "1076.428852"]]
    recs, _ = read_table(write(tmp_path / "paper.csv", ["rank", "t_io", "t_compute", "t_total"], rows))
    assert [r["t_total"] for r in recs] == [1076.428852, 1076.428852]
    # 1.045 + 1.045 = 2.090, printed to two decimals each: 1.05 + 1.05 and 2.09
    recs, _ = read_table(write(tmp_path / "coarse.csv", ["rank", "t_io", "t_compute", "t_total"],
                               [[0, "1.05", "1.05", "2.09"]]))
    assert recs[0]["t_total"] == 2.09
    with pytest.raises(InputError, match="is less than the sum of the phases"):
        read_table(write(tmp_path / "short.csv", ["rank", "t_io", "t_compute", "t_total"],
                         [[0, "1000.000001", "76.428852", "1070.4"]]))
