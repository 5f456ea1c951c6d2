# Two commands do all the set-up on a fresh machine (Python 3.11, no MPI, no services):
#   make demo   - build the virtualenv from PyPI and run `trajflow demo`
#   make test   - build the virtualenv from PyPI and run the whole test suite
#   make test-fast - the unit and stages layers only (no pilot), unit tests on 2 workers
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python

.PHONY: demo test test-fast bench venv clean

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/trajflow demo

# the unit layer on two workers (independent, no process of trajflow's); the stages and
# the pilot layers one test at a time: they time ranks and look at the machine's processes
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -rs -n 2 tests/unit
	$(PY) -m pytest -q -rs tests/stages

test: test-fast
	$(PY) -m pytest -q -rs tests/pilot

clean:
	rm -rf $(VENV) *.egg-info
