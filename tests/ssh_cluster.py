"""The SSH "cluster" of tests/ssh/cluster.sh as the tests use it: its accounts,
paths and the workstation account's trajflow (fixture `cluster` in conftest.py)."""
import os
import subprocess

from paths import TESTS

CLUSTER_SH = os.path.join(TESTS, "ssh", "cluster.sh")
VENV = os.environ.get("TRAJFLOW_REMOTE_VENV", "/opt/trajflow-remote-venv")
PORT = os.environ.get("TRAJFLOW_SSHD_PORT", "2222")
CLUSTER, WORK = "tfcluster", "tfwork"
TARGET = f"{CLUSTER}@127.0.0.1:{PORT}"
DATA = f"/home/{CLUSTER}/data dir"   # a space in every cluster path
WORKSTATION = "/tmp/trajflow-remote-tests"


def workstation(*args, popen=False, timeout=600):
    """`trajflow ARGS` as the workstation account."""
    argv = ["runuser", "-u", WORK, "--", f"{VENV}/bin/trajflow", *args]
    kw = dict(cwd=WORKSTATION, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if popen:
        return subprocess.Popen(argv, **kw)
    return subprocess.run(argv, timeout=timeout, **kw)
