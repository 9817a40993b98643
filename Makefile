# Build, test and run the book. Everything installs into .venv from requirements.txt.
#   make test                      unit tests, notebook smoke runs (CPU), book build, browser test, workflow lint
#   make browser                   install a Chromium for the browser test when there is none (make test runs it)
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

.PHONY: test browser old-torchmetrics book gpu-run render gpu-test check-notebooks mutation clean

$(STAMP): requirements.txt constraints.txt pyproject.toml
	@test -x $(VENV)/bin/python || $(VENV_PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else \
	  f"$(VENV_PYTHON) is Python {sys.version.split()[0]}; the pins of requirements.txt need Python 3.11 or later: " \
	  "name one with PYTHON, e.g. PYTHON=python3.11 make $(or $(MAKECMDGOALS),test)")'
	test -x $(VENV)/bin/python || $(VENV_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r requirements.txt -c constraints.txt
	touch $@

test: $(STAMP) $(OLD_SITE)/.installed browser
	$(VENV)/bin/python -m pytest

# The browser test (tests/test_browser.py) drives a Chromium through Playwright: Debian's chromium package, else
# Playwright's own; tests/site_browser.py says whether there is one (the one the test will use). When there is
# none: as root with apt-get, Debian's package; if that is not possible or fails, Playwright's own download
# (into ~/.cache/ms-playwright); if that fails too, one message saying what to run. Nothing is installed with
# MENTOR_CHROMIUM (a Chromium named by hand) or MENTOR_SKIP_BROWSER=1 (the browser test skipped) set.
HAS_CHROMIUM := $(VENV)/bin/python tests/site_browser.py >/dev/null
NO_CHROMIUM := make test needs Chromium for tests/test_browser.py: run \`sudo apt-get install chromium\` or \
  \`$(VENV)/bin/python -m playwright install chromium\` (or set MENTOR_CHROMIUM=/path/to/chromium, \
  or MENTOR_SKIP_BROWSER=1 to skip the browser test)
browser: $(STAMP)
	@[ "$$MENTOR_SKIP_BROWSER" = 1 ] || [ -n "$$MENTOR_CHROMIUM" ] || $(HAS_CHROMIUM) || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "no Chromium for the browser test: installing Debian's chromium package"; \
	    apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	  fi; \
	  $(HAS_CHROMIUM) || { echo "no Chromium for the browser test: installing Playwright's own"; \
	    $(VENV)/bin/python -m playwright install chromium; }; \
	  $(HAS_CHROMIUM) || { echo "$(NO_CHROMIUM)" >&2; exit 1; }; }

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
