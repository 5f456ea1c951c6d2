"""Resources: which machine the pilot goes to, and the RADICAL configs to get there.

RADICAL-Pilot merges user resource configs from
$RADICAL_CONFIG_USER_DIR/.radical/pilot/configs/resource_<facility>.json over
its own. trajflow ships configs of its own (resource_configs/), and must not
hide the user's: `prepare_config_dir` builds one folder holding a copy of the
user's ~/.radical tree with trajflow's configs merged underneath it (the
user's keys win), points RADICAL_CONFIG_USER_DIR at it, and fills in the
placeholder ${TRAJFLOW_VENV_BIN} (the bin folder holding this Python and the
`mpiexec` of the mpich wheel).
"""
import atexit
import base64
import copy
import difflib
import glob
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from importlib import resources as importlib_resources

from trajflow.tasks.agent_start import NO_FORKED_STARTS, NO_TASK_SERVER
from trajflow.tasks.component_starter import DISABLE_ENV as FORKED_STARTS_ENV
from trajflow.tasks.task_server import DISABLE_ENV as TASK_SERVER_ENV
from trajflow.tasks.placement import AGENT_CORES_ENV
from trajflow.workflows.run.batch import BATCH_SYSTEMS

VENV_BIN_PLACEHOLDER = "${TRAJFLOW_VENV_BIN}"


def venv_bin() -> str:
    return os.path.dirname(os.path.abspath(sys.executable))


def activate_venv():
    """Make the environment look like an activated virtualenv of this Python.

    RADICAL-Pilot's bootstrapper finds its agent through $VIRTUAL_ENV and
    $PATH; a `trajflow` started by its full path, without `activate`, would
    otherwise launch a pilot that cannot find `radical-pilot-agent_0`.
    """
    if sys.prefix != sys.base_prefix:
        os.environ["VIRTUAL_ENV"] = sys.prefix
    path = os.environ.get("PATH", "").split(os.pathsep)
    if venv_bin() not in path[:1]:
        os.environ["PATH"] = os.pathsep.join([venv_bin()] + [p for p in path if p != venv_bin()])


def shipped_config_files():
    folder = importlib_resources.files("trajflow.resource_configs")
    return sorted(str(p) for p in folder.iterdir() if p.name.startswith("resource_")
                  and p.name.endswith(".json"))


def deep_merge(base: dict, over: dict) -> dict:
    """`over` on top of `base`, dict by dict (lists and values are replaced)."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _fill_placeholders(obj):
    if isinstance(obj, str):
        return obj.replace(VENV_BIN_PLACEHOLDER, venv_bin())
    if isinstance(obj, list):
        return [_fill_placeholders(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _fill_placeholders(v) for k, v in obj.items()}
    return obj


def user_radical_dir() -> str:
    """The user's own RADICAL folder (not the private one trajflow points RADICAL at)."""
    base = _ACTIVE.get("user_base") or os.environ.get("RADICAL_CONFIG_USER_DIR") \
        or os.path.expanduser("~")
    return os.path.join(base, ".radical")


def prepare_config_dir(target: str) -> str:
    """Build <target>/.radical (user's configs + ours) and point RADICAL at it."""
    dest = os.path.join(target, ".radical")
    src = user_radical_dir()
    if os.path.abspath(src) == os.path.abspath(dest):
        return target
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    # only the user's configs (<module>/configs/): ~/.radical also holds radical.utils'
    # per-session id counters, 4 MB after a day of runs here, that have no place in a copy
    for configs in glob.glob(os.path.join(src, "*", "configs")):
        shutil.copytree(configs, os.path.join(dest, os.path.relpath(configs, src)), symlinks=True,
                        ignore=shutil.ignore_patterns("*.log", "*.prof"))
    configs = os.path.join(dest, "pilot", "configs")
    os.makedirs(configs, exist_ok=True)
    for shipped in shipped_config_files():
        name = os.path.basename(shipped)
        with open(shipped, encoding="utf-8") as fh:
            ours = json.load(fh)
        mine = os.path.join(configs, name)
        users = {}
        if os.path.exists(mine):
            with open(mine, encoding="utf-8") as fh:
                users = json.load(fh)
        merged = _fill_placeholders(deep_merge(ours, users))
        with open(mine, "w", encoding="utf-8") as fh:
            json.dump(merged, fh, indent=2)
    os.environ["RADICAL_CONFIG_USER_DIR"] = target
    return target


_ACTIVE = {}


CONFIG_DIR_PREFIX = "trajflow-radical-config-"


def activate_configs() -> str:
    """Once per process: a private config folder (user's + ours), removed at exit.

    Its name holds the pid, so that the folder of a process that was killed
    (no exit handler ran) is removed by the next trajflow on this machine."""
    if "dir" not in _ACTIVE:
        _ACTIVE["user_base"] = os.environ.get("RADICAL_CONFIG_USER_DIR") or os.path.expanduser("~")
        remove_stale_config_dirs()
        folder = tempfile.mkdtemp(prefix=f"{CONFIG_DIR_PREFIX}{os.getpid()}-")
        atexit.register(shutil.rmtree, folder, True)
        prepare_config_dir(folder)
        _ACTIVE["dir"] = folder
    return _ACTIVE["dir"]


def remove_stale_config_dirs():
    """Remove the private config folders of trajflow processes that are gone."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), CONFIG_DIR_PREFIX + "*")):
        pid = os.path.basename(folder)[len(CONFIG_DIR_PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(folder, ignore_errors=True)


def session_configs(target, resource, cpus, pre_bootstrap=()) -> str:
    """A config folder of this session's own at `target` (as prepare_config_dir
    makes), in which `resource` also runs `pre_bootstrap` after its own
    pre_bootstrap_0 commands (the client guard), and where its resource manager
    is FORK (this machine), has exactly the `cpus` the pilot was given: RADICAL's
    local.localhost declares 8 virtual cores per node whatever was asked, and its
    scheduler ran 8 single-core tasks at once on a 2-core pilot (seen)."""
    prepare_config_dir(target)
    cfg = resource_config(resource).as_dict()
    kept = agent_cores(resource)
    pin = [agent_pin_entry(task_python(resource), kept)] if kept else []
    in_venv = ([venv_path_entry(), quiet_rehash_entry(), quiet_deactivate_entry(),
                *agent_start_entry()]
               if _in_this_venv(cfg, resource) else [])
    cfg["pre_bootstrap_0"] = (list(cfg.get("pre_bootstrap_0") or []) + in_venv + pin
                              + list(pre_bootstrap))
    if str(cfg.get("resource_manager", "")).upper() == "FORK":
        cfg["cores_per_node"] = int(cpus) + len(kept)  # RADICAL takes the kept ones off
    facility, _, name = resource.partition(".")
    path = os.path.join(target, ".radical", "pilot", "configs", f"resource_{facility}.json")
    platforms = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            platforms = json.load(fh)
    platforms[name] = cfg
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(platforms, fh, indent=2)
    return target


def _in_this_venv(cfg, resource) -> bool:
    return cfg.get("virtenv_mode") == "local" and task_python(resource) == sys.executable


def agent_serves_tasks(resource: str) -> bool:
    """Whether the pilot's agent starts through trajflow.tasks.agent_start with its task
    server (tasks/task_server.py) beside it."""
    return bool(_in_this_venv(resource_config(resource).as_dict(), resource)
                and agent_start_entry()) and NO_TASK_SERVER not in _agent_start_flags()


def _agent_start_flags() -> list:
    """What of agent_start is turned off: TRAJFLOW_FORKED_STARTS=0 turns off the forked
    starts and the task server (every start as RADICAL makes it), TRAJFLOW_TASK_SERVER=0
    the task server (the agent does not see the client's environment)."""
    forked_off = os.environ.get(FORKED_STARTS_ENV) == "0"
    return ([NO_FORKED_STARTS] if forked_off else []) + (
        [NO_TASK_SERVER] if forked_off or os.environ.get(TASK_SERVER_ENV) == "0" else [])


def pre_bootstrap_entry(command: str) -> str:
    """A `pre_bootstrap_0` entry that runs the shell `command` as written.

    RADICAL's bootstrapper passes each entry through `eval echo` and then runs
    the result with `eval`: the command travels base64-encoded through the
    first (paths with spaces, quotes or `$` arrive intact), and what it leaves
    for the shell (`$$`: the bootstrapper's pid) is expanded by the second."""
    encoded = base64.b64encode(command.encode()).decode()
    return f'"$(echo {encoded} | base64 -d)"'


def venv_path_entry() -> str:
    """A `pre_bootstrap_0` entry putting this virtualenv's bin first on the PATH, where
    the pilot runs in it: the bootstrapper looks for `python3` (and runs it, and pip)
    before it activates the virtualenv, and found pyenv's shim here, 0.6 s of every
    pilot's start (0.2 s with this one; RADICAL's bootstrap_0.prof, `rehash`)."""
    return pre_bootstrap_entry(f"export PATH={shlex.quote(venv_bin())}:\"$PATH\"")


# RADICAL-Pilot 1.103 bootstrap_0.sh's rehash() (run three times), redefined by a
# pre_bootstrap_0 entry (eval'd in its shell before it calls it) where the pilot runs in
# this virtualenv: less its `$PIP --version` (a pip import, 0.2 s each) and its CA bundle
# for pip (nothing is installed there); one line without a comma (an entry is the
# message of a profile event, a CSV line)
QUIET_REHASH = ("rehash() { profile_event 'rehash_start'; "
                'if test -z "$1"; then PYTHON=$(which python3); else PYTHON="$1"; fi; '
                'if test -z "$PYTHON"; then echo "ERROR: no python"; '
                "env_dump no_python.env; exit 1; fi; "
                "PYTHON_VERSION=$($PYTHON -c 'from sys import version_info as vi; "
                "print(f\"{vi.major}.{vi.minor}\")'); "
                'PIP="$PYTHON -m pip"; unset -f pip; '
                'echo "PYTHON            : $PYTHON"; '
                'echo "PYTHON_VERSION    : $PYTHON_VERSION"; '
                'echo "PIP               : $PIP (its version not asked: trajflow)"; '
                "profile_event 'rehash_stop'; }")


def quiet_rehash_entry() -> str:
    """A `pre_bootstrap_0` entry that redefines the bootstrapper's rehash() without its
    pip import: 0.6 s of each pilot's start here (three pip imports that printed pip's
    version)."""
    return pre_bootstrap_entry(QUIET_REHASH)


# RADICAL-Pilot 1.103 bootstrap_0.sh's create_deactivate(), redefined likewise: less the
# first of its two environment scripts, env/bs0_orig.sh (0.85 s of each pilot's start
# here), which nothing of RADICAL-Pilot 1.103 or trajflow reads (its launch methods read
# env/bs0_orig.env, the dump, written before; agent_0 sources env/bs0_pre_0.sh, kept)
QUIET_DEACTIVATE = ("create_deactivate() { profile_event 'create_deactivate_start'; "
                    ". radical-utils-env.sh; env_dump -t env/bs0_active.env; "
                    "env_prep -s env/bs0_pre_0.env -r env/bs0_active.env -t env/bs0_pre_0.sh; "
                    "profile_event 'create_deactivate_stop'; }")


def quiet_deactivate_entry() -> str:
    """A `pre_bootstrap_0` entry that redefines the bootstrapper's create_deactivate()
    without writing env/bs0_orig.sh, which nothing reads."""
    return pre_bootstrap_entry(QUIET_DEACTIVATE)


def agent_start_entry() -> list:
    """A `pre_bootstrap_0` entry that has the bootstrapper start RADICAL's agent
    through trajflow.tasks.agent_start (its LAUNCHER, a variable of the bootstrap
    script that only Cray's ccmrun otherwise sets: kept in front where set), so
    that the agent's bridges and components start by fork and its RPC requests are
    sent again while unanswered (tasks/agent_rpc.py). None where this Python's path
    would not survive the bootstrapper's word splitting."""
    python = sys.executable
    if not re.fullmatch(r"[\w./+-]+", python):
        return []
    flags = "".join(f" {flag}" for flag in _agent_start_flags())
    return [pre_bootstrap_entry(
        f'LAUNCHER="${{LAUNCHER:+$LAUNCHER }}{python} -P -m trajflow.tasks.agent_start{flags}"')]


def agent_cores(resource: str) -> tuple:
    """The cores the resource's config keeps for RADICAL's agent
    (`system_architecture.blocked_cores`: positions among a node's CPUs; RADICAL takes
    them off every node's cores): the bootstrap pins the agent there and the tasks
    leave them (tasks/placement.py)."""
    arch = (merged_config(resource) or {}).get("system_architecture") or {}
    return tuple(sorted(int(c) for c in arch.get("blocked_cores") or ()))


def agent_environment(resource: str) -> dict:
    """What the tasks need to leave the agent's cores: {} where none are kept."""
    kept = agent_cores(resource)
    return {AGENT_CORES_ENV: ",".join(map(str, kept))} if kept else {}


def agent_pin_entry(python: str, positions) -> str:
    """A `pre_bootstrap_0` entry pinning the bootstrapper, and so the agent it starts, to
    the kept cores of its node (its bootstrap_0.out says where, or why it could not)."""
    return pre_bootstrap_entry(
        shlex.join([python, "-m", "trajflow.tasks.placement", "--positions",
                    ",".join(map(str, positions))]) + " --pin $$ || echo 'trajflow: the agent "
        "was not pinned'")


def kernels_bootstrap_entry(python: str) -> str:
    """A `pre_bootstrap_0` entry building the kernels (ahead of time, into the
    kernel cache) on the pilot's node before any task starts; a failure is
    logged and leaves the tasks to numba's JIT."""
    return pre_bootstrap_entry(shlex.join([python, "-m", "trajflow.tasks.kernels"])
                               + " || echo 'trajflow: the kernels were not compiled ahead'")


def resolve_resource(name: str) -> str:
    """The whole label (facility.platform) `name` means: itself, or the one label whose
    platform is `name` (`expanse` -> access.expanse); ValueError saying what was meant
    (the nearest labels) when no label or several fit."""
    activate_configs()
    known = known_resources()
    if name in known:
        return name
    platform = {label: label.partition(".")[2] for label in known}
    fits = [label for label, short in platform.items() if short == name]
    if len(fits) == 1:
        return fits[0]
    if len(fits) > 1:
        raise ValueError(f"resource {name!r} is ambiguous: {', '.join(fits)} all have that "
                         "name; give the whole label")
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    near += [label for short in difflib.get_close_matches(name, list(platform.values()), n=3,
                                                          cutoff=0.75)
             for label in known if platform[label] == short and label not in near]
    hint = f"did you mean {' or '.join(near[:3])}? " if near else ""
    raise ValueError(f"unknown resource {name!r}: {hint}`trajflow resources` lists every "
                     "resource trajflow knows (RADICAL-Pilot's and its own), and docs/guide/clusters.md "
                     "says how to add your cluster")


def check_resource(resource: str):
    """ValueError (see resolve_resource) unless RADICAL-Pilot has a valid config for
    `resource` (a whole label, or a platform's name that names one)."""
    resource = resolve_resource(resource)
    cfg = resource_config(resource)
    import radical.pilot as rp
    try:  # RADICAL-Pilot's own schema: unknown keys and wrong types, named
        rp.ResourceConfig(from_dict=cfg.as_dict()).verify()
    except Exception as exc:
        origin = " + ".join(resource_sources().get(resource, [])) or "RADICAL-Pilot"
        raise ValueError(f"the config of resource {resource!r} (from {origin}) is invalid: "
                         f"{exc}; fix that key in the resource_*.json file (`trajflow "
                         f"resources {resource}` shows the merged config)")


def known_resources() -> list:
    """Every resource label RADICAL-Pilot knows with the current config dir (read once
    per folder: the folder is this process' snapshot, and RADICAL-Pilot takes ~40 ms to
    read it, which a command that checks its resource several times paid each time)."""
    activate_configs()
    folder = os.environ.get("RADICAL_CONFIG_USER_DIR", "")  # the folder RADICAL reads
    if folder not in _KNOWN:
        _KNOWN[folder] = sorted(all_configs())
    return list(_KNOWN[folder])


_KNOWN = {}  # config folder -> its labels


def all_configs() -> dict:
    """label -> the config RADICAL-Pilot will use for it (plain data), every label."""
    import radical.pilot as rp
    activate_configs()
    cfgs = rp.utils.get_resource_configs()
    return {f"{site}.{name}": cfgs[site][name].as_dict() for site in cfgs for name in cfgs[site]}


def resource_config(resource: str):
    import radical.pilot as rp
    try:
        resource = resolve_resource(resource)  # a platform's name alone too
    except ValueError:
        return None
    return rp.utils.get_resource_config(resource=resource)


def is_local(resource: str) -> bool:
    return resource.startswith("local.")


def resource_description(resource, walltime, cpus, queue=None, project=None,
                         access_schema=None) -> dict:
    """The pilot description EnTK's AppManager takes. `access_schema`: one of the
    resource config's schemas (default: its default_schema); "batch" starts the
    pilot inside the batch job this client runs in, on that job's allocation."""
    desc = {"resource": resource, "walltime": int(walltime), "cpus": int(cpus)}
    if queue:
        desc["queue"] = queue
    if project:
        desc["project"] = project
    if access_schema:
        desc["access_schema"] = access_schema
    return desc


def check_access_schema(resource, schema):
    """ValueError unless the resource's config has that access schema."""
    schemas = (merged_config(resource) or {}).get("schemas") or {}
    if schema not in schemas:
        raise ValueError(f"resource {resource!r} has no {schema!r} access schema (it has "
                         f"{', '.join(sorted(schemas)) or 'none'}); add one to its config, as "
                         "RADICAL-Pilot's own configs do: \"batch\": {\"job_manager_endpoint\": "
                         "\"fork://localhost/\", \"filesystem_endpoint\": \"file://localhost/\"}")


def task_python(resource: str) -> str:
    """The Python that runs tasks. Where the pilot uses the client's own
    virtualenv (virtenv_mode "local": every trajflow config, for this
    workstation, its SLURM and the clusters, where trajflow runs on a login
    node from a virtualenv on the shared file system) that is this Python;
    otherwise whatever `python3` the config's pre_exec provides."""
    if is_local(resource):
        return sys.executable
    cfg = resource_config(resource)
    return sys.executable if cfg is not None and cfg.get("virtenv_mode") == "local" else "python3"


def _labels_in(folder) -> dict:
    """label -> file, for the resource_<facility>.json files in `folder` (comments allowed)."""
    import radical.utils as ru
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "resource_*.json"))):
        facility = os.path.basename(path)[len("resource_"):-len(".json")]
        try:
            platforms = ru.read_json(path)
        except Exception:  # a broken user file must not hide the others; RP will say more
            continue
        for name in platforms:
            out[f"{facility}.{name}"] = path
    return out


def resource_sources() -> dict:
    """label -> where its config comes from: "radical" (RADICAL-Pilot's own),
    "trajflow" (shipped here, merged over RADICAL's) and "user" (~/.radical, merged last)."""
    import radical.pilot as rp
    rp_dir = os.path.join(os.path.dirname(rp.__file__), "configs")
    ours = os.path.dirname(shipped_config_files()[0])
    sources = {}
    for origin, folder in (("radical", rp_dir), ("trajflow", ours),
                           ("user", os.path.join(user_radical_dir(), "pilot", "configs"))):
        for label in _labels_in(folder):
            sources.setdefault(label, []).append(origin)
    return sources


def pilot_batch_system(resource: str, access_schema=None):
    """The batch system (batch.BATCH_SYSTEMS) that runs the resource's pilot job,
    or None: a pilot started by fork (this machine, or inside a batch job already:
    the "batch" access schema) or under a batch system trajflow does not know."""
    cfg = merged_config(resource) or {}
    schema = access_schema or cfg.get("default_schema")
    endpoint = str(((cfg.get("schemas") or {}).get(schema) or {}).get("job_manager_endpoint", ""))
    if endpoint.startswith("fork:") or "+ssh" in endpoint or "+gsissh" in endpoint:
        return None  # not this machine's batch system: its variables and sinfo do not reach it
    return BATCH_SYSTEMS.get(str(cfg.get("resource_manager", "")).upper())


def merged_config(resource: str) -> dict:
    """The config RADICAL-Pilot will use for `resource`, as plain data."""
    activate_configs()
    cfg = resource_config(resource)
    return None if cfg is None else cfg.as_dict()
