"""MDAnalysis Universe keywords (`--universe-args`, `--format`, `--topology-format`) reach
every place a run opens the user's files, and the answers equal MDAnalysis' serial run
of a Universe made with the same keywords: a LAMMPS dump under its usual `.lammpstrj`
name, chained XTC files that overlap (`continuous`), a DCD given its time step (`dt`),
through every io strategy in both modes (the task programs as the pilot runs them)."""
import json
import os
import subprocess
import sys
import warnings

import h5py
import numpy as np
import pytest

from paths import FACTORIES
from run_stages import plan_and_run
from trajflow.tasks.plan import PlanError, RunPlan
from trajflow.workflows.errors import InputError
from trajflow.workflows.run.spec import RunSpec

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")
STRATEGIES = [("shared", "mpi"), ("shared", "tasks"), ("split", "mpi"), ("h5md", "tasks")]


def mda_rmsd(top, traj, select, **keywords):
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rms.RMSD(mda.Universe(top, traj, **keywords), select=select).run().results.rmsd


def result_rows(path):
    with h5py.File(path) as f:
        return f["rmsd"][()], json.loads(f.attrs.get("universe", "{}"))


@pytest.fixture(scope="module")
def lammps():
    from MDAnalysisTests.datafiles import LAMMPS_image_vf, LAMMPSDUMP_image_vf
    return LAMMPS_image_vf, LAMMPSDUMP_image_vf


@pytest.fixture(scope="module")
def overlapping_xtcs(adk, tmp_path_factory):
    """AdK's 98 frames as three XTC files that overlap by ten frames each (0-39, 30-69,
    60-97), as a restarted simulation writes them."""
    import MDAnalysis as mda
    folder = tmp_path_factory.mktemp("chained")
    u = mda.Universe(*adk)
    paths = []
    for k, (a, b) in enumerate([(0, 40), (30, 70), (60, 98)]):
        paths.append(str(folder / f"part{k}.xtc"))
        with mda.Writer(paths[-1], n_atoms=len(u.atoms)) as w:
            for ts in u.trajectory[a:b]:
                w.write(u.atoms)
    return adk[0], paths


@pytest.mark.parametrize("io,mode", STRATEGIES)
def test_a_lammps_dump_named_lammpstrj_reads_with_its_format(tmp_path, lammps, io, mode):
    top, dump = lammps
    path, plan = plan_and_run(tmp_path / "run", top, [dump], "rmsd", io=io, mode=mode,
                              blocks=3, cpus=3, select="all", format="LAMMPSDUMP",
                              topology_format="DATA")
    got, said = result_rows(path)
    assert said == {"format": "LAMMPSDUMP", "topology_format": "DATA"}  # result.h5 says so
    ref = mda_rmsd(top, dump, "all", format="LAMMPSDUMP", topology_format="DATA")
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)
    assert plan.universe == {"format": "LAMMPSDUMP", "topology_format": "DATA"}
    assert RunPlan.load(plan.path("plan.json")).universe == plan.universe


def test_a_users_analysis_reads_the_dump_as_mdanalysis_does(tmp_path, lammps):
    top, dump = lammps
    path, _ = plan_and_run(tmp_path / "run", top, [dump], f"{FACTORIES}:every_atom_rgyr",
                           io="h5md", mode="tasks", blocks=3, cpus=3,
                           universe={"format": "LAMMPSDUMP"})
    import MDAnalysis as mda
    sys.path.insert(0, os.path.dirname(FACTORIES))
    import factories
    ref = factories.every_atom_rgyr(mda.Universe(top, dump, format="LAMMPSDUMP")).run()
    with h5py.File(path) as f:
        np.testing.assert_allclose(f["results/rgyr"][()], ref.results.rgyr, rtol=1e-6)
        np.testing.assert_allclose(f["time"][()], ref.times, rtol=1e-6)


@pytest.mark.parametrize("io,mode", STRATEGIES)
def test_chained_xtcs_that_overlap_are_continuous_when_asked(tmp_path, overlapping_xtcs, io, mode):
    top, parts = overlapping_xtcs
    path, plan = plan_and_run(tmp_path / "run", top, parts, "rmsd", io=io, mode=mode, blocks=3,
                              cpus=3, universe={"continuous": True})
    got, _ = result_rows(path)
    ref = mda_rmsd(top, parts, "name CA", continuous=True)
    assert plan.n_frames == len(ref) == 98  # the repeated frames dropped
    np.testing.assert_allclose(got[:, [0, 2]], ref[:, [0, 2]], rtol=1e-6, atol=1e-5)
    # the time written in the files (each frame's ts.time), going only forward: MDAnalysis'
    # RMSD reports trajectory.time, which there counts the dropped frames too (it jumps
    # from 29 to 40 ps at the first join: MDAnalysis 2.11's ChainReader)
    import MDAnalysis as mda
    written = [ts.time for ts in mda.Universe(top, parts, continuous=True).trajectory]
    np.testing.assert_allclose(got[:, 1], written, rtol=1e-6)
    assert (np.diff(got[:, 1]) > 0).all() and (np.diff(ref[:, 1]) > 1.5).any()


def test_chained_xtcs_without_continuous_keep_every_frame_as_mdanalysis(tmp_path, overlapping_xtcs):
    top, parts = overlapping_xtcs
    path, plan = plan_and_run(tmp_path / "run", top, parts, "rmsd", io="shared", mode="mpi",
                              blocks=2, cpus=2)
    got, _ = result_rows(path)
    assert plan.n_frames == 118 and plan.universe == {}
    np.testing.assert_allclose(got, mda_rmsd(top, parts, "name CA"), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("io,mode", [("shared", "mpi"), ("split", "tasks")])
def test_a_time_step_given_is_every_frames_time(tmp_path, adk, io, mode):
    path, _ = plan_and_run(tmp_path / "run", *adk[:1], [adk[1]], "rmsd", io=io, mode=mode,
                           blocks=2, cpus=2, universe={"dt": 2.5, "time_offset": 10.0})
    got, _ = result_rows(path)
    ref = mda_rmsd(*adk, "name CA", dt=2.5, time_offset=10.0)
    np.testing.assert_allclose(np.diff(got[:, 1]), 2.5, rtol=1e-9)  # not the file's own dt
    assert got[0, 1] >= 10.0
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("io", ["shared", "h5md", "split"])
def test_a_users_analysis_sees_the_times_mdanalysis_gives_it(tmp_path, adk, io):
    """`analysis.times` as MDAnalysis' serial run gives them, whichever io: with a
    time_offset (the H5MD copy holds the offset once, not twice), and over two files
    chained (each frame's own written time, not the chain's cumulative one)."""
    import MDAnalysis as mda
    sys.path.insert(0, os.path.dirname(FACTORIES))
    import factories
    for trajs, keywords in (([adk[1]], {"time_offset": 10.0}), ([adk[1], adk[1]], {})):
        out = tmp_path / f"run{len(trajs)}"
        path, _ = plan_and_run(out, adk[0], trajs, f"{FACTORIES}:protein_rgyr", io=io,
                               mode="tasks", blocks=3, cpus=3, universe=keywords)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = factories.protein_rgyr(mda.Universe(adk[0], trajs, **keywords)).run()
        with h5py.File(path) as f:
            np.testing.assert_allclose(f["time"][()], ref.times, rtol=1e-9)
            np.testing.assert_allclose(f["results/rgyr"][()], ref.results.rgyr, rtol=1e-6)


@pytest.mark.parametrize("io", ["shared", "split"])
def test_a_lammps_dcd_in_its_own_units_reads_as_mdanalysis_converts_it(tmp_path, io):
    """LAMMPS' DCDReader shares the CHARMM reader's class name but converts its units;
    its frames are never read in bulk unconverted (they came out 10x short in nm)."""
    from MDAnalysisTests.datafiles import LAMMPSdata2, LAMMPSdcd2
    keywords = {"format": "LAMMPS", "topology_format": "DATA", "timeunit": "fs",
                "lengthunit": "nm"}
    path, _ = plan_and_run(tmp_path / "run", LAMMPSdata2, [LAMMPSdcd2], "rmsd", io=io,
                           mode="mpi", blocks=2, cpus=2, select="index 0:99",
                           universe=keywords)
    got, _ = result_rows(path)
    ref = mda_rmsd(LAMMPSdata2, LAMMPSdcd2, "index 0:99", **keywords)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("options,message", [
    (dict(universe={"transformations": "x"}), "'transformations' is not a Universe keyword"),
    (dict(universe={"continuous": "yes"}), "'continuous' must be true or false"),
    (dict(universe={"dt": True}), "'dt' must be a number"),
    (dict(universe=["format"]), "give a JSON object of MDAnalysis Universe keywords"),
    (dict(universe={"format": "XTC"}, format="DCD"), "format='DCD' and universe='s format 'XTC'"),
    (dict(universe=["dt"], format="DCD"), "give a JSON object of MDAnalysis Universe keywords"),
])
def test_keywords_that_cannot_be_passed_on_are_refused(options, message):
    with pytest.raises(InputError) as exc:
        RunSpec(**options)
    assert message.replace("universe='s", "universe's") in str(exc.value)


def test_a_plan_with_other_keywords_is_refused(tmp_path, adk):
    from trajflow.tasks.plan import check_plan_dict
    path, plan = plan_and_run(tmp_path / "run", adk[0], [adk[1]], "rmsd", blocks=2, cpus=2,
                              universe={"dt": 2.0})
    d = json.load(open(plan.path("plan.json")))
    d["universe"] = {"in_memory": True}
    with pytest.raises(PlanError, match="key 'universe': 'in_memory' is not a Universe keyword"):
        check_plan_dict(d)


def test_a_dump_without_its_format_is_refused_naming_the_flag(tmp_path, lammps):
    top, dump = lammps
    base = [TRAJFLOW, "run", "--topology", top, "--trajectory", dump, "--analysis", "rmsd",
            "--select", "all", "--out", str(tmp_path / "run")]
    proc = subprocess.run(base + ["--topology-format", "DATA"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "--format FMT, e.g. LAMMPSDUMP for a .lammpstrj" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
    proc = subprocess.run(base + ["--universe-args", '{"format": "LAMMPSDUMP", "dt": "x"}'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--universe-args: 'dt' must be a number" in proc.stderr, \
        proc.stderr
