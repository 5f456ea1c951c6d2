# Two commands do all the set-up on a fresh machine (Python 3.11, no MPI, no services):
#   make demo   - build the virtualenv from PyPI and run `trajflow demo`
#   make test   - build the virtualenv from PyPI and run the whole test suite (and the
#                 h5md path again with Debian's MPICH and parallel HDF5, where installed)
#   make test-fast - the unit and stages layers only (no pilot), unit tests on 2 workers
#   make docs   - the documentation site into site/
#   make package - the wheel, installed outside the tree and run (the demo, the unit layer)
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python

.PHONY: demo test test-fast test-parallel-hdf5 bench venv bytecode docs package clean

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# trajflow's own modules compiled once (a no-op when they are): an editable install
# where PYTHONDONTWRITEBYTECODE is set (this CI's machine, many containers) otherwise
# compiles them again in every process, ~0.15 s of each `trajflow` command and task
# start (a wheel's install compiles them itself)
bytecode: $(VENV)/.installed
	$(PY) -m compileall -q tasks workflows

demo: bytecode
	$(VENV)/bin/trajflow demo

# the unit layer on two workers (independent, no process of trajflow's); the stages on
# two workers too (they keep both cores busy: 0.90 of 2 measured, one at a time ~0.5),
# then their `serial` tests alone (they judge time: an injected delay found exactly, a
# rank under a CPU quota, a benchmark); the pilot layer on PILOT_WORKERS workers, as its
# tests mostly wait on pilots (each judges only its own pilot's processes; tests of SLURM, sshd
# and the virtual cluster share one worker: tests/conftest.py), then its `serial` tests
# alone (they judge speed or placement). The slowest tests of each are listed at the end.
PILOT_WORKERS ?= 3
test-fast: bytecode
	$(PY) -m pytest -q -rs -n 2 tests/unit
	$(PY) -m pytest -q -rs -n 2 -m "not serial" --durations=15 tests/stages
	$(PY) -m pytest -q -rs -m serial --durations=5 tests/stages

test: test-fast
	$(PY) -m pytest -q -rs -n $(PILOT_WORKERS) --dist loadgroup -m "not serial" --durations=0 --durations-min=10 tests/pilot
	$(PY) -m pytest -q -rs -m serial --durations=5 tests/pilot
	$(MAKE) test-parallel-hdf5

# the h5md path again in the cluster-style environment (tests/parallel_hdf5/env.sh):
# Debian's MPICH, mpi4py and h5py built against it and its parallel HDF5, so MPI ranks
# open H5MD files with driver mpio; built once into the cache; said and skipped where
# its Debian packages are missing (`sudo bash tests/parallel_hdf5/env.sh install`); on two
# workers as the stages layer, then its `serial` tests alone
test-parallel-hdf5:
	@venv=$$(bash tests/parallel_hdf5/env.sh build); rc=$$?; \
	if [ $$rc = 3 ]; then echo "SKIPPED the parallel HDF5 environment: see the message above"; \
	elif [ $$rc != 0 ]; then exit $$rc; \
	else $$venv/bin/python -m pytest -q -rs -p no:cacheprovider -n 2 -m "not serial" -k h5md tests/stages \
	  && $$venv/bin/python -m pytest -q -rs -p no:cacheprovider -m serial -k h5md tests/stages; fi

# the documentation site into site/ (warnings are errors; the API and CLI references are
# made from the code by docs/hooks.py)
docs: $(VENV)/.installed
	$(PY) -m pip install -q -c constraints.txt -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -q

# the sdist and the wheel into dist/, then the wheel installed into a fresh virtualenv
# outside the source tree and run from there: --version, the demo, the unit layer (a
# file missing from the package, or code that imports the source tree, fails here)
PKG_VENV ?= $(or $(TMPDIR),/tmp)/trajflow-package-venv
package: $(VENV)/.installed
	rm -rf dist $(PKG_VENV)
	$(PY) -m pip install -q -c constraints.txt build
	$(PY) -m build -q --outdir dist .
	$(PYTHON) -m venv $(PKG_VENV)
	$(PKG_VENV)/bin/python -m pip install -q --upgrade pip
	$(PKG_VENV)/bin/python -m pip install -q -c constraints.txt "$$(ls dist/*.whl)[test]"
	cd $(PKG_VENV) && bin/trajflow --version
	cd $(PKG_VENV) && bin/trajflow demo --copies 2 --out demo
	cd $(PKG_VENV) && bin/python -m pytest -q -p no:cacheprovider -n 2 $(CURDIR)/tests/unit
	rm -rf $(PKG_VENV)

clean:
	rm -rf $(VENV) *.egg-info site dist
