# Two commands do all the set-up on a fresh machine (Python 3.11, no MPI, no services):
#   make demo   - build the virtualenv from PyPI and run `trajflow demo`
#   make test   - build the virtualenv from PyPI and run the whole test suite
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python

.PHONY: demo test bench venv clean

$(VENV)/.installed: setup.cfg pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/trajflow demo

test: $(VENV)/.installed
	$(PY) -m pytest -q -rs

clean:
	rm -rf $(VENV) *.egg-info
