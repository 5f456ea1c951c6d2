"""Shared fixtures: real MDAnalysisTests files and trajectories built from them at run time."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from processes import (hold_shared_pilot, remove_local_sandboxes,  # noqa: E402
                       SHARED_PILOTS_ENV, stop_shared_pilot)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", module="MDAnalysis")


@pytest.fixture(scope="session")
def adk():
    from MDAnalysisTests.datafiles import PSF, DCD
    return PSF, DCD


def rewrite(top, traj, path):
    """Every frame of (top, traj) written to `path` in the format its extension names."""
    import MDAnalysis as mda
    u = mda.Universe(top, traj)
    with mda.Writer(str(path), n_atoms=len(u.atoms)) as w:
        for _ in u.trajectory:
            w.write(u.atoms)
    return top, str(path)


@pytest.fixture(scope="session")
def adk_xtc(adk, tmp_path_factory):
    """AdK's 98 frames written as XTC (lossy, so compared with MDAnalysis reading the XTC)."""
    return rewrite(*adk, tmp_path_factory.mktemp("xtc") / "adk.xtc")


@pytest.fixture(scope="session")
def solvated():
    """MDAnalysisTests' solvated AdK (GRO + XTC): 47,681 atoms, 10 frames, a triclinic
    (rhombic dodecahedron) box with the protein broken across it: consecutive CA
    atoms near residue 124 are ~80 Å apart in the raw coordinates."""
    from MDAnalysisTests.datafiles import GRO, XTC
    return GRO, XTC


def jittered(top, coordinates, path, frames, sigma=0.3, seed=7):
    """`frames` frames of a one-frame structure (DCD at `path`), each atom moved by a
    seeded normal step of `sigma` Å: analyses that need frames to split, on a structure
    nobody here wrote."""
    import MDAnalysis as mda
    u = mda.Universe(top, coordinates) if coordinates else mda.Universe(top)
    rng, start = np.random.default_rng(seed), u.atoms.positions.copy()
    with mda.Writer(str(path), n_atoms=len(u.atoms)) as w:
        for _ in range(frames):
            u.atoms.positions = start + rng.normal(0.0, sigma, start.shape)
            w.write(u.atoms)
    return top, str(path)


@pytest.fixture(scope="session")
def polymer(tmp_path_factory):
    """MDAnalysisTests' polymer chains (the GRO of its PersistenceLength test), 6 frames."""
    from MDAnalysisTests.datafiles import Plength
    return jittered(Plength, None, tmp_path_factory.mktemp("polymer") / "plength.dcd", 6, 0.1)


@pytest.fixture(scope="session")
def rna(tmp_path_factory):
    """MDAnalysisTests' RNA (PSF + one PDB frame, of its nucleic-acid tests), 9 frames."""
    from MDAnalysisTests.datafiles import RNA_PSF, RNA_PDB
    return jittered(RNA_PSF, RNA_PDB, tmp_path_factory.mktemp("rna") / "rna.dcd", 9)


@pytest.fixture(scope="session")
def solvated_trr():
    from MDAnalysisTests.datafiles import GRO, TRR
    return GRO, TRR


@pytest.fixture(scope="session")
def solvated_dcd(solvated, tmp_path_factory):
    """The solvated system written as DCD (with its unit cell), read through the DCD paths."""
    return rewrite(*solvated, tmp_path_factory.mktemp("solvated") / "solvated.dcd")


@pytest.fixture(scope="session")
def reference_results():
    """MDAnalysis' own answers, computed once per (topology, trajectories, analysis)."""
    cache = {}

    def compute(top, trajs, analysis):
        key = (top, tuple(trajs), analysis)
        if key not in cache:
            import MDAnalysis as mda
            from MDAnalysis.analysis import rms
            from MDAnalysis.analysis.dihedrals import Ramachandran
            u = mda.Universe(top, trajs[0] if len(trajs) == 1 else list(trajs))
            if analysis == "rmsd":
                r = rms.RMSD(u, select="name CA").run().results.rmsd
                cache[key] = {"frame": r[:, 0], "time": r[:, 1], "rmsd": r}  # (frame, time, rmsd)
            else:
                rama = Ramachandran(u.select_atoms("protein")).run()
                ang = np.deg2rad(rama.results.angles)  # (F, R, 2)
                feats = np.stack([np.cos(ang[..., 0]), np.sin(ang[..., 0]),
                                  np.cos(ang[..., 1]), np.sin(ang[..., 1])], axis=2)
                times = np.array([u.trajectory.time for _ in u.trajectory])
                cache[key] = {"frame": np.arange(len(times)), "time": times,
                              "features": feats.reshape(len(times), -1)}
        return cache[key]
    return compute


SLURM_SCRIPT = os.path.join(os.path.dirname(__file__), "slurm", "single_node.sh")


@pytest.fixture(scope="session")
def slurm():
    """A single-node SLURM on this machine (tests/slurm/single_node.sh), started
    once for the session when this runs as root and it is not up; stopped after."""
    def up():
        return subprocess.run(["bash", SLURM_SCRIPT, "status"], capture_output=True).returncode == 0
    started = False
    if not up():
        if os.geteuid() != 0:
            pytest.skip("SLURM is not running and this test is not root: start it with "
                        "`sudo tests/slurm/single_node.sh install start`")
        proc = subprocess.run(["bash", SLURM_SCRIPT, "start"], capture_output=True, text=True)
        if proc.returncode != 0 or not up():
            pytest.skip(f"SLURM could not start here: {(proc.stderr or proc.stdout).strip()[-400:]}")
        started = True
    yield
    if started:
        subprocess.run(["bash", SLURM_SCRIPT, "stop"], capture_output=True)


VIRTUAL_CLUSTER = os.path.join(os.path.dirname(__file__), "cluster", "virtual.sh")


class VirtualCluster:
    """tests/cluster/virtual.sh's cluster, as the tests drive it."""

    def __init__(self, nodes):
        self.nodes = nodes

    @staticmethod
    def do(*args):
        proc = subprocess.run(["bash", VIRTUAL_CLUSTER, *args], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        return proc.stdout

    def processes(self, node):
        """pids running in the node's namespaces, its slurmd left out."""
        out = subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout
        pidfile = os.path.join(os.environ.get("TRAJFLOW_VCLUSTER_DIR", "/tmp/trajflow-vcluster"),
                               "run", f"slurmd.{node}.pid")
        slurmd = open(pidfile).read().strip() if os.path.exists(pidfile) else ""
        return [p for p in out.split() if p != slurmd]

    def assert_nothing_left(self):
        """Only the slurmds run on the nodes (a pilot's job ends seconds after its cancel)."""
        for _ in range(30):
            left = {node: self.processes(node) for node in self.nodes}
            if not any(left.values()):
                return
            time.sleep(1)
        raise AssertionError(f"processes left on the nodes: {left}")


@pytest.fixture(scope="module")
def virtual_cluster():
    """A 3-node virtual SLURM cluster (tests/cluster/virtual.sh, 2 cpus per node), the
    client's environment pointing at it (SLURM_CONF, RADICAL_DEFAULT_IFACE); stopped
    after the module, by the pids it recorded."""
    if os.geteuid() != 0:
        pytest.skip("the virtual cluster needs root (namespaces, a bridge, slurmd)")
    missing = [cmd for cmd in ("slurmctld", "slurmd", "munged", "ip", "nsenter", "unshare")
               if shutil.which(cmd) is None and not os.path.exists(f"/usr/sbin/{cmd}")]
    if missing:
        pytest.skip(f"no {', '.join(missing)} here: the virtual cluster needs slurm-wlm, munge, "
                    "iproute2 and util-linux (`sudo tests/slurm/single_node.sh install`)")
    subprocess.run(["bash", VIRTUAL_CLUSTER, "stop"], capture_output=True, timeout=120)
    proc = subprocess.run(["bash", VIRTUAL_CLUSTER, "start", "3"], capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        subprocess.run(["bash", VIRTUAL_CLUSTER, "stop"], capture_output=True, timeout=120)
        if "namespaces cannot be made" in proc.stderr:
            pytest.skip(proc.stderr.strip())
        pytest.fail(f"the virtual cluster did not start: {proc.stdout}{proc.stderr}")
    env = dict(line.replace("export ", "", 1).split("=", 1)
               for line in VirtualCluster.do("env").splitlines())
    try:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            yield VirtualCluster(VirtualCluster.do("nodes").split())
    finally:
        subprocess.run(["bash", VIRTUAL_CLUSTER, "stop"], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def cluster(adk):
    """sshd, the two accounts, the virtualenv and AdK in the cluster's home
    (tests/ssh/cluster.sh; names and paths in ssh_cluster.py)."""
    from ssh_cluster import CLUSTER, CLUSTER_SH, DATA, WORK, WORKSTATION
    if os.geteuid() != 0:
        pytest.skip("the SSH tests make accounts and start sshd: run them as root")
    for step in ("install", "start"):
        proc = subprocess.run(["bash", CLUSTER_SH, step], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"sshd could not {step} here: {(proc.stderr or proc.stdout)[-400:]}")
    shutil.rmtree(f"/home/{CLUSTER}/runs", ignore_errors=True)  # an earlier session's
    os.makedirs(DATA, exist_ok=True)
    for path in adk:
        shutil.copy(path, DATA)
    subprocess.run(["chown", "-R", f"{CLUSTER}:{CLUSTER}", f"/home/{CLUSTER}"], check=True)
    shutil.rmtree(WORKSTATION, ignore_errors=True)
    os.makedirs(WORKSTATION)
    shutil.chown(WORKSTATION, WORK)
    yield {"top": os.path.join(DATA, os.path.basename(adk[0])),
           "traj": os.path.join(DATA, os.path.basename(adk[1]))}
    subprocess.run(["bash", CLUSTER_SH, "stop"], capture_output=True)
    shutil.rmtree(f"/home/{CLUSTER}/radical.pilot.sandbox", ignore_errors=True)


LAYERS = ("unit", "stages", "pilot")  # tests/<layer>/: see docs/explanation/testing.md


# Machine-wide services of the pilot layer: one SLURM, one sshd, one virtual cluster
SERVICES = {"slurm", "cluster", "virtual_cluster"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group markers
def pytest_collection_modifyitems(config, items):
    """Each test is marked with its layer, from its folder; the pilot layer is also
    `entk` (it starts real RADICAL pilots), whatever its module says.

    The pilot layer runs on pytest-xdist workers (`--dist loadgroup`, see the
    Makefile): its tests wait on pilots far more than they compute. A test of a
    machine-wide service (SERVICES) joins the group "services", which one worker runs
    one test at a time (the service's fixture starts it once there); a test that
    shares a module-scoped fixture (a kept pilot) joins its module's group, so that
    its pilot starts once. Tests marked `serial` (they judge speed or placement) run
    on their own afterwards."""
    for item in items:
        layer = next((p for p in item.path.parts[::-1] if p in LAYERS), None)
        if layer is not None:
            item.add_marker(getattr(pytest.mark, layer))
        if layer == "pilot":
            item.add_marker(pytest.mark.entk)
            group = _worker_group(item)
            if group:
                item.add_marker(pytest.mark.xdist_group(group))


class _GroupsHonoured:
    """On an xdist worker with --dist loadgroup: fail at once if xdist did not put the
    group into the test ids (pytest 9.2 with xdist 3.8 grouped nothing, silently, and
    the services' tests ran side by side)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not config.getvalue("loadgroup"):
            return
        lost = [item.nodeid for item in items
                if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist ignored the xdist_group of {lost[0]} (and "
                                    f"{len(lost) - 1} more): use the pytest of constraints.txt")


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        config.pluginmanager.register(_GroupsHonoured(), "trajflow-groups-honoured")
    elif not os.environ.get(SHARED_PILOTS_ENV):  # the controller's (xdist's workers inherit it)
        config._trajflow_shared_pilots = os.environ[SHARED_PILOTS_ENV] = tempfile.mkdtemp(
            prefix="trajflow-test-pilots-")


def pytest_unconfigure(config):
    made_here = getattr(config, "_trajflow_shared_pilots", None)
    if made_here:
        stop_shared_pilot(made_here)


@pytest.fixture(scope="session", autouse=True)
def local_sandboxes_removed(tmp_path_factory):
    """After the session, the local RADICAL sandboxes that no client removed (9 were left
    by one CI run) of the sessions whose folders are in this worker's temporary folders."""
    yield
    remove_local_sandboxes(tmp_path_factory.getbasetemp())


@pytest.fixture
def shared_pilot():
    """A held pilot that every worker of the pilot layer shares, for runs that are not
    about a pilot's own start, death or placement (fault tests' resumes): a cold
    pilot costs ~17 core-seconds of this 2-core machine, a run on a held one ~1.
    Looked for at each use (started again if it ended at its idle time)."""
    return hold_shared_pilot()


def _worker_group(item):
    fixtures = getattr(item, "_fixtureinfo", None)
    if SERVICES & set(getattr(item, "fixturenames", ())):
        return "services"
    if fixtures is not None and any(defs[-1].scope == "module"
                                    for defs in fixtures.name2fixturedefs.values()):
        return item.path.stem
    return None
