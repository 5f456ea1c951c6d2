"""A campaign file: factors with levels, expanded into experiments (Taufer et al. 2002's factor space).

The file is TOML, read as data (never executed); every table takes only the
keys listed below, and an unknown key is an error that names it and the keys
allowed, so a typo ("rank" for "ranks") is not silently a default.

    [campaign]                 name, analysis (required: rmsd, dihedrals, FILE.py:NAME or
                               module:NAME), design ("factorial" | "list"), repeats,
                               concurrent, and every run option that is not a factor
                               (RUN_KEYS, from RunSpec: analysis_args (a table: your
                               factory's keyword arguments), select, chunk, compression,
                               retries, allow_truncated)
    [input]                    topology + trajectory (a file or a list), or
                               dataset = "adk" with copies and format (DCD, XTC, H5MD)
    [resources."<label>"]      the pilot's options (PILOT_KEYS, from PilotSpec: walltime,
                               required unless pilot; cpus, default the largest
                               experiment's ranks; queue, project, access_schema,
                               client_timeout, limits, keep_sandbox), or
                               pilot (a held pilot's name, `trajflow pilot start`: its
                               experiments go there, one after another, no pilot start),
                               or with them the machine over SSH (REMOTE_KEYS, from
                               RemoteSpec: remote = "[user@]host[:port]", whose campaign
                               runs this resource's experiments, fetched here;
                               remote_python) and remote_out (the campaign's folder there)
    [factors]                  ranks (required), io, mode, gather, schedule, repeat: lists
                               of levels
    [[experiments]]            design = "list" only: resource, ranks, io, mode, gather,
                               schedule, repeat

Relative paths are relative to the campaign file. With the full factorial
design every resource runs every combination of the factors' levels; with
"list" only the experiments listed run (factors then give the defaults).
Each experiment runs `repeats` times. The pilot of a resource is sized for
its largest experiment unless `cpus` says otherwise.
"""
import contextlib
import dataclasses
import itertools
import math
import os
import tomllib
from typing import Dict, List, Optional

from trajflow.tasks.analyses import ANALYSES
from trajflow.tasks.mda_analyses import parse_spec
from trajflow.tasks.modes import MODES
from trajflow.workflows.errors import InputError
from trajflow.workflows.run.planning import ANALYSIS_FORMS
from trajflow.workflows.run.spec import (campaign_file, check_options, option_choices,
                                        option_default, PilotSpec, RemoteSpec, RunSpec,
                                        value_type)

DESIGNS = ("factorial", "list")
DATASETS = ("adk",)
DATASET_FORMATS = ("DCD", "XTC", "H5MD")

# RunSpec's options: levels in [factors] ("blocks" is ranks), or given by the input, the
# campaign folder or the experiment; every other one is a [campaign] key of its own
FACTOR_OPTIONS = ("io", "mode", "gather", "schedule", "repeat", "blocks")
_NOT_KEYS = FACTOR_OPTIONS + ("topology", "trajectory", "analysis", "out", "env", "progress")
RUN_KEYS = {f.metadata["toml"] or f.name: f for f in dataclasses.fields(RunSpec)
            if f.name not in _NOT_KEYS}
# PilotSpec's options, a resource's keys (its label is the resource; path is the campaign's)
PILOT_KEYS = {f.metadata["toml"] or f.name: f for f in dataclasses.fields(PilotSpec)
              if f.name not in ("resource", "path")}
# RemoteSpec's options that a campaign's resource takes (a campaign there is always detached
# on the login node, and its folder is remote_out)
REMOTE_KEYS = {f.name: f for f in dataclasses.fields(RemoteSpec)
               if f.name in ("remote", "remote_python")}
HELD_KEY, REMOTE_OUT_KEY = "pilot", "remote_out"

# table -> key -> (type, required); a list type means "a list of these, or one"
SCHEMA = {
    "campaign": {"name": (str, False), "analysis": (str, True), "design": (str, False),
                 "repeats": (int, False), "concurrent": (bool, False),
                 **{key: (value_type(f), False) for key, f in RUN_KEYS.items()}},
    "input": {"topology": (str, False), "trajectory": ([str], False), "dataset": (str, False),
              "copies": (int, False), "format": (str, False)},
    "resource": {**{key: (value_type(f), False) for key, f in {**PILOT_KEYS, **REMOTE_KEYS}.items()},
                 HELD_KEY: (str, False), REMOTE_OUT_KEY: (str, False)},
    "factors": {"ranks": ([int], True), "io": ([str], False), "mode": ([str], False),
                "gather": ([str], False), "schedule": ([str], False), "repeat": ([int], False)},
    "experiment": {"resource": (str, True), "ranks": (int, False), "io": (str, False),
                   "mode": (str, False), "gather": (str, False), "schedule": (str, False),
                   "repeat": (int, False)},
}
TOP_LEVEL = ("campaign", "input", "resources", "factors", "experiments")
# a factor is a RunSpec option with several levels: its default and choices are the option's
FACTOR_DEFAULTS = {k: [option_default(k)] for k in ("io", "mode", "gather", "schedule", "repeat")}
FACTOR_CHOICES = {k: option_choices(k) for k in ("io", "mode", "gather", "schedule")}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One point of the factor space, one repeat of it."""
    resource: str
    ranks: int
    io: str
    mode: str
    gather: str      # "-" in tasks mode, where nothing is gathered over MPI
    repeat: int      # the workload multiplier (--repeat K)
    rep: int         # which repeat of this point, from 1
    schedule: str = option_default("schedule")  # how ranks or tasks share the frames

    @property
    def point(self) -> str:
        """The factor levels without the repeat number (the schedule named when not
        the default)."""
        other = "" if self.schedule == option_default("schedule") else f"-{self.schedule}"
        return f"n{self.ranks}-{self.io}-{self.mode}-{self.gather}{other}-k{self.repeat}"

    @property
    def id(self) -> str:
        return f"{self.resource}/{self.point}-r{self.rep}"

    def as_dict(self) -> dict:
        return {"id": self.id, **dataclasses.asdict(self)}


@dataclasses.dataclass(frozen=True)
class ResourceSpec:
    """One [resources."<label>"] table: its pilot's options as the file gives them
    (PilotSpec's keywords, as a campaign's run options are RunSpec's), or a held
    pilot's name; `remote` where a campaign on another machine runs its experiments."""
    label: str
    pilot_options: dict = dataclasses.field(default_factory=dict)
    held_pilot: str = ""                  # a held pilot's name (trajflow pilot start): run there
    remote: Optional[RemoteSpec] = None   # run by a campaign there, over SSH
    remote_out: str = ""                  # that campaign's folder there

    @property
    def cpus(self) -> Optional[int]:
        """The cores the file gives (none: the largest experiment's ranks)."""
        return self.pilot_options.get("cpus")


@dataclasses.dataclass
class CampaignSpec:
    """A campaign file read and checked: its experiments and resources (the
    Campaign of campaign/run.py is this, and runs).

    Examples
    --------
    >>> campaign = trajflow.Campaign.load("scaling.toml")
    >>> len(campaign.experiments), list(campaign.resources)
    """
    path: str
    name: str
    analysis: str
    design: str
    repeats: int
    concurrent: bool
    input: dict
    resources: Dict[str, ResourceSpec]
    experiments: List[Experiment]
    run_options: dict = dataclasses.field(default_factory=dict)  # RunSpec's, as the file gives

    def option(self, name):
        """A run option of every experiment: the file's value, else RunSpec's default."""
        return self.run_options.get(name, option_default(name))

    @property
    def analysis_args(self) -> dict:
        return self.option("args") or {}

    @classmethod
    def load(cls, path, yes=False) -> "CampaignSpec":
        """Read and check a campaign file (TOML); InputError naming the problem and the fix.
        `yes`: take a campaign of more than MAX_EXPERIMENTS experiments.

        Examples
        --------
        >>> campaign = trajflow.Campaign.load("scaling.toml")
        >>> len(campaign.experiments), list(campaign.resources)
        """
        return load_campaign(path, cls, yes)

    def _folder(self, out):
        return os.path.abspath(out or os.path.join(os.getcwd(), self.name))

    def only(self, resource: str) -> "CampaignSpec":
        """This campaign with one resource's experiments only, run on this machine
        (how the cluster side of a remote resource runs it)."""
        spec = dataclasses.replace(self.resources[resource], remote=None, remote_out="")
        there = dataclasses.replace(self, resources={resource: spec},
                                    experiments=self.on(resource))
        if not spec.held_pilot:  # its pilot's options checked there, against its resource
            there.checked_pilot_spec(resource)
        return there

    def run_spec(self, e: Experiment, topology, trajectories, out) -> RunSpec:
        """The RunSpec of one experiment: the file's run keys and the experiment's levels."""
        return RunSpec(topology=topology, trajectory=trajectories, analysis=self.analysis, io=e.io,
                       mode=e.mode, gather=option_default("gather") if e.gather == "-" else e.gather,
                       schedule=e.schedule, blocks=e.ranks, repeat=e.repeat, out=out,
                       **self.run_options)

    def remote_labels(self) -> List[str]:
        """The resources whose experiments run by a campaign on another machine."""
        return [label for label, spec in self.resources.items() if spec.remote]

    def on(self, resource: str) -> List[Experiment]:
        return [e for e in self.experiments if e.resource == resource]

    def cores(self, resource: str) -> int:
        """A resource's pilot cores: the cpus the file gives, or its largest experiment's."""
        return self.resources[resource].cpus or max((e.ranks for e in self.on(resource)),
                                                    default=1)

    def pilot_spec(self, resource: str) -> PilotSpec:
        """The pilot of a resource the campaign starts, as every other pilot is made: the
        file's options, its cores from cores()."""
        return PilotSpec(resource, **{**self.resources[resource].pilot_options,
                                      "cpus": self.cores(resource)})

    def checked_pilot_spec(self, resource: str) -> PilotSpec:
        """pilot_spec(), its InputError said as the file's keys under the table's name
        (the resource checked against this machine's configs)."""
        with in_table(f"[resources.\"{resource}\"]"):
            return self.pilot_spec(resource)

    def pilot(self, resource: str) -> dict:
        """The pilot description of a resource (pilot_spec's); for a held pilot its name,
        for a remote resource its machine (the campaign there starts its pilot), and
        the cores either needs."""
        spec = self.resources[resource]
        if spec.held_pilot or spec.remote:
            where = {**({"held": spec.held_pilot} if spec.held_pilot else {}),
                     **({"remote": spec.remote.remote} if spec.remote else {})}
            return {"resource": resource, **where, "cpus": self.cores(resource)}
        return self.pilot_spec(resource).description()


@contextlib.contextmanager
def in_table(where):
    """The specs' own checks inside: their messages spell options as the file's keys,
    under the table's name (`[resources."x"]: walltime = 0: give 1 or more`)."""
    try:
        with campaign_file():
            yield
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None


def _where(table, key):
    return f"[{table}] {key}" if key else f"[{table}]"


def _check_table(values, kind, where):
    """Unknown keys named, required keys demanded, types checked."""
    if not isinstance(values, dict):
        raise InputError(f"{where} must be a table of keys, not {type(values).__name__}")
    schema = SCHEMA[kind]
    for key in values:
        if key not in schema:
            raise InputError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(schema)}")
    for key, (kind_, required) in schema.items():
        if required and key not in values:
            raise InputError(f"{where}: missing {key!r}")
        if key not in values:
            continue
        value = values[key]
        if isinstance(kind_, list):
            items = value if isinstance(value, list) else [value]
            if not items:
                raise InputError(f"{where}: {key!r} needs at least one level")
            for item in items:
                _check_type(item, kind_[0], f"{where} {key}")
        else:
            _check_type(value, kind_, f"{where} {key}")


def _check_type(value, kind, where):
    # TOML booleans are Python bools, which are ints too: keep them apart; a whole number
    # is a number of seconds too
    if type(value) is not kind and not (kind is float and type(value) is int):
        raise InputError(f"{where} = {value!r}: expected {kind.__name__}, "
                         f"got {type(value).__name__}")


def _levels(values, key):
    v = values.get(key, FACTOR_DEFAULTS.get(key))
    return v if isinstance(v, list) else [v]


def _check_choice(value, key, where):
    allowed = FACTOR_CHOICES.get(key)
    if allowed and value not in allowed:
        raise InputError(f"{where}: {key} = {value!r} is not one of {', '.join(allowed)}")
    if key in ("ranks", "repeat") and value < 1:
        raise InputError(f"{where}: {key} = {value} must be at least 1")


MAX_EXPERIMENTS = 10_000      # more is a typo far more often than a plan: --yes takes it
MAX_CAMPAIGN_BYTES = 1 << 20  # a campaign file is a page of factors


def load_campaign(path, cls=None, yes=False) -> "CampaignSpec":
    """Read and check a campaign file; InputError naming the problem and the fix."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise InputError(f"campaign file {path!r} does not exist: check the path")
    if os.path.getsize(path) > MAX_CAMPAIGN_BYTES:
        raise InputError(f"campaign file {path!r} is {os.path.getsize(path)} bytes, more than "
                         f"a campaign file ({MAX_CAMPAIGN_BYTES}): check the path")
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"campaign file {path!r} is not valid TOML: {exc}")
    except UnicodeDecodeError as exc:
        raise InputError(f"campaign file {path!r} is not UTF-8 text (byte {exc.start}): save it "
                         "as UTF-8")
    except RecursionError:
        raise InputError(f"campaign file {path!r} is nested too deeply to be a campaign file")
    for key in data:
        if key not in TOP_LEVEL:
            raise InputError(f"{path}: unknown table {key!r}; allowed: {', '.join(TOP_LEVEL)}")
    for key in ("campaign", "input", "resources"):
        if key not in data:
            raise InputError(f"{path}: missing table [{key}]; see the campaign example in docs/guide/campaigns.md")
    c = data["campaign"]
    _check_table(c, "campaign", "[campaign]")
    base = os.path.dirname(path)
    analysis = _analysis(c["analysis"], base)
    design = c.get("design", "factorial")
    if design not in DESIGNS:
        raise InputError(f"[campaign] design = {design!r}: choose one of {', '.join(DESIGNS)}")
    if c.get("repeats", 1) < 1:
        raise InputError(f"[campaign] repeats = {c['repeats']} is too small")
    run_options = {f.name: c[key] for key, f in RUN_KEYS.items() if key in c}
    with in_table("[campaign]"):
        RunSpec(**run_options)  # RunSpec's own checks, with its messages
    inputs = _check_input(data["input"], base)
    resources = _check_resources(data["resources"])
    if "factors" not in data and design == "factorial":
        raise InputError(f"{path}: missing table [factors] (at least ranks = [...]); or set "
                         "design = \"list\" and list [[experiments]]")
    given = data.get("factors", {"ranks": [1]})
    _check_table(given, "factors", "[factors]")
    factors = {k: _levels(given, k) for k in SCHEMA["factors"]}
    for key, levels in factors.items():
        for v in levels:
            _check_choice(v, key, "[factors]")
    if design == "list":
        points = _listed_points(data.get("experiments"), factors, resources)
    else:
        if "experiments" in data:
            raise InputError("[[experiments]] is given but [campaign] design is 'factorial': "
                             "set design = \"list\" to run just those, or remove them")
        count = len(resources) * math.prod(len(v) for v in factors.values())
        _check_count(count * c.get("repeats", 1), yes)
        points = [dict(zip(("resource",) + tuple(factors), combo))
                  for combo in itertools.product(resources, *factors.values())]
    _check_count(len(points) * c.get("repeats", 1), yes)
    experiments = _expand(points, c.get("repeats", 1))
    for label, spec in resources.items():
        largest = max((e.ranks for e in experiments if e.resource == label), default=0)
        if not largest:
            raise InputError(f"[resources.\"{label}\"] has no experiments: remove it or list some")
        mpi = max((e.ranks for e in experiments if e.resource == label and MODES[e.mode].collective),
                  default=0)
        if spec.cpus and mpi > spec.cpus:
            raise InputError(f"[resources.\"{label}\"] cpus = {spec.cpus} cannot hold the "
                             f"{mpi}-rank MPI experiments: raise cpus or drop those ranks")
    name = c.get("name") or os.path.splitext(os.path.basename(path))[0]
    if not name or name.startswith(".") or any(ch in name for ch in "/\\\0"):
        raise InputError(f"[campaign] name = {name!r}: it names the campaign's folder; use "
                         "letters, digits, '.', '-' or '_' (or give --out)")
    return (cls or CampaignSpec)(path=path, name=name, analysis=analysis, design=design,
                                 repeats=c.get("repeats", 1),
                                 concurrent=c.get("concurrent", False), input=inputs,
                                 resources=resources, experiments=experiments,
                                 run_options=run_options)


def _check_count(count, yes):
    """InputError for more than MAX_EXPERIMENTS experiments unless `yes` (said before they
    are made: a million took minutes of silence)."""
    if count > MAX_EXPERIMENTS and not yes:
        raise InputError(f"the campaign has {count:,} experiments, more than "
                         f"{MAX_EXPERIMENTS:,}: check its factors and repeats, or give --yes "
                         "(Campaign.load(path, yes=True)) if you mean it")


def _analysis(analysis, base):
    """rmsd, dihedrals, module:NAME, or FILE.py:NAME with FILE relative to the campaign file."""
    if analysis in ANALYSES:
        return analysis
    try:
        kind, source, name = parse_spec(analysis)
    except ValueError as exc:
        raise InputError(f"[campaign] analysis = {analysis!r}: {exc}; give {ANALYSIS_FORMS}")
    return f"{os.path.join(base, source)}:{name}" if kind == "file" else analysis


def _check_input(values, base):
    _check_table(values, "input", "[input]")
    if "dataset" in values:
        extra = {"topology", "trajectory"} & set(values)
        if extra:
            raise InputError(f"[input]: give either dataset or topology/trajectory, not both "
                             f"(drop {', '.join(sorted(extra))})")
        if values["dataset"] not in DATASETS:
            raise InputError(f"[input] dataset = {values['dataset']!r}: the built-in datasets "
                             f"are {', '.join(DATASETS)}; or give topology and trajectory")
        fmt = values.get("format", "DCD").upper()
        if fmt not in DATASET_FORMATS:
            raise InputError(f"[input] format = {values['format']!r}: choose one of "
                             f"{', '.join(DATASET_FORMATS)}")
        copies = values.get("copies", 10)
        if copies < 1:
            raise InputError(f"[input] copies = {copies}: give 1 or more")
        return {"dataset": values["dataset"], "copies": copies, "format": fmt}
    for key in ("copies", "format"):
        if key in values:
            raise InputError(f"[input] {key} applies to dataset only: drop it")
    for key in ("topology", "trajectory"):
        if key not in values:
            raise InputError(f"[input]: missing {key!r} (or give dataset = \"adk\")")
    traj = values["trajectory"] if isinstance(values["trajectory"], list) else [values["trajectory"]]
    return {"topology": os.path.join(base, values["topology"]),
            "trajectory": [os.path.join(base, t) for t in traj]}


def _check_resources(values):
    if not isinstance(values, dict) or not values:
        raise InputError("[resources] must name at least one resource, e.g. "
                         "[resources.\"local.localhost\"] walltime = 30")
    return {label: _resource(label, spec) for label, spec in values.items()}


def _resource(label, values) -> ResourceSpec:
    """A resource table checked: PilotSpec's and RemoteSpec's own checks, with their
    messages, under the table's name."""
    where = f"[resources.\"{label}\"]"
    _check_table(values, "resource", where)
    pilot_options = {f.name: values[key] for key, f in PILOT_KEYS.items() if key in values}
    remote_options = {f.name: values[key] for key, f in REMOTE_KEYS.items() if key in values}
    if REMOTE_OUT_KEY in values and "remote" not in remote_options:
        raise InputError(f"{where}: {REMOTE_OUT_KEY} goes with remote = \"[user@]host[:port]\"")
    if HELD_KEY in values:  # a pilot held here, or on `remote`'s machine
        _check_held(values, where)
    elif "walltime" not in pilot_options:
        raise InputError(f"{where} walltime is required (minutes), unless the resource "
                         f"is a held pilot ({HELD_KEY} = \"NAME\")")
    # as far as a file can be checked anywhere: the resource itself is checked where it
    # runs (campaign/run.py check_resources; a remote one there, CampaignSpec.only)
    with in_table(where):
        remote = RemoteSpec(**remote_options) if remote_options else None
        check_options(PilotSpec, pilot_options)
    return ResourceSpec(label, pilot_options, held_pilot=values.get(HELD_KEY, ""), remote=remote,
                        remote_out=values.get(REMOTE_OUT_KEY, ""))


def _check_held(values, where):
    """A resource that names a held pilot takes its pilot's options from it (cpus, if
    given, is the cores its experiments need of it); with `remote`, the pilot is held on
    that machine (`trajflow pilot start --remote`) and the campaign there runs on it."""
    from trajflow.workflows.run.held_registry import check_name
    check_name(values[HELD_KEY])
    given = [k for k in values if k not in (HELD_KEY, "cpus", REMOTE_OUT_KEY, *REMOTE_KEYS)]
    if given:
        raise InputError(f"{where}: {', '.join(given)} beside {HELD_KEY} = "
                         f"\"{values[HELD_KEY]}\": the held pilot has its own (here, or on "
                         "remote's machine); drop them")


def _listed_points(listed, factors, resources):
    if not listed:
        raise InputError("[campaign] design = \"list\" needs [[experiments]] entries")
    points = []
    for i, e in enumerate(listed, 1):
        where = f"[[experiments]] #{i}"
        _check_table(e, "experiment", where)
        if e["resource"] not in resources:
            raise InputError(f"{where}: resource {e['resource']!r} is not in [resources]; "
                             f"add a [resources.\"{e['resource']}\"] table")
        point = {"resource": e["resource"]}
        for key in SCHEMA["factors"]:
            point[key] = e.get(key, factors[key][0])
            _check_choice(point[key], key, where)
        points.append(point)
    return points


def _expand(points, repeats):
    """Points x repeats as Experiments; gather means nothing in tasks mode, so
    tasks-mode points differing only in gather are one experiment."""
    seen, out = set(), []
    for p in points:
        gather = p["gather"] if MODES[p["mode"]].collective else "-"
        for rep in range(1, repeats + 1):
            e = Experiment(p["resource"], p["ranks"], p["io"], p["mode"], gather, p["repeat"], rep,
                           p["schedule"])
            if e not in seen:
                seen.add(e)
                out.append(e)
    return out
