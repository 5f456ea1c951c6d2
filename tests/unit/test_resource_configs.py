"""Every shipped resource config checked against RADICAL-Pilot's own entry for that
machine (read from the installed RADICAL-Pilot's configs): its launch methods are
ones RADICAL-Pilot configures for that machine, and the machine's cores per node,
batch system and access schemas agree with RADICAL-Pilot's where it states them.
A label RADICAL-Pilot does not know (this machine's SLURMs, Stampede3) carries the
whole entry itself. None of these clusters has been run on for real yet (README)."""
import os

import pytest
import radical.pilot
import radical.utils as ru

from trajflow.workflows.run import resources

RP_CONFIGS = os.path.join(os.path.dirname(radical.pilot.__file__), "configs")


def shipped():
    for path in resources.shipped_config_files():
        facility = os.path.basename(path)[len("resource_"):-len(".json")]
        theirs_path = os.path.join(RP_CONFIGS, f"resource_{facility}.json")
        theirs = ru.read_json(theirs_path) if os.path.exists(theirs_path) else {}
        for name, ours in ru.read_json(path).items():
            yield f"{facility}.{name}", ours, theirs.get(name)


LABELS = {label: (ours, theirs) for label, ours, theirs in shipped()}
# its one node is this machine, with as many cores as it has (single_node.sh: CPUs=$(nproc))
NODE_OF_ANY_SIZE = {"local.slurm"}


@pytest.mark.parametrize("label", sorted(LABELS))
def test_a_shipped_config_agrees_with_radical_pilots_own_entry(label):
    ours, theirs = LABELS[label]
    order = ours["launch_methods"]["order"]
    assert set(order) <= set(ours["launch_methods"]) - {"order"}, label
    if theirs is None:  # a machine of ours alone: the entry is whole
        forked = ours.get("resource_manager") == "FORK"  # this machine: no queue; cores asked
        for key in ("resource_manager", "schemas", "default_schema", "cores_per_node",
                    "default_queue"):
            assert key in ours or (key == "cores_per_node" and label in NODE_OF_ANY_SIZE) \
                or (forked and key in ("cores_per_node", "default_queue")), (label, key)
        assert ours["default_schema"] in ours["schemas"]
        return
    known = set(theirs.get("launch_methods", {})) - {"order"}
    assert set(order) <= known, (f"{label}: launch methods {sorted(set(order) - known)} are not "
                                 f"configured by RADICAL-Pilot for this machine ({sorted(known)})")
    for key in ("cores_per_node", "gpus_per_node", "resource_manager", "default_schema"):
        if key in ours and key in theirs:
            assert ours[key] == theirs[key], (label, key, ours[key], theirs[key])
    assert "cores_per_node" in ours or "cores_per_node" in theirs or label == "local.localhost", \
        f"{label}: no cores per node anywhere: the pilot's node count cannot be computed"
    for schema in ours.get("schemas", {}):
        assert schema in theirs.get("schemas", {}) or schema == "batch", (label, schema)


def test_every_shipped_label_is_checked():
    assert {"access.expanse", "access.bridges2", "ncsa.delta", "purdue.anvil", "tacc.frontera",
            "tacc.stampede3", "local.localhost", "local.slurm", "local.vcluster",
            "local.localhost_agent_core"} <= set(LABELS)


def test_a_config_keeping_cpus_for_the_agent_pins_it_and_tells_the_tasks(tmp_path):
    """local.localhost_agent_core keeps CPU 0: the session's config pins the bootstrap
    there, declares the kept core on top of the pilot's (RADICAL takes it off again),
    and the tasks are told which CPUs to leave; a config keeping none adds nothing."""
    assert resources.agent_cores("local.localhost_agent_core") == (0,)
    assert resources.agent_environment("local.localhost_agent_core") == {
        "TRAJFLOW_AGENT_CORES": "0"}
    assert resources.agent_cores("local.localhost") == ()
    assert resources.agent_environment("local.localhost") == {}
    for label, pinned in (("local.localhost_agent_core", True), ("local.localhost", False)):
        folder = resources.session_configs(str(tmp_path / label), label, 1)
        facility, _, name = label.partition(".")
        cfg = ru.read_json(os.path.join(folder, ".radical", "pilot", "configs",
                                        f"resource_{facility}.json"))[name]
        assert cfg["cores_per_node"] == (2 if pinned else 1)
        pins = [e for e in cfg["pre_bootstrap_0"] if "base64" in e
                and "trajflow.tasks.placement" in base64_payload(e)]
        assert len(pins) == (1 if pinned else 0), cfg["pre_bootstrap_0"]
        if pinned:
            assert "--positions 0 --pin $$" in base64_payload(pins[0])


def base64_payload(entry):
    import base64
    return base64.b64decode(entry.split("echo ", 1)[1].split(" |", 1)[0]).decode()


def test_a_pilot_in_this_virtualenv_has_its_bin_first_before_the_bootstrap_looks(tmp_path):
    """The bootstrapper runs `python3` (and pip) before it activates the virtualenv: the
    session's config puts this virtualenv's bin first on its PATH, the entry read by a
    shell as the bootstrapper runs it (its own pre_bootstrap_0 function)."""
    import sys
    entries = _localhost_entries(tmp_path, "export PATH=")
    assert _bootstrap_shell(entries[0], "", "$PATH") == \
        f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"


def _localhost_entries(tmp_path, beginning):
    """local.localhost's pre_bootstrap_0 entries (in a session's config) whose command
    begins with `beginning`: one, checked."""
    folder = resources.session_configs(str(tmp_path / "s"), "local.localhost", 1)
    cfg = ru.read_json(os.path.join(folder, ".radical", "pilot", "configs",
                                    "resource_local.json"))["localhost"]
    entries = [e for e in cfg["pre_bootstrap_0"] if "base64" in e
               and base64_payload(e).startswith(beginning)]
    assert len(entries) == 1, cfg["pre_bootstrap_0"]
    return entries


def _bootstrap_shell(entry, before, echo, after=""):
    """What RADICAL's bootstrap_0.sh leaves after running `entry` as a pre_bootstrap_0
    command (its own pre_bootstrap_0 and run_cmd functions, taken from the installed
    script), `before` run first, `after` then, `echo` said last."""
    import re
    import subprocess
    import radical.pilot
    script = os.path.join(os.path.dirname(radical.pilot.__file__), "agent", "bootstrap_0.sh")
    with open(script, encoding="utf-8") as fh:
        text = fh.read()
    functions = [re.search(rf"^{name}\(\)\n\{{.*?^\}}$", text, re.M | re.S)
                 for name in ("run_cmd", "pre_bootstrap_0")]
    assert all(functions), "RADICAL's bootstrap_0.sh no longer has these functions"
    program = "\n".join(["profile_event() { :; }", *(f.group(0) for f in functions), before,
                          'pre_bootstrap_0 "$1" > /dev/null', after, f'echo "{echo}"'])
    said = subprocess.run(["bash", "-c", program, "bash", entry], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    return said.stdout.strip()


def test_the_agent_is_launched_through_trajflows_agent_start_unless_turned_off(tmp_path,
                                                                              monkeypatch):
    """The bootstrapper's LAUNCHER (empty, or Cray's ccmrun) gets trajflow's agent start
    behind it, as a shell reads the entry; TRAJFLOW_FORKED_STARTS=0 turns its forked
    starts and task server off (its RPC requests are still sent again: agent_rpc.py),
    TRAJFLOW_TASK_SERVER=0 its task server."""
    import sys
    monkeypatch.delenv("TRAJFLOW_TASK_SERVER", raising=False)
    monkeypatch.delenv("TRAJFLOW_FORKED_STARTS", raising=False)
    entries = _localhost_entries(tmp_path, "LAUNCHER=")
    ours = f"{sys.executable} -P -m trajflow.tasks.agent_start"
    assert _bootstrap_shell(entries[0], "LAUNCHER=", "$LAUNCHER") == ours
    assert _bootstrap_shell(entries[0], "LAUNCHER=ccmrun", "$LAUNCHER") == f"ccmrun {ours}"
    assert resources.agent_serves_tasks("local.localhost")
    monkeypatch.setenv("TRAJFLOW_TASK_SERVER", "0")
    off = resources.agent_start_entry()[0]
    assert _bootstrap_shell(off, "LAUNCHER=", "$LAUNCHER") == f"{ours} --no-task-server"
    assert not resources.agent_serves_tasks("local.localhost")
    monkeypatch.setenv("TRAJFLOW_FORKED_STARTS", "0")
    monkeypatch.delenv("TRAJFLOW_TASK_SERVER")
    off = resources.agent_start_entry()[0]
    assert (_bootstrap_shell(off, "LAUNCHER=", "$LAUNCHER")
            == f"{ours} --no-forked-starts --no-task-server")
    assert not resources.agent_serves_tasks("local.localhost")


# RADICAL-Pilot 1.103's rehash() in bootstrap_0.sh, whose copy QUIET_REHASH is
RADICALS_REHASH = "34729f1efefbb3b9adff0512709e001c8c8ea6747b66687643a8b8542f4b7743"


def test_the_bootstrappers_rehash_is_replaced_by_one_without_pip(tmp_path):
    """Run as the bootstrapper runs it, the entry replaces RADICAL's own rehash() (defined
    before, as in bootstrap_0.sh); the replacement sets what RADICAL's sets, and runs no
    pip. RADICAL's rehash is checked to be the one copied (a release that changed it
    would need the copy looked at again)."""
    import hashlib
    import re
    import shutil
    import subprocess
    import sys
    import radical.pilot
    script = os.path.join(os.path.dirname(radical.pilot.__file__), "agent", "bootstrap_0.sh")
    with open(script, encoding="utf-8") as fh:
        theirs = re.search(r"^rehash\(\)\n\{.*?^\}$", fh.read(), re.M | re.S).group(0)
    assert hashlib.sha256(theirs.encode()).hexdigest() == RADICALS_REHASH, (
        "RADICAL-Pilot's rehash() changed: compare it with resources.QUIET_REHASH")
    entries = _localhost_entries(tmp_path, "rehash() {")
    path_python = shutil.which("python3", path="/usr/bin:/bin")  # the shell's PATH there
    for called, python in ((f"rehash {sys.executable}", sys.executable),  # its first call
                           ("rehash", path_python)):  # virtenv_eval's: the PATH's python3
        said = _bootstrap_shell(entries[0], theirs, "$PYTHON|$PYTHON_VERSION|$PIP",
                                after=called)
        if python is None:
            assert "ERROR: no python" in said, said
            continue
        *out, values = said.splitlines()
        assert "its version not asked" in "\n".join(out) and "PIP version" not in said, said
        asked = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        assert values == f"{python}|{asked}|{python} -m pip", said



# RADICAL-Pilot 1.103's create_deactivate() in bootstrap_0.sh, whose copy QUIET_DEACTIVATE is
RADICALS_DEACTIVATE = "2378bfbb946fadf67877d1744720eeeebd7eff1df3903f1701abf250c4010d4a"


def test_the_bootstrappers_deactivate_scripts_are_all_but_the_unread_one(tmp_path):
    """Run as the bootstrapper runs it (RADICAL's create_deactivate() defined first), the
    entry's create_deactivate() writes env/bs0_pre_0.sh as RADICAL's does (agent_0 sources
    it), and not env/bs0_orig.sh (nothing reads it: 0.85 s of each pilot's start)."""
    import hashlib
    import re
    import shutil
    import subprocess
    import sys
    import radical.pilot
    script = os.path.join(os.path.dirname(radical.pilot.__file__), "agent", "bootstrap_0.sh")
    with open(script, encoding="utf-8") as fh:
        text = fh.read()
    theirs = re.search(r"^create_deactivate\(\)\n\{.*?^\}$", text, re.M | re.S).group(0)
    assert hashlib.sha256(theirs.encode()).hexdigest() == RADICALS_DEACTIVATE, (
        "RADICAL-Pilot's create_deactivate() changed: compare it with "
        "resources.QUIET_DEACTIVATE")
    (entry,) = _localhost_entries(tmp_path, "create_deactivate() {")
    helpers = [re.search(rf"^{name}\(\)\n\{{.*?^\}}$", text, re.M | re.S).group(0)
               for name in ("run_cmd", "pre_bootstrap_0")]
    written = {}
    for which, defined in (("radical's", ""), ("trajflow's", 'pre_bootstrap_0 "$1" > /dev/null')):
        folder = tmp_path / "sandbox"  # one path for both: the scripts name it
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "env").mkdir(parents=True)
        program = "\n".join(["profile_event() { :; }", *helpers, theirs, defined,
                             ". radical-utils-env.sh", "env_dump -t env/bs0_orig.env",
                             "env_dump -t env/bs0_pre_0.env", "export TRAJFLOW_ACTIVE=1",
                             "create_deactivate > /dev/null"])
        said = subprocess.run(["bash", "-c", program, "bash", entry], cwd=folder,
                              capture_output=True, text=True, timeout=60,
                              env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"})
        assert said.returncode == 0, said.stderr
        written[which] = {p.name: p.read_text() for p in (folder / "env").iterdir()}
    assert set(written["radical's"]) - set(written["trajflow's"]) == {"bs0_orig.sh"}
    assert written["trajflow's"]["bs0_pre_0.sh"] == written["radical's"]["bs0_pre_0.sh"]
    assert "TRAJFLOW_ACTIVE" in written["trajflow's"]["bs0_pre_0.sh"]
