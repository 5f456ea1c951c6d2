"""The command line: --help tells every default; bad input exits 2 at once,
names the problem and the fix, starts no RADICAL session and writes nothing."""
import os
import subprocess
import sys

import pytest

TRAJFLOW = os.path.join(os.path.dirname(sys.executable), "trajflow")


def trajflow(*args, cwd=None):
    return subprocess.run([TRAJFLOW, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_help_explains_every_option_with_its_default():
    out = trajflow("run", "--help").stdout
    for opt in ("--topology", "--trajectory", "--analysis", "--select", "--io", "--mode", "--gather",
                "--blocks", "--repeat", "--resource", "--walltime", "--cpus", "--queue",
                "--project", "--out", "--compression"):
        assert opt in out
    assert "default: shared" in out and "default: mpi" in out and "local.localhost" in out
    flat = " ".join(out.split())
    assert "(default: None)" not in flat and "(default: shared) (default" not in flat  # said once
    assert "default" in trajflow("demo", "--help").stdout


@pytest.fixture
def base(adk, tmp_path):
    return ["run", "--topology", adk[0], "--trajectory", adk[1], "--out", str(tmp_path / "run")]


def _with(base, **over):
    args = list(base)
    for k, v in over.items():
        flag = "--" + k
        if flag in args:
            args[args.index(flag) + 1] = v
        else:
            args += [flag, v]
    return args


BAD = [
    (dict(analysis="rmsd", topology="/nonexistent.psf"), "does not exist"),
    (dict(analysis="rmsd", trajectory="/nonexistent.dcd"), "does not exist"),
    (dict(analysis="rmsd", select="resname NOPE"), "matches 0 atom(s)"),
    (dict(analysis="rmsd", select="name CA and resid 1"), "needs at least 3"),
    (dict(analysis="dihedrals", select="resname TIP3 or name OH2"), "no atoms"),
    (dict(analysis="dihedrals", select="resid 1"), "phi and psi"),
    (dict(analysis="rmsd", blocks="0"), "--blocks 0: give 1 or more"),
    (dict(analysis="rmsd", blocks="99", mode="tasks"), "at most 98"),
    (dict(analysis="rmsd", blocks="3", cpus="2"), "do not fit"),
    (dict(analysis="rmsd", cpus="0"), "--cpus 0: give 1 or more"),
    (dict(analysis="rmsd", walltime="0"), "walltime"),
    (dict(analysis="rmsd", resource="nowhere.cluster"), "unknown resource"),
    (dict(analysis="rmsd", io="h5md", compression="lz4"), "gzip"),
]


@pytest.mark.parametrize("over,message", BAD)
def test_bad_input_exits_2_with_a_clear_message(base, tmp_path, over, message):
    proc = trajflow(*_with(base, **over), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.startswith("trajflow: error:")
    assert not os.path.exists(tmp_path / "run")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("re.session")]


def test_mismatched_topology_and_trajectory(adk, adk_xtc, tmp_path):
    from MDAnalysisTests.datafiles import GRO
    proc = trajflow("run", "--topology", GRO, "--trajectory", adk[1], "--analysis", "rmsd",
                    "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "does not match topology" in proc.stderr


def test_several_trajectories_with_different_atom_counts(adk, tmp_path):
    from MDAnalysisTests.datafiles import XTC
    proc = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], XTC, "--analysis", "rmsd",
                    "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "does not match topology" in proc.stderr
    assert XTC in proc.stderr and not (tmp_path / "run").exists()


def test_unreadable_format(adk, tmp_path):
    junk = tmp_path / "junk.dcd"
    junk.write_bytes(b"not a trajectory" * 10)
    proc = trajflow("run", "--topology", adk[0], "--trajectory", str(junk), "--analysis", "rmsd",
                    "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and "cannot read trajectory" in proc.stderr


def test_never_writes_into_a_users_folder(adk, tmp_path):
    precious = tmp_path / "thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("years of work")
    proc = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                    "--out", str(precious))
    assert proc.returncode == 2 and "not a trajflow run" in proc.stderr
    assert os.listdir(precious) == ["chapter1.tex"]


def test_an_output_folder_that_cannot_be_created(adk, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    proc = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                    "--out", str(blocker / "run"))
    assert proc.returncode == 2 and "cannot be created" in proc.stderr
    assert blocker.read_text() == "not a folder"


def test_unknown_analysis_is_refused_with_the_forms_it_takes(adk, tmp_path):
    proc = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "sasa",
                    "--out", str(tmp_path / "r"))
    assert proc.returncode == 2 and "unknown --analysis" in proc.stderr
    assert "FILE.py:NAME" in proc.stderr and not (tmp_path / "r").exists()


def test_an_h5md_that_lost_its_box_is_refused_for_dihedrals(solvated, tmp_path):
    """A user's H5MD of a periodic system without box/edges (its boundary still
    says periodic): dihedrals would silently skip the minimum image."""
    import gc
    import h5py
    import MDAnalysis as mda
    from plans import make_plan
    gro, xtc = solvated
    boxless = str(tmp_path / "boxless.h5md")
    u = mda.Universe(gro, xtc)
    with mda.Writer(boxless, n_atoms=len(u.atoms)) as w:  # MDAnalysis' own H5MDWriter
        for _ in u.trajectory[:2]:
            w.write(u.atoms)
    del w  # its H5MDWriter closes the file only when collected
    gc.collect()
    with h5py.File(boxless, "r+") as f:
        del f["particles/trajectory/box/edges"]
    proc = trajflow("run", "--topology", gro, "--trajectory", boxless, "--analysis", "dihedrals",
                    "--out", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert "has no periodic box" in proc.stderr and boxless in proc.stderr
    assert "boundary" in proc.stderr and not (tmp_path / "run").exists()
    # rmsd does not use the box; a file that declares itself non-periodic is taken
    make_plan(gro, [boxless], "rmsd", str(tmp_path / "rmsd"))
    with h5py.File(boxless, "r+") as f:
        f["particles/trajectory/box"].attrs["boundary"] = [b"none"] * 3
    make_plan(gro, [boxless], "dihedrals", str(tmp_path / "vacuum"))


def test_one_run_per_folder_a_second_run_or_resume_is_refused_naming_the_holder(adk, tmp_path):
    """While a run holds its RUNDIR (here: this test process, as a running trajflow
    would), another run or a resume into it is refused at once, exit 2; a lock left
    by a process that is gone is taken over."""
    import socket
    from plans import make_plan
    from trajflow.workflows.run.planning import write_plan
    from trajflow.tasks.rundir import LOCK
    from trajflow.workflows.run.rundir_lock import RunLock
    out = tmp_path / "run"
    lock = RunLock(out).acquire()
    holder = f"host {socket.gethostname()} pid {os.getpid()}"
    proc = trajflow("run", "--topology", adk[0], "--trajectory", adk[1], "--analysis", "rmsd",
                    "--out", str(out))
    assert proc.returncode == 2 and "is in use by another trajflow run" in proc.stderr
    assert holder in proc.stderr, proc.stderr
    assert os.listdir(out) == [LOCK]  # the refused run wrote nothing
    lock.release()
    plan = make_plan(adk[0], [adk[1]], "rmsd", str(out), mode="tasks", blocks=2, cpus=2)
    write_plan(plan)  # a run planned, and its lock held, by this process
    proc = trajflow("run", "--resume", str(out))
    assert proc.returncode == 2 and holder in proc.stderr, proc.stderr
    plan.lock.release()
    # a lock file whose process is gone (no flock held): taken over, with its holder noted
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / LOCK).write_text(f"host {socket.gethostname()} pid {dead} since x\n")
    again = make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "other"), blocks=2, cpus=2)
    assert again.lock.taken_over.startswith(f"host {socket.gethostname()} pid {dead}")
    again.lock.release()
    assert not (tmp_path / "other" / LOCK).exists()


def test_a_refused_run_leaves_no_folder_and_no_lock(adk, tmp_path):
    from plans import make_plan
    from trajflow.workflows.run.planning import InputError
    with pytest.raises(InputError):
        make_plan(adk[0], [adk[1]], "rmsd", str(tmp_path / "run"), select="resname NOPE")
    assert not (tmp_path / "run").exists()


def test_version_runs_and_papercuts(adk, tmp_path):
    """--version; `trajflow runs DIR` lists each run with its state; a closed pipe ends
    quietly; `analyses` prints no warning of MDAnalysis' optional modules."""
    from importlib.metadata import version
    assert trajflow("--version").stdout.strip() == f"trajflow {version('trajflow')}"
    from run_stages import plan_and_run
    plan_and_run(tmp_path / "runs" / "a", adk[0], [adk[1]], "rmsd", mode="tasks", blocks=2)
    from plans import make_plan
    from trajflow.workflows.run.planning import write_plan
    unfinished = make_plan(adk[0], [adk[1]], "dihedrals", str(tmp_path / "runs" / "b"), blocks=1)
    write_plan(unfinished)
    unfinished.lock.release()
    listing = trajflow("runs", str(tmp_path / "runs")).stdout.splitlines()
    assert [line.split()[:3] for line in listing[1:]] == [["a", "rmsd", "done"],
                                                         ["b", "dihedrals", "not"]], listing
    # a folder of runs is inspected as the runs `runs` lists (it was refused: no plan.json)
    inspected = trajflow("inspect", str(tmp_path / "runs"))
    assert inspected.returncode == 1, inspected.stderr  # b has not ended
    assert "a  " in inspected.stdout and "b: " in inspected.stdout, inspected.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = trajflow("inspect", str(empty))
    assert refused.returncode == 2 and "holds none" in refused.stderr and \
        "`trajflow runs FOLDER` lists them" in refused.stderr, refused.stderr
    piped = subprocess.run(f"{TRAJFLOW} resources | head -2", shell=True, capture_output=True,
                           text=True, timeout=120)
    assert "Traceback" not in piped.stderr and len(piped.stdout.splitlines()) == 2, piped.stderr
    analyses = trajflow("analyses")
    assert analyses.returncode == 0 and analyses.stderr == "", analyses.stderr
