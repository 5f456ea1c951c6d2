"""`trajflow bench --setup-growth` and `--model` end to end (mpiexec, no pilot): every
number they promise, in the JSON, and the model's refusal of numbers it cannot use."""
import json
import os
import subprocess
import sys

import pytest

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
MEASURED = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "data",
                        "manycore-16-cores.json")


def bench(*args, tmp_path, timeout=600):
    return subprocess.run([TRAJFLOW, "bench", *args], capture_output=True, text=True,
                          timeout=timeout,
                          env={**os.environ, "TRAJFLOW_CACHE": str(tmp_path / "cache")})


def test_setup_growth_names_each_part_at_each_rank_count(tmp_path):
    out = tmp_path / "setup.json"
    proc = bench("--setup-growth", "--ranks", "1", "2", "4", "--launches", "1", "--json",
                 str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("setup_growth", "after_arrival", "arrival_skew", "setup_cpu"):
        assert set(result[key]) == {"1", "2", "4"}, key
    for n in ("1", "2", "4"):
        assert 0 < result["after_arrival"][n] <= result["setup_growth"][n] + 0.05
        assert set(result["setup_parts"][n]) == {"plan", "inputs", "imports", "kernels", "mpi_init"}
        assert result["setup_cpu"][n] > 0
    assert result["arrival_skew"]["1"] == 0
    assert "after" in proc.stdout and "skew" in proc.stdout


def test_the_model_predicts_to_1024_ranks_from_a_16_core_nodes_numbers(tmp_path):
    out = tmp_path / "model.json"
    proc = bench("--model", "--measured", MEASURED, "--json", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    model = json.loads(out.read_text())["model"]
    for schedule in ("static", "dynamic"):
        e = {int(n): v for n, v in model["efficiency"][schedule].items()}
        assert sorted(e) == [16, 32, 64, 128, 256, 512, 1024]
        assert all(0 < v <= 1.2 for v in e.values()), e
        assert e[1024] < e[16]  # set-up and the wait for the launch do not shrink with N
    dyn, static = model["efficiency"]["dynamic"], model["efficiency"]["static"]
    assert dyn["1024"] > static["1024"]  # the papers' stragglers across nodes: dynamic copes
    assert [v["ranks"] for v in model["validation"]] == [2, 4, 8, 16]
    for v in model["validation"]:
        assert v["measured_s"] > 0 and v["predicted_s"] > 0
        assert v["error"] == pytest.approx(v["predicted_s"] / v["measured_s"] - 1)
    assert model["claims"]["remote_s"] > model["claims"]["shared_s"] > 0
    assert "prediction error: median" in proc.stdout and "bites" in proc.stdout


def test_the_model_refuses_numbers_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cores": 16, "setup": {}}))
    proc = bench("--model", "--measured", str(bad), tmp_path=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "not the numbers of trajflow.workflows.bench.manycore" in proc.stderr
