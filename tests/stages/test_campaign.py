"""Campaign files: read as data, checked key by key, expanded into experiments; the table's S(N)/E(N).

No pilot here: the real campaign over two resources is in test_campaign_slurm.py.
"""
import os
import statistics
import subprocess
import sys
import textwrap

import pytest

from trajflow.workflows.campaign.spec import load_campaign
from trajflow.workflows.campaign.table import _add_speedups, curve_points, strategy_comparisons
from trajflow.workflows.run.planning import InputError

BASE = """
[campaign]
analysis = "rmsd"
repeats = 2

[input]
dataset = "adk"
copies = 1

[resources."local.localhost"]
walltime = 10

[resources."local.slurm"]
walltime = 15
queue = "debug"

[factors]
ranks = [1, 2]
io = ["shared", "split", "h5md"]
"""


def write(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_full_factorial_expansion_and_pilots(tmp_path):
    c = load_campaign(write(tmp_path, BASE))
    assert c.name == "c" and c.analysis == "rmsd"
    assert len(c.experiments) == 2 * 2 * 3 * 2          # resources x ranks x io x repeats
    assert len(set(e.id for e in c.experiments)) == len(c.experiments)
    assert {e.rep for e in c.experiments} == {1, 2}
    assert c.pilot("local.slurm") == {"resource": "local.slurm", "walltime": 15, "cpus": 2,
                                      "queue": "debug"}
    assert c.pilot("local.localhost")["cpus"] == 2       # sized for the largest experiment
    # the pilot the campaign starts is a PilotSpec, as every pilot is: whole, with its guard
    spec = c.pilot_spec("local.slurm")
    assert (spec.resource, spec.cpus, spec.walltime, spec.queue, spec.client_timeout) == \
        ("local.slurm", 2, 15, "debug", 300)
    e = c.on("local.slurm")[0]
    assert e.id == "local.slurm/n1-shared-mpi-gatherv-k1-r1"


def test_tasks_mode_ignores_gather_levels(tmp_path):
    text = BASE.replace('io = ["shared", "split", "h5md"]',
                        'mode = ["mpi", "tasks"]\ngather = ["gatherv", "rma"]')
    c = load_campaign(write(tmp_path, text))
    per_resource = [e for e in c.on("local.localhost") if e.rep == 1]
    # mpi: 2 ranks x 2 gathers; tasks: 2 ranks (gather means nothing there)
    assert len(per_resource) == 6
    assert {e.gather for e in per_resource if e.mode == "tasks"} == {"-"}


def test_schedules_are_a_factor_named_in_the_experiments(tmp_path):
    """Static blocks against the dynamic schedule side by side; the default (auto) is
    not named, so a campaign without the factor keeps its experiments' names."""
    text = BASE.replace('io = ["shared", "split", "h5md"]', 'schedule = ["static", "dynamic"]')
    c = load_campaign(write(tmp_path, text))
    ids = {e.id for e in c.on("local.localhost") if e.rep == 1}
    assert ids == {f"local.localhost/n{n}-shared-mpi-gatherv-{s}-k1-r1"
                   for n in (1, 2) for s in ("static", "dynamic")}
    e = next(e for e in c.experiments if e.schedule == "dynamic")
    assert c.run_spec(e, "t.psf", ["t.dcd"], str(tmp_path / "x")).schedule == "dynamic"
    assert all(e.schedule == "auto" for e in load_campaign(write(tmp_path, BASE)).experiments)
    with pytest.raises(InputError, match="schedule"):
        load_campaign(write(tmp_path, BASE + 'schedule = ["fastest"]\n', "bad.toml"))


def test_list_design_runs_only_the_listed_experiments(tmp_path):
    text = BASE + """
[[experiments]]
resource = "local.slurm"
ranks = 2
io = "h5md"

[[experiments]]
resource = "local.localhost"
"""
    text = text.replace('analysis = "rmsd"', 'analysis = "rmsd"\ndesign = "list"')
    c = load_campaign(write(tmp_path, text))
    assert [e.id for e in c.experiments] == [
        "local.slurm/n2-h5md-mpi-gatherv-k1-r1", "local.slurm/n2-h5md-mpi-gatherv-k1-r2",
        "local.localhost/n1-shared-mpi-gatherv-k1-r1", "local.localhost/n1-shared-mpi-gatherv-k1-r2"]


@pytest.mark.parametrize("change, words", [
    (("ranks = [1, 2]", "rank = [1, 2]"), ["unknown key 'rank'", "ranks"]),
    (("repeats = 2", "repeats = 2\nrepeatz = 3"), ["unknown key 'repeatz'", "[campaign]"]),
    (("walltime = 10", "walltime = 10\nnodes = 2"), ["unknown key 'nodes'", "local.localhost"]),
    (("[factors]", "[factorz]\nx = 1\n[factors]"), ["unknown table 'factorz'"]),
    (("walltime = 10", "walltime = \"10\""), ["walltime", "expected int", "got str"]),
    (("ranks = [1, 2]", "ranks = [1, true]"), ["ranks", "expected int", "got bool"]),
    (("ranks = [1, 2]", "ranks = [0, 2]"), ["ranks = 0", "at least 1"]),
    (('io = ["shared", "split", "h5md"]', 'io = ["nfs"]'), ["io = 'nfs'", "shared, split, h5md"]),
    (('analysis = "rmsd"', 'analysis = "rmsx"'), ["analysis = 'rmsx'", "rmsd, dihedrals"]),
    (("walltime = 10", "walltime = 0"), ["walltime = 0"]),
    (("walltime = 15", "walltime = 15\ncpus = 1"), ["cpus = 1", "2-rank MPI"]),
    (('dataset = "adk"', 'dataset = "lysozyme"'), ["dataset = 'lysozyme'", "adk"]),
    (('dataset = "adk"\ncopies = 1', 'topology = "x.psf"'), ["missing 'trajectory'"]),
    (("[factors]\nranks = [1, 2]", "[factors]"), ["missing 'ranks'"]),
    (("ranks = [1, 2]", "ranks = [1, 2]\n[[experiments]]\nresource = \"local.slurm\""),
     ["design is 'factorial'", "design = \"list\""]),
    (("[campaign]", "[campaign\n"), ["not valid TOML"]),
    (('analysis = "rmsd"', 'analysis = "rmsd"\nname = "../up"'), ["name = '../up'", "--out"]),
])
def test_bad_campaign_files_name_the_problem(tmp_path, change, words):
    path = write(tmp_path, BASE.replace(*change))
    with pytest.raises(InputError) as err:
        load_campaign(path)
    for w in words:
        assert w in str(err.value)


def test_dry_run_prints_experiments_and_pilots_and_writes_nothing(tmp_path):
    path = write(tmp_path, BASE)
    out = tmp_path / "camp"
    proc = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "campaign", path,
                           "--out", str(out), "--dry-run"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "24 experiments" in proc.stdout
    assert 'local.slurm: pilot {"resource": "local.slurm", "walltime": 15, "cpus": 2, "queue": "debug"}' \
        in proc.stdout
    assert "batch system SLURM" in proc.stdout and "batch system FORK" in proc.stdout
    assert proc.stdout.count(" to run") == 24
    assert not out.exists()


def test_unknown_resource_and_bad_input_exit_2_before_anything_is_written(tmp_path):
    path = write(tmp_path, BASE.replace('"local.slurm"', '"nowhere.cluster"'))
    proc = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "campaign", path,
                           "--out", str(tmp_path / "camp")], capture_output=True, text=True)
    assert proc.returncode == 2 and "nowhere.cluster" in proc.stderr and "trajflow resources" in proc.stderr
    assert not (tmp_path / "camp").exists()
    # the file itself loads anywhere (a cluster's campaign reads the laptop's resources
    # too): a resource is checked against this machine where it runs, as above
    assert load_campaign(path).resources["nowhere.cluster"].pilot_options["walltime"] == 15
    missing = BASE.replace('dataset = "adk"\ncopies = 1', 'topology = "no.psf"\ntrajectory = "no.dcd"')
    proc = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "campaign",
                           write(tmp_path, missing, "m.toml"), "--out", str(tmp_path / "camp")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "no.psf" in proc.stderr and "does not exist" in proc.stderr
    assert not (tmp_path / "camp").exists()


def test_resume_needs_a_campaign_folder(tmp_path):
    (tmp_path / "stuff").mkdir()
    proc = subprocess.run([sys.executable, "-m", "trajflow.workflows.cli.main", "campaign",
                           write(tmp_path, BASE), "--out", str(tmp_path / "stuff"), "--resume"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "not a trajflow campaign folder" in proc.stderr


def test_speedup_and_efficiency_against_the_fewest_ranks_mean():
    def row(resource, io, n, t, rep):
        return {"resource": resource, "analysis": "rmsd", "io": io, "mode": "mpi",
                "gather": "gatherv", "repeat": 1, "ranks": n, "rep": rep, "t_total": t}
    rows = [row("a", "shared", 1, 10.0, 1), row("a", "shared", 1, 12.0, 2),
            row("a", "shared", 2, 5.5, 1), row("a", "shared", 4, 4.0, 1),
            row("b", "shared", 2, 3.0, 1), row("b", "shared", 4, 2.0, 1),
            {"resource": "a", "ranks": 8, "status": "failed"}, row("c", "shared", 2, 3.0, 1)]
    _add_speedups(rows)
    assert "S" not in rows[7]  # c ran at one rank count: S = N, E = 1 would read as perfect
    assert rows[2]["S"] == pytest.approx(11.0 / 5.5) and rows[2]["E"] == pytest.approx(1.0)
    assert rows[3]["S"] == pytest.approx(11.0 / 4.0) and rows[3]["E"] == pytest.approx(11.0 / 16)
    assert rows[4]["S"] == pytest.approx(2.0)            # b's baseline is its own 2 ranks
    assert rows[5]["S"] == pytest.approx(3.0) and rows[5]["E"] == pytest.approx(0.75)
    assert "S" not in rows[6]
    curves = curve_points(rows)
    n1 = curves[("a", "rmsd", "shared", "mpi", "gatherv", 1, "static")][0]
    assert n1[:3] == (1, 11.0, pytest.approx(statistics.stdev([10.0, 12.0])))
    assert curves[("c", "rmsd", "shared", "mpi", "gatherv", 1, "static")] == [(2, 3.0, 0.0, None, None, 1)]
    assert n1[3] == pytest.approx(1.0) and n1[5] == 2


OWN_FACTORY = """
from MDAnalysis.analysis.base import AnalysisFromFunction

def radius_of_gyration(u, select="protein"):
    group = u.select_atoms(select)
    return AnalysisFromFunction(lambda ag: ag.radius_of_gyration(), u.trajectory, group)
"""


def test_a_campaign_runs_your_own_analysis_with_its_args(tmp_path, adk):
    """A factory file relative to the campaign file, its keyword arguments from a TOML
    table: every experiment's plan carries both, the factory travels into its RUNDIR,
    and one experiment run through its stages equals MDAnalysis' serial run."""
    import MDAnalysis as mda
    from MDAnalysis.analysis.base import AnalysisFromFunction
    from run_stages import run_stages
    from trajflow.workflows.campaign.run import plan_experiments
    from trajflow.workflows.run.planning import write_plan
    from trajflow.tasks.results import open_result
    (tmp_path / "mine.py").write_text(OWN_FACTORY)
    text = BASE.replace('analysis = "rmsd"', 'analysis = "mine.py:radius_of_gyration"\n'
                        'analysis_args = {select = "name CA"}')
    text = text.replace('dataset = "adk"\ncopies = 1', f'topology = "{adk[0]}"\ntrajectory = "{adk[1]}"')
    campaign = load_campaign(write(tmp_path, text))
    assert campaign.analysis == f"{tmp_path / 'mine.py'}:radius_of_gyration"
    todo, _ = plan_experiments(campaign, str(tmp_path / "camp"), resume=False)
    assert len(todo) == 24 and all(p.analysis_args == {"select": "name CA"} for p in todo.values())
    # the 8 h5md experiments share one H5MD copy in the campaign folder; the others have none
    shared = {p.shared_h5md for e, p in todo.items() if e.io == "h5md"}
    assert len(shared) == 1 and shared.pop().startswith(str(tmp_path / "camp" / "shared") + os.sep)
    assert all(p.shared_h5md is None for e, p in todo.items() if e.io != "h5md")
    plan = next(p for e, p in todo.items() if e.io == "split" and e.ranks == 2)
    os.makedirs(plan.workdir)
    run_stages(plan, write_plan(plan))
    u = mda.Universe(*adk)
    ca = u.select_atoms("name CA")
    serial = AnalysisFromFunction(lambda ag: ag.radius_of_gyration(), u.trajectory, ca).run()
    import numpy as np
    np.testing.assert_allclose(open_result(plan.workdir)["timeseries"], serial.results.timeseries,
                               rtol=1e-6)
    bad = text.replace('{select = "name CA"}', '{nbins = 3}')
    with pytest.raises(InputError, match="nbins"):
        plan_experiments(load_campaign(write(tmp_path, bad, "bad.toml")), str(tmp_path / "c2"), False)


def test_the_api_dry_run_returns_the_experiments_and_pilots(tmp_path):
    import trajflow
    campaign = trajflow.Campaign.load(write(tmp_path, BASE))
    plan = campaign.dry_run(out=str(tmp_path / "camp"))
    assert plan["folder"] == str(tmp_path / "camp") and not (tmp_path / "camp").exists()
    assert len(plan["experiments"]) == 24
    assert {e["state"] for e in plan["experiments"]} == {"to run"}
    assert plan["pilots"]["local.slurm"] == {"resource": "local.slurm", "walltime": 15, "cpus": 2,
                                             "queue": "debug"}
    assert "24 experiments" in plan["text"]
    with pytest.raises(trajflow.InputError, match="unknown key 'rank'"):
        trajflow.Campaign.load(write(tmp_path, BASE.replace("ranks =", "rank ="), "bad.toml"))


def test_strategies_are_compared_at_the_same_rank_count_with_the_conversion_counted():
    """A campaign measured h5md 2.2x slower than shared at N = 1 and an 11.8 s conversion
    on top: the comparison says shared is fastest (S and E against each strategy's own
    N = 1 could not), and says nothing where one strategy alone was measured."""
    def row(io, n, t, prepare):
        return {"resource": "a", "analysis": "rmsd", "io": io, "mode": "mpi", "gather": "gatherv",
                "repeat": 1, "ranks": n, "rep": 1, "t_total": t, "t_prepare": prepare}
    rows = [row("shared", 1, 5.0, 0.0), row("h5md", 1, 11.0, 11.8), row("h5md", 2, 5.0, 11.8)]
    assert strategy_comparisons(rows) == [
        "a rmsd at N = 1: --io shared --mode mpi --gather gatherv 5.00 s (fastest); "
        "--io h5md --mode mpi --gather gatherv 22.80 s (of which 11.80 s split/convert), "
        "4.6x the fastest"]


def test_a_remote_resource_is_planned_on_its_machine_not_here(tmp_path):
    """A resource with `remote` is run by a campaign there: here its experiments are
    neither planned nor their inputs read (the paths are the cluster's), only listed;
    the local resource's are planned as before. remote_python needs remote."""
    from trajflow.workflows.campaign.run import dry_run, plan_experiments
    text = BASE.replace('[resources."local.slurm"]\nwalltime = 15\nqueue = "debug"',
                        '[resources."local.slurm"]\nwalltime = 15\nremote = "me@login.hpc.org:2222"'
                        '\nremote_out = "/scratch/me/c"')
    campaign = load_campaign(write(tmp_path, text))
    assert campaign.remote_labels() == ["local.slurm"]
    todo, _ = plan_experiments(campaign, str(tmp_path / "camp"), resume=False)
    assert {e.resource for e in todo} == {"local.localhost"} and len(todo) == 12
    there = campaign.only("local.slurm")
    assert list(there.resources) == ["local.slurm"] and not there.resources["local.slurm"].remote
    assert {e.resource for e in there.experiments} == {"local.slurm"}
    shown = dry_run(campaign, str(tmp_path / "camp"))["text"]
    assert "local.slurm: by a campaign on me@login.hpc.org:2222" in shown
    only_remote = text.replace('[resources."local.localhost"]\nwalltime = 10\n', "")
    only_remote = only_remote.replace('dataset = "adk"', 'topology = "/nowhere/here.psf"\n'
                                      'trajectory = "/nowhere/here.dcd"').replace("copies = 1\n", "")
    assert plan_experiments(load_campaign(write(tmp_path, only_remote, "r.toml")),
                            str(tmp_path / "c2"), False) == ({}, [])  # nothing read here
    bad = text.replace('remote = "me@login.hpc.org:2222"\n', "")
    with pytest.raises(InputError, match="remote_out goes with remote ="):
        load_campaign(write(tmp_path, bad, "bad.toml"))
    bad = text.replace('remote = "me@login.hpc.org:2222"', 'remote_python = "/venv/bin/python"'
                       ).replace('remote_out = "/scratch/me/c"', "")
    with pytest.raises(InputError, match=r"\[resources.\"local.slurm\"\]: remote_python without "
                                         r"remote: it goes with a run on a cluster over SSH"):
        load_campaign(write(tmp_path, bad, "bad2.toml"))
    # the cluster's pilot options are checked here as far as they can be (the resource
    # itself there), and on the cluster's side against its resource
    bad = text.replace("walltime = 15\nremote", "walltime = 0\nremote")
    with pytest.raises(InputError, match="walltime = 0: give 1 or more"):
        load_campaign(write(tmp_path, bad, "bad3.toml"))


def test_a_campaign_analyses_the_frames_its_file_chooses(tmp_path, adk):
    """start/stop/step in [campaign] are RunSpec's: every experiment's plan analyses
    those frames, and one run through its stages equals MDAnalysis' run(step=)."""
    import numpy as np
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    from run_stages import run_stages
    from trajflow.workflows.campaign.run import plan_experiments
    from trajflow.workflows.run.planning import write_plan
    from trajflow.tasks.results import open_result
    text = BASE.replace('repeats = 2', 'repeats = 1\nstart = 5\nstep = 4')
    text = text.replace('dataset = "adk"\ncopies = 1', f'topology = "{adk[0]}"\ntrajectory = "{adk[1]}"')
    todo, _ = plan_experiments(load_campaign(write(tmp_path, text)), str(tmp_path / "camp"), False)
    expected = list(range(5, 98, 4))
    assert all(p.frame_numbers().tolist() == expected for p in todo.values())
    plan = next(p for e, p in todo.items() if e.io == "split" and e.ranks == 2)
    os.makedirs(plan.workdir)
    run_stages(plan, write_plan(plan))
    ref = rms.RMSD(mda.Universe(*adk), select="name CA").run(start=5, step=4).results.rmsd
    np.testing.assert_allclose(open_result(plan.workdir)["rmsd"], ref, atol=1e-4)
    with pytest.raises(InputError, match=r"\[campaign\]: step = 0: give 1 or more"):
        load_campaign(write(tmp_path, text.replace("step = 4", "step = 0"), "bad.toml"))
