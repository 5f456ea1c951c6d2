"""trajflow's RADICAL configs merge under the user's own, and RADICAL-Pilot loads them."""
import json
import os
import subprocess
import sys


def _load_in_fresh_process(home, resource="local.localhost"):
    code = ("import json, os; from trajflow.workflows import resources as r; "
            "r.activate_configs(); c = r.resource_config(%r).as_dict(); "
            "print(json.dumps({'lm': c['launch_methods'], 'cpn': c['cores_per_node'], "
            "'known': r.known_resources()}))" % resource)
    env = {**os.environ, "HOME": str(home)}
    env.pop("RADICAL_CONFIG_USER_DIR", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_shipped_local_config_puts_the_venv_mpiexec_first(tmp_path):
    cfg = _load_in_fresh_process(tmp_path)
    assert cfg["lm"]["order"][:2] == ["FORK", "MPIEXEC"]
    pre = " ".join(cfg["lm"]["MPIEXEC"]["pre_exec_cached"])
    assert os.path.dirname(sys.executable) in pre and "${TRAJFLOW_VENV_BIN}" not in pre
    assert os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpiexec"))


def test_users_own_configs_are_kept_and_win(tmp_path):
    configs = tmp_path / ".radical" / "pilot" / "configs"
    configs.mkdir(parents=True)
    (configs / "resource_local.json").write_text(json.dumps({"localhost": {"cores_per_node": 64}}))
    (configs / "resource_mysite.json").write_text(json.dumps({"bigiron": {
        "schemas": {"local": {"job_manager_endpoint": "fork://localhost/",
                              "filesystem_endpoint": "file://localhost/"}},
        "default_schema": "local", "resource_manager": "FORK", "cores_per_node": 8}}))
    cfg = _load_in_fresh_process(tmp_path)
    assert cfg["cpn"] == 64                          # the user's value wins
    assert cfg["lm"]["order"][:2] == ["FORK", "MPIEXEC"]  # our fix is still there
    assert "mysite.bigiron" in cfg["known"]           # the user's own site is still visible
