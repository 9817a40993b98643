# Build, test and run the book. Everything installs into .venv from requirements.txt.
#   make test                      unit tests, notebook smoke runs (CPU), book build, workflow lint
#   make book                      build the HTML book from the notebooks' stored outputs
#   make gpu-run [NB=book/x.ipynb] execute notebooks in place on this machine's GPU
#   make render [NB=book/x.ipynb]  re-render split notebooks from their stored measurements (any machine, no GPU)
#   make gpu-test                  the CUDA tests (pytest -m gpu) on this machine's GPU
#   make old-torchmetrics          torchmetrics 1.6.1 (the article's release) into .venv/torchmetrics-1.6.1, for ch. 13
#   make check-notebooks           fail if a notebook's stored GPU run is not current
#   make mutation [MUTANTS=...]    mutation testing of mentor/ with mutmut (hours; not part of make test);
#                                  MUTANTS="mentor.readback*" runs one module's mutants, JOBS=N sets the workers
#   make clean                     remove _build
# PYTHON=python3.12 make test creates .venv from that interpreter (Python 3.11 or later).

VENV := .venv
STAMP := $(VENV)/.installed
PYTHON ?= $(VENV)/bin/python
NB ?=
MUTANTS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

# gpu-run and check-notebooks build the venv only when they run its python; with
# PYTHON=python3 (a GPU machine whose python already has torch etc.) they use it as is.
OLD_SITE := $(VENV)/torchmetrics-1.6.1
PYTHON_DEPS := $(if $(filter $(VENV)/bin/python ./$(VENV)/bin/python,$(PYTHON)),$(STAMP))
# test, book and mutation always run in .venv; it is created from PYTHON when that names another interpreter
# (PYTHON=python3.12 make test), from python3 otherwise. The pins need Python 3.11 or later.
VENV_PYTHON := $(if $(PYTHON_DEPS),python3,$(PYTHON))

.PHONY: test old-torchmetrics book gpu-run render gpu-test check-notebooks mutation clean

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(VENV)/bin/python || $(VENV_PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  f"$(VENV_PYTHON) is Python {sys.version.split()[0]}; the pins of requirements.txt need Python 3.11 or later: " \
	  "name one with PYTHON, e.g. PYTHON=python3.11 make $(or $(MAKECMDGOALS),test)")'
	test -x $(VENV)/bin/python || $(VENV_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

test: $(STAMP) $(OLD_SITE)/.installed
	$(VENV)/bin/python -m pytest

# A second torchmetrics, outside the venv's site-packages: only a process whose PYTHONPATH starts with it
# imports it (mentor.lab.releases). --no-deps: it needs nothing that the venv lacks.
old-torchmetrics: $(OLD_SITE)/.installed
$(OLD_SITE)/.installed: $(PYTHON_DEPS)
	$(PYTHON) -m pip install -q --no-deps --target $(OLD_SITE) torchmetrics==1.6.1
	touch $@

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

gpu-run: $(PYTHON_DEPS) $(OLD_SITE)/.installed
	$(PYTHON) scripts/nbtools.py gpu-run $(NB)

render: $(PYTHON_DEPS)
	$(PYTHON) scripts/nbtools.py render $(NB)

gpu-test: $(PYTHON_DEPS)
	$(PYTHON) -m pytest -m gpu

check-notebooks: $(PYTHON_DEPS)
	$(PYTHON) scripts/nbtools.py check $(NB)

mutation: $(STAMP)
	$(VENV)/bin/python -m pip install -q mutmut==3.8.1
	OMP_NUM_THREADS=1 $(VENV)/bin/mutmut run --max-children $(JOBS) $(MUTANTS) || true
	$(VENV)/bin/mutmut export-cicd-stats
	$(VENV)/bin/python -c "import json; s = json.load(open('mutants/mutmut-cicd-stats.json')); \
	caught = s['killed'] + s['timeout']; run = caught + s['survived'] + s['no_tests']; \
	print(s); print(f'mutation score: {caught} of {run} mutants run were caught ({100 * caught / max(1, run):.1f} %)'); \
	raise SystemExit('no mutant ran: mutmut failed before testing (see \"failed to collect stats\" above)' if run == 0 else 0)"
	@echo "surviving mutants: $(VENV)/bin/mutmut results; one of them: $(VENV)/bin/mutmut show NAME"

clean:
	rm -rf _build
