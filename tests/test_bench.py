"""`trajflow bench` runs end to end on a small system and writes every number it promises."""
import json
import os
import subprocess
import sys

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
KEYS = {"rmsd": ["ours_compute_us", "mdtraj_compute_us", "mda_loop_compute_us", "ours_e2e_dcd_us",
                 "mda_rmsd_run_dcd_us", "mda_mp2_rmsd_run_dcd_us", "seed_loop_e2e_dcd_us",
                 "ours_e2e_xtc_us", "ours_e2e_h5md_us", "mda_h5md_iter_us"],
        "dihedrals": ["ours_compute_us", "seed_loop_compute_us", "mda_calc_dihedrals_compute_us",
                      "ours_e2e_dcd_us"],
        "parallel": ["analyze_1rank_s", "analyze_2rank_s", "efficiency_2"],
        "startup": ["warm_start_s", "fresh_start_s", "exit_s", "prepare_s", "jit_start_s"],
        "user_analysis": ["ours_2rank_stage_s", "ours_2rank_wall_s", "mda_mp2_s", "n_frames"]}


def test_bench_prints_ratios_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([TRAJFLOW, "bench", "--copies", "2", "--repeats", "1", "--loop-frames", "8",
                           "--no-entk", "--user-copies", "1", "--startup-launches", "1", "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRAJFLOW_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    assert "ratios" in proc.stdout and "rmsd compute: ours / mdtraj" in proc.stdout
    result = json.loads(out.read_text())
    assert result["system"]["n_frames"] == 196 and result["user_analysis"]["n_frames"] == 10
    assert "InterRDF: MDA 2-worker run / ours 2 ranks (stage)" in proc.stdout
    assert "a task's start-up" in proc.stdout
    for section, keys in KEYS.items():
        for key in keys:
            assert result[section][key] > 0, (section, key)
