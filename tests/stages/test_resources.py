"""trajflow's RADICAL configs merge under the user's own, and RADICAL-Pilot loads them."""
import json
import os
import subprocess
import sys


def _load_in_fresh_process(home, resource="local.localhost"):
    code = ("import json, os; from trajflow.workflows.run import resources as r; "
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


def _in_fresh_process(home, code):
    env = {**os.environ, "HOME": str(home)}
    env.pop("RADICAL_CONFIG_USER_DIR", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_every_shipped_config_loads_through_radical_pilots_loader_and_schema(tmp_path):
    """Each label of each shipped file, merged, passes RP's ResourceConfig.verify()
    (types and known keys) and keeps what trajflow added to RADICAL's entry."""
    code = r'''
import json, os
import radical.pilot as rp
import radical.utils as ru
from trajflow.workflows.run import resources as r
r.activate_configs()
out = {}
for path in r.shipped_config_files():
    facility = os.path.basename(path)[len("resource_"):-len(".json")]
    for name, ours in ru.read_json(path).items():
        label = f"{facility}.{name}"
        cfg = rp.utils.get_resource_config(resource=label).as_dict()
        rp.ResourceConfig(from_dict=cfg).verify()
        out[label] = {"cfg": cfg, "ours": ours}
print(json.dumps(out))
'''
    proc = _in_fresh_process(tmp_path, code)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"local.localhost", "local.slurm", "access.expanse", "access.bridges2",
            "tacc.frontera", "tacc.stampede3", "ncsa.delta", "purdue.anvil"} <= set(loaded)
    for label, both in loaded.items():
        cfg, ours = both["cfg"], both["ours"]
        assert cfg["launch_methods"]["order"] == ours["launch_methods"]["order"], label
        if label in ("local.localhost", "local.localhost_agent_core"):  # this machine, forked
            assert cfg["resource_manager"] == "FORK", label
        else:
            assert cfg["resource_manager"] == "SLURM", label
            assert cfg["virtenv_mode"] == "local" and cfg["rp_version"] == "installed", label
            assert cfg["schemas"][cfg["default_schema"]]["job_manager_endpoint"].startswith("slurm"), label
    # extended, not copied: RADICAL's own keys we did not set are still there
    assert loaded["access.expanse"]["cfg"]["cores_per_node"] == 128
    assert "cores_per_node" not in loaded["access.expanse"]["ours"]
    assert loaded["tacc.frontera"]["cfg"]["mandatory_args"] == ["project"]


def test_a_users_config_with_an_unknown_key_is_rejected_by_name(tmp_path):
    configs = tmp_path / ".radical" / "pilot" / "configs"
    configs.mkdir(parents=True)
    (configs / "resource_local.json").write_text(json.dumps({"localhost": {"corez_per_node": 4}}))
    proc = _in_fresh_process(tmp_path, "import sys; from trajflow.workflows.cli.main import main; "
                             "sys.exit(main(['resources', 'local.localhost']))")
    assert proc.returncode == 2
    assert "corez_per_node" in proc.stderr and "local.localhost" in proc.stderr


def test_resources_lists_shipped_radicals_and_users(tmp_path):
    configs = tmp_path / ".radical" / "pilot" / "configs"
    configs.mkdir(parents=True)
    (configs / "resource_mysite.json").write_text(json.dumps({"bigiron": {
        "schemas": {"local": {"job_manager_endpoint": "fork://localhost/",
                              "filesystem_endpoint": "file://localhost/"}},
        "default_schema": "local", "resource_manager": "FORK", "cores_per_node": 8}}))
    proc = _in_fresh_process(tmp_path, "import sys; from trajflow.workflows.cli.main import main; "
                             "sys.exit(main(['resources']))")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:-1]}
    assert len(rows) > 40  # RADICAL-Pilot's own too, every one
    assert rows["tacc.stampede3"].endswith(" trajflow")
    assert rows["access.expanse"].split()[1:3] == ["SLURM", "128"]
    assert rows["access.expanse"].endswith("radical + trajflow")
    assert rows["mysite.bigiron"].split()[1:4] == ["FORK", "8", "local"]
    assert rows["mysite.bigiron"].endswith(" user")
    shown = _in_fresh_process(tmp_path, "import sys; from trajflow.workflows.cli.main import main; "
                              "sys.exit(main(['resources', 'tacc.stampede3']))")
    assert shown.returncode == 0 and '"default_queue": "skx"' in shown.stdout
    # a platform's name alone is enough when it is unique; a typo gets the nearest labels
    short = _in_fresh_process(tmp_path, "import sys; from trajflow.workflows.cli.main import main; "
                              "sys.exit(main(['resources', 'bigiron']))")
    assert short.returncode == 0 and short.stdout.startswith("# mysite.bigiron:"), short.stderr
    typo = _in_fresh_process(tmp_path, "import sys; from trajflow.workflows.cli.main import main; "
                             "sys.exit(main(['resources', 'local.locahost']))")
    assert typo.returncode == 2 and "did you mean local.localhost" in typo.stderr
    assert "Traceback" not in typo.stderr and len(typo.stderr.strip().splitlines()) == 1
