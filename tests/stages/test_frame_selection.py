"""start, stop, step and frames, as MDAnalysis' run() takes them: every io and mode
against MDAnalysis' own run(start, stop, step) and run(frames=) of the same analysis
(the built-in rmsd and dihedrals, a user's class through its factory), and the
ranges MDAnalysis refuses refused before anything is written."""
import os
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from paths import FACTORIES
from run_stages import plan_and_run
from trajflow.workflows.errors import InputError
from trajflow.tasks.results import open_result

sys.path.insert(0, os.path.dirname(FACTORIES))

SELECTIONS = [dict(start=10, stop=80, step=3), dict(start=-30), dict(step=7),
              dict(frames=[90, 3, 41, 42, 43, 7])]
STRATEGIES = [("shared", "mpi"), ("split", "tasks"), ("h5md", "mpi"), ("shared", "tasks")]


def mdanalysis(analysis, adk, selection):
    """MDAnalysis' own serial answer for these frames: (frame, time, values)."""
    import MDAnalysis as mda
    from MDAnalysis.analysis import rms
    from MDAnalysis.analysis.dihedrals import Ramachandran
    import factories  # tests/analyses, on the path: the same factory the run loads
    u = mda.Universe(*adk)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if analysis == "rmsd":
            r = rms.RMSD(u, select="name CA").run(**selection)
            return r.results.rmsd[:, 0], r.results.rmsd[:, 1], r.results.rmsd
        if analysis == "dihedrals":
            r = Ramachandran(u.select_atoms("protein")).run(**selection)
            ang = np.deg2rad(r.results.angles)
            feats = np.stack([np.cos(ang[..., 0]), np.sin(ang[..., 0]),
                              np.cos(ang[..., 1]), np.sin(ang[..., 1])], axis=2)
            return r.frames, r.times, feats.reshape(len(r.frames), -1)
        r = factories.user_class(u).run(**selection)
        return r.frames, r.times, (r.results.com, r.results.msd)


def ours(analysis, tmp_path, adk, selection, io, mode):
    name = f"{FACTORIES}:user_class" if analysis == "user" else analysis
    _, plan = plan_and_run(tmp_path, adk[0], [adk[1]], name, io=io, mode=mode, blocks=2,
                           cpus=2, **selection)
    got = open_result(plan.workdir)
    if analysis == "rmsd":
        return got.frame, got.time, got.rmsd
    if analysis == "dihedrals":
        return got.frame, got.time, got.features
    return got.frame, got.time, (got.com, got.msd)


@pytest.fixture(scope="module")
def inputs(adk, adk_xtc, tmp_path_factory):
    """AdK as DCD (trajflow's DCD reader), XTC (its XTC reader) and a user's H5MD
    (read as it is by io h5md, by number)."""
    import MDAnalysis as mda
    path = str(tmp_path_factory.mktemp("h5md") / "adk.h5md")
    u = mda.Universe(*adk)
    with warnings.catch_warnings(), mda.Writer(path, u.atoms.n_atoms) as w:
        warnings.simplefilter("ignore")
        for _ in u.trajectory:
            w.write(u.atoms)
    return {"dcd": adk, "xtc": adk_xtc, "h5md": (adk[0], path)}


def label(selection):
    return ",".join(f"{k}={v}" for k, v in selection.items())


# rmsd on every strategy and input format; dihedrals and a user's class with each
# selection on one strategy in turn (the frame numbers' way is the same code)
CASES = ([("rmsd", "dcd", io, mode, sel) for io, mode in STRATEGIES for sel in SELECTIONS]
         + [("rmsd", fmt, io, mode, sel) for fmt, io, mode in (("xtc", "shared", "mpi"),
                                                              ("h5md", "h5md", "tasks"))
            for sel in SELECTIONS]
         + [(analysis, "dcd", *STRATEGIES[(i + k) % len(STRATEGIES)], sel)
            for k, analysis in enumerate(("dihedrals", "user")) for i, sel in enumerate(SELECTIONS)])


@pytest.mark.parametrize("analysis,fmt,io,mode,selection", CASES,
                         ids=[f"{a}-{f}-{io}-{m}-{label(s)}" for a, f, io, m, s in CASES])
def test_chosen_frames_equal_mdanalysis_run(tmp_path, inputs, analysis, fmt, io, mode, selection):
    frame, time, values = ours(analysis, tmp_path / "run", inputs[fmt], selection, io, mode)
    ref_frame, ref_time, ref_values = mdanalysis(analysis, inputs[fmt], selection)
    np.testing.assert_array_equal(frame, ref_frame)
    np.testing.assert_allclose(time, ref_time, rtol=1e-6)
    if analysis == "user":
        np.testing.assert_allclose(values[0], ref_values[0], rtol=1e-6)
        np.testing.assert_allclose(values[1], ref_values[1], rtol=1e-6)
    else:
        np.testing.assert_allclose(values, ref_values, atol=1e-4 if analysis == "rmsd" else 1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.one_of(st.none(), st.integers(-98, 97)), stop=st.one_of(st.none(), st.integers(-98, 98)),
       step=st.one_of(st.none(), st.integers(1, 20)))
def test_any_range_mdanalysis_runs_gives_its_frames(tmp_path_factory, adk, start, stop, step):
    """Any start/stop/step MDAnalysis accepts gives its frames and its RMSD; one it
    analyses no frame of is refused, nothing written."""
    selection = {k: v for k, v in dict(start=start, stop=stop, step=step).items() if v is not None}
    ref_frame, _, ref = mdanalysis("rmsd", adk, selection)
    out = tmp_path_factory.mktemp("range") / "run"
    if len(ref_frame) < 2:
        with pytest.raises(InputError):
            ours("rmsd", out, adk, selection, "shared", "tasks")
        assert not out.exists()
        return
    frame, _, got = ours("rmsd", out, adk, selection, "shared", "tasks")
    np.testing.assert_array_equal(frame, ref_frame)
    np.testing.assert_allclose(got, ref, atol=1e-4)


@pytest.mark.parametrize("selection,message", [
    (dict(frames=[3, 200]), "frame 200 is not in the trajectory"),
    (dict(frames=[1, 2], start=1), "cannot be combined"),
    (dict(start=50, stop=10), "selects no frame"),
    (dict(step=0), "step=0: give 1 or more"),
    (dict(frames=[]), "non-empty list"),
    (dict(frames=[0.5, 1.5]), "non-empty list of frame numbers"),
])
def test_frames_mdanalysis_would_refuse_are_refused(tmp_path, adk, selection, message):
    with pytest.raises(InputError, match=message):
        plan_and_run(tmp_path / "run", adk[0], [adk[1]], "rmsd", mode="tasks", blocks=1, cpus=1,
                     **selection)
    assert not (tmp_path / "run").exists()
