"""One run contract: the API, the CLI, campaigns and remote runs share RunSpec/PilotSpec."""
import dataclasses
import inspect
import re
import subprocess
import sys

import pytest

import trajflow
from trajflow.workflows.campaign.spec import FACTOR_CHOICES, FACTOR_DEFAULTS
from trajflow.workflows.cli.parser import build_parser
from trajflow.workflows.errors import InputError
from trajflow.workflows.run.spec import PilotSpec, RunSpec, command_line, spelled

FIELDS = [f for spec in (RunSpec, PilotSpec) for f in dataclasses.fields(spec)]


def _run_parser():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices["run"]


def test_the_api_and_the_cli_list_the_same_options_with_the_same_defaults():
    signature = inspect.signature(trajflow.run).parameters
    flags = {a.dest: a for a in _run_parser()._actions}
    for f in FIELDS:
        if f.name in ("topology", "trajectory", "analysis"):
            assert f.name in signature  # positional in the API, flags on the command line
        else:
            assert signature[f.name].default == f.default, f.name
        if not f.metadata["command_line"]:
            assert f.name not in flags, f.name
            continue
        action = flags[f.name]
        assert action.help, f.name
        if f.type is bool or isinstance(f.default, bool):
            assert action.const is (not f.default), f.name  # the flag turns the default round
        elif not f.metadata["help"].endswith("required"):
            shown = "none" if f.default in (None, "") else str(f.default)
            assert f"(default: {shown})" in action.help, f.name
        assert tuple(action.choices or ()) == tuple(f.metadata["choices"] or ()), f.name
    assert "Options" in trajflow.run.__doc__ and "io : default 'shared'" in trajflow.run.__doc__


def test_a_cli_flag_left_out_takes_the_specs_default():
    args = _run_parser().parse_args(["--topology", "t.psf", "--trajectory", "x.dcd"])
    spec = RunSpec(**{k: v for k, v in vars(args).items()
                      if k in {f.name for f in dataclasses.fields(RunSpec)}})
    assert spec == RunSpec(topology="t.psf", trajectory=["x.dcd"])


def test_messages_speak_the_callers_language():
    with pytest.raises(InputError) as api:
        RunSpec(io="h5")
    assert "io='h5'" in str(api.value) and "--" not in str(api.value)
    with command_line(), pytest.raises(InputError) as cli:
        RunSpec(repeat=0)
    assert str(cli.value).startswith("--repeat 0")
    assert spelled("args") == "args" and spelled("allow_truncated", True) == "allow_truncated=True"
    with command_line():
        assert spelled("args") == "--analysis-args" and spelled("progress") == "--quiet"


@pytest.mark.parametrize("options", [dict(cpus=0), dict(walltime=0), dict(client_timeout=-1),
                                     dict(resource="nowhere.cluster"), dict(cpus="4")])
def test_a_bad_pilot_option_is_refused_before_any_pilot(options):
    with pytest.raises(InputError):
        trajflow.Pilot(**options)


def test_an_unknown_keyword_is_named_with_the_nearest_option(adk):
    with pytest.raises(TypeError, match="did you mean 'blocks'"):
        trajflow.run(adk[0], adk[1], "rmsd", block=2)


def test_a_pilots_options_go_to_the_pilot_not_to_a_run_on_it(adk):
    pilot = trajflow.Pilot(cpus=2)  # nothing starts before the first run
    with pytest.raises(InputError, match="walltime"):
        trajflow.run(adk[0], adk[1], "rmsd", pilot=pilot, walltime=5)


def test_campaign_factors_are_run_options():
    for name, levels in FACTOR_CHOICES.items():
        assert tuple(levels) == next(f.metadata["choices"] for f in FIELDS if f.name == name)
    for name, levels in FACTOR_DEFAULTS.items():
        assert levels == [next(f.default for f in FIELDS if f.name == name)]


def test_specs_travel_as_json():
    spec = RunSpec(topology="/t.psf", trajectory="/x.dcd", analysis="f.py:rdf", args={"n": 3},
                   io="h5md", compression="gzip:4", blocks=4)
    assert RunSpec.from_json(spec.to_json()) == spec
    pilot = PilotSpec(cpus=8, walltime=60, queue="debug")
    assert PilotSpec.from_json(pilot.to_json()) == pilot
    with pytest.raises(InputError, match="cannot be sent"):
        RunSpec(analysis=lambda u: None).to_json()


def test_run_help_and_python_help_say_the_same_defaults():
    text = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "run", "--help"],
                          capture_output=True, text=True, timeout=120).stdout
    text = re.sub(r"\s+", " ", text)
    for f in FIELDS:
        if f.metadata["command_line"] and not isinstance(f.default, bool) \
                and not f.metadata["help"].endswith("required"):
            flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
            shown = "none" if f.default in (None, "") else str(f.default)
            assert flag in text and f"(default: {shown})" in text, f.name


def test_every_run_option_not_a_factor_is_a_campaign_key(tmp_path):
    from trajflow.workflows.campaign.spec import RUN_KEYS, SCHEMA, load_campaign
    assert {"analysis_args", "select", "chunk", "compression", "retries",
            "allow_truncated"} <= set(RUN_KEYS) <= set(SCHEMA["campaign"])
    text = ('[campaign]\nanalysis = "rmsd"\nretries = 3\nallow_truncated = true\n'
            '[input]\ndataset = "adk"\ncopies = 1\n'
            '[resources."local.localhost"]\nwalltime = 5\n[factors]\nranks = [1]\n')
    (tmp_path / "c.toml").write_text(text)
    campaign = load_campaign(str(tmp_path / "c.toml"))
    spec = campaign.run_spec(campaign.experiments[0], "t.psf", ["x.dcd"], str(tmp_path / "r"))
    assert spec.retries == 3 and spec.allow_truncated and spec.chunk == 0
    (tmp_path / "bad.toml").write_text(text.replace("retries = 3", "retries = -1"))
    with pytest.raises(InputError, match=r"\[campaign\]: retries = -1: give 0 or more"):
        load_campaign(str(tmp_path / "bad.toml"))


def test_every_pilot_option_is_a_resource_key_and_remote_ones_are_remotespecs(tmp_path):
    """A campaign's resource takes PilotSpec's options by their names (checked by
    PilotSpec, spelled as the file's keys), and its remote keys are RemoteSpec's."""
    from trajflow.workflows.campaign.spec import PILOT_KEYS, REMOTE_KEYS, SCHEMA, load_campaign
    from trajflow.workflows.run.spec import RemoteSpec
    assert set(PILOT_KEYS) == {f.name for f in dataclasses.fields(PilotSpec)} - {"resource", "path"}
    assert set(REMOTE_KEYS) <= {f.name for f in dataclasses.fields(RemoteSpec)}
    assert set(PILOT_KEYS) | set(REMOTE_KEYS) <= set(SCHEMA["resource"])
    text = ('[campaign]\nanalysis = "rmsd"\n[input]\ndataset = "adk"\ncopies = 1\n'
            '[resources."local.localhost"]\nwalltime = 5\nlimits = "stall=60"\n'
            'keep_sandbox = true\nclient_timeout = 20\n[factors]\nranks = [1, 2]\n')
    (tmp_path / "c.toml").write_text(text)
    pilot = load_campaign(str(tmp_path / "c.toml")).pilot_spec("local.localhost")
    assert pilot == PilotSpec("local.localhost", cpus=2, walltime=5, limits="stall=60",
                              keep_sandbox=True, client_timeout=20.0)
    for change, words in ((('stall=60', 'stal=60'), 'limits = "stal=60"'),
                          (('walltime = 5', 'walltime = 5\ncpus = 0'), "cpus = 0: give 1 or more"),
                          (('walltime = 5', 'walltime = 5\nremote = "a\\nb"'), "holds '\\n'")):
        (tmp_path / "bad.toml").write_text(text.replace(*change))
        with pytest.raises(InputError) as err:
            load_campaign(str(tmp_path / "bad.toml"))
        assert str(err.value).startswith('[resources."local.localhost"]') and words in \
            str(err.value), str(err.value)
    # a held pilot has its own options; cpus says what its experiments need of it
    held = text.replace('walltime = 5\nlimits = "stall=60"\nkeep_sandbox = true\n'
                        'client_timeout = 20\n', 'pilot = "mine"\ncpus = 2\n')
    (tmp_path / "held.toml").write_text(held)
    resource = load_campaign(str(tmp_path / "held.toml")).resources["local.localhost"]
    assert (resource.held_pilot, resource.cpus) == ("mine", 2)
    (tmp_path / "held.toml").write_text(held.replace("cpus = 2", "walltime = 5"))
    with pytest.raises(InputError, match='walltime beside pilot = "mine"'):
        load_campaign(str(tmp_path / "held.toml"))
    # ... held on a cluster over SSH: the campaign there runs on it
    (tmp_path / "held.toml").write_text(held.replace("cpus = 2", 'remote = "me@hpc"\n'
                                                     'remote_out = "/scratch/c"'))
    campaign = load_campaign(str(tmp_path / "held.toml"))
    resource = campaign.resources["local.localhost"]
    assert (resource.held_pilot, resource.remote.remote, resource.remote_out) == \
        ("mine", "me@hpc", "/scratch/c")
    assert campaign.remote_labels() == ["local.localhost"]
    there = campaign.only("local.localhost").resources["local.localhost"]
    assert (there.held_pilot, there.remote) == ("mine", None)


def test_remote_options_are_remotespecs_on_the_command_line_and_in_python():
    from trajflow.workflows.cli.options import spec_from_args
    from trajflow.workflows.run.spec import RemoteSpec
    flags = {a.dest: a for a in _run_parser()._actions}
    for f in dataclasses.fields(RemoteSpec):
        assert flags[f.name].help.startswith(f.metadata["help"][:40]), f.name
    args = _run_parser().parse_args(["--remote", "me@hpc", "--remote-batch", "--local", "here"])
    assert spec_from_args(RemoteSpec, args) == RemoteSpec("me@hpc", remote_batch=True, local="here")
    with command_line(), pytest.raises(InputError) as cli:
        spec_from_args(RemoteSpec, _run_parser().parse_args(["--detach", "--local", "x"]))
    assert str(cli.value).startswith("--detach, --local without --remote: they go with a run")
    with pytest.raises(InputError, match="remote_batch needs remote: it submits"):
        RemoteSpec(remote_batch=True)


def test_collective_mpi_reads_need_every_rank_in_each_read():
    """Collective MPI-IO reads: mpi mode and the static schedule (auto becomes static);
    refused otherwise in the caller's words."""
    from trajflow.workflows.run.spec import RunSpec, resolved_schedule
    spec = RunSpec(topology="t", trajectory="x", analysis="rmsd", mpi_reads="collective")
    assert resolved_schedule(spec, builtin=True) == "static"
    assert resolved_schedule(dataclasses.replace(spec, mpi_reads="independent"),
                             builtin=True) == "dynamic"
    for bad in (dict(mode="tasks"), dict(schedule="dynamic")):
        with pytest.raises(InputError, match=r"mpi_reads='collective' needs every rank"):
            RunSpec(topology="t", trajectory="x", analysis="rmsd", mpi_reads="collective", **bad)
    with pytest.raises(InputError, match="mpi_reads"):
        RunSpec(topology="t", trajectory="x", analysis="rmsd", mpi_reads="together")


def test_a_lambda_is_named_by_where_it_is_written():
    """`runs` and summaries named every script lambda `python:<lambda>`."""
    from trajflow.workflows.run.planning import callable_name

    def factory(u):
        return u
    here = factory.__code__.co_firstlineno
    analysis = lambda u: factory(u)  # noqa: E731  a script's usual one-liner
    assert callable_name(analysis) == f"lambda at test_spec.py:{here + 3}"
    assert callable_name(factory).endswith("<locals>.factory")


def test_only_a_run_sent_to_a_held_pilot_here_leaves_radical_unloaded():
    """`trajflow run --pilot NAME` talks to the holder only: RADICAL's utilities are not
    imported for it (0.1 s); every other command imports them before logging is set up."""
    from trajflow.workflows.cli.main import runs_radical_here
    parser = build_parser()
    run = ["run", "--topology", "a.psf", "--trajectory", "a.dcd", "--analysis", "rmsd"]
    assert not runs_radical_here(parser.parse_args(run + ["--pilot", "held"]))
    assert runs_radical_here(parser.parse_args(run))
    assert runs_radical_here(parser.parse_args(run + ["--pilot", "held", "--remote", "host"]))
    assert runs_radical_here(parser.parse_args(["pilot", "list"]))
    probe = ("import sys; from trajflow.workflows.cli.main import main; "
             "main(sys.argv[1:]); print('radical.utils' in sys.modules)")
    said = subprocess.run([sys.executable, "-c", probe, "resources"], capture_output=True,
                          text=True, timeout=120)
    assert said.stdout.strip().splitlines()[-1] == "True", said.stderr
