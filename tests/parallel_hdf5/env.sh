#!/usr/bin/env bash
# The cluster-style environment: Debian's MPICH, mpi4py built against it, h5py
# built against Debian's parallel HDF5 (libhdf5-mpich-dev, HDF5_MPI=ON), trajflow
# installed into it with everything else from PyPI, never the mpich wheel. As on
# a cluster where users build against the loaded MPI and HDF5 modules.
#
#   bash tests/parallel_hdf5/env.sh install   Debian's packages (root)
#   bash tests/parallel_hdf5/env.sh build     the venv (built once), with this tree
#                                             installed into it: prints its folder
#
# Built into $TRAJFLOW_CACHE (~/.cache/trajflow) under a name keyed by the Debian
# packages' versions, Python's and the constraints, so CI builds it once and later
# runs reuse it (a build takes ~5 min on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
PACKAGES="mpich libmpich-dev libhdf5-mpich-dev pkg-config"
HDF5_DIR=/usr/lib/x86_64-linux-gnu/hdf5/mpich
RECIPE=2  # raise it when the build below changes: the cached venv is built again

case "${1:-build}" in
install)
    missing=$(for p in $PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
    if [ -n "$missing" ]; then
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            $missing >/dev/null
    fi
    ;;
build)
    for p in $PACKAGES; do
        dpkg -s "$p" >/dev/null 2>&1 || { echo "missing Debian package $p: run '$0 install' as root" >&2; exit 3; }
    done
    # trajflow's requirements and its test extras, the mpich wheel left out (Debian's runs)
    reqs=$(python3 - <<'PY'
import configparser
c = configparser.ConfigParser(); c.read("setup.cfg")
lines = c["options"]["install_requires"].split() + c["options.extras_require"]["test"].split()
print(" ".join(r for r in lines if r and not r.lower().startswith("mpich")))
PY
)
    versions=$(dpkg-query -W -f '${Version} ' mpich libhdf5-mpich-dev)
    key=$( (echo "$versions recipe $RECIPE $reqs"; python3 --version; cat constraints.txt) \
        | sha1sum | cut -c1-12)
    cache=${TRAJFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trajflow}
    venv="$cache/parallel-hdf5-$key"
    if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.built" ]; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        pip="$venv/bin/python -m pip install -q -c constraints.txt"
        $pip --upgrade pip >&2
        $pip --upgrade "setuptools>=77" wheel "Cython>=3" numpy pkgconfig >&2  # h5py: PEP 639
        MPICC=/usr/bin/mpicc $pip --no-binary=mpi4py --no-build-isolation mpi4py >&2
        CC=/usr/bin/mpicc HDF5_MPI=ON HDF5_DIR=$HDF5_DIR $pip --no-binary=h5py \
            --no-build-isolation h5py >&2
        $pip $reqs >&2
        # the venv's mpiexec (where trajflow looks) runs Debian's; by a script, not a link:
        # hydra finds its hydra_pmi_proxy beside the path it was started by
        printf '#!/bin/sh\nexec /usr/bin/mpiexec.mpich "$@"\n' > "$venv/bin/mpiexec"
        chmod +x "$venv/bin/mpiexec"
        "$venv/bin/python" -c "import h5py, mpi4py; assert h5py.get_config().mpi, 'h5py without MPI'" >&2
        touch "$venv/.built"
    fi
    # this source tree, every time (a cached venv may have served another clone)
    "$venv/bin/python" -m pip install -q --no-deps -e . >&2
    echo "$venv"
    ;;
*)
    echo "usage: $0 install|build" >&2; exit 2
    ;;
esac
