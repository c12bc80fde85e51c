# The two commands of the README:
#   make run   - set up (first time) and start the whole service for this machine
#   make test  - set up (first time) and run the whole test suite, as CI does
# and a developer's inner loop:
#   make test-quick - lint, import contracts and the tests that start no stack, train no
#                     model and drive no browser (SQLite only): under 3 minutes
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.towerq-installed
# What the setup installs, and what constraints.txt pins (scripts/lock.py's LOCKED_EXTRAS).
EXTRAS := server,cpu,notebook,dev

BIOME := node_modules/.bin/biome

.PHONY: run test test-quick lint lint-web typecheck pytest setup clean frameworks lock

run: setup
	$(BIN)/towerq up

test: setup
	scripts/setup-system --test
	$(MAKE) --no-print-directory frameworks lint typecheck pytest

# A second framework for the command-job tests (tests/test_command_frameworks.py): PyTorch,
# CPU build (about 45 s to install here, from the machine's local wheel; elsewhere pip may
# fetch the CUDA build). Members' jobs use it the same way: docs/command-jobs.md.
frameworks:
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet -c constraints.txt 'torch==2.13.0'

test-quick: setup
	$(BIN)/ruff check service worker migrations towerq tests bench
	$(BIN)/lint-imports --no-cache
	$(BIN)/pytest -q -m "not slow and not browser and not postgres"

lint:
	$(BIN)/ruff check service worker migrations towerq tests bench
	$(BIN)/ruff format --check service worker migrations towerq tests bench
	$(BIN)/lint-imports --no-cache
	$(MAKE) --no-print-directory lint-web

# The dashboard: Biome (formatter + linter, pinned in package.json/package-lock.json).
lint-web: $(BIOME)
	$(BIOME) ci --colors=off web

$(BIOME): package.json package-lock.json
	npm install --no-audit --no-fund --loglevel=error
	touch $(BIOME)

typecheck:
	$(BIN)/mypy service worker towerq

# Two pytest workers (pytest-xdist), a test file each at a time: most tests wait on the
# processes of a stack, so two share this 2-core machine well (16 min instead of 20:26 for
# the same tests). TEST_WORKERS=0 runs them in one process. --no-loadscope-reorder: files go
# out in the order tests/conftest.py sorts them (the longest first), not xdist's own (files
# with the most tests first, which left the one-test chaos file to run alone at the end).
# --durations: the slowest tests of every run, to keep the suite well under CI's 90 minutes
# (32 in the last clean-clone run).
TEST_WORKERS ?= 2
pytest:
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	scripts/setup-system --run
	$(PYTHON) scripts/check-python.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# setuptools announces every editable install of a package-dir layout with a banner
	@# (a UserWarning, "Editable installation."): that one message is silenced, nothing else.
	@# constraints.txt: the exact versions the suite passed with (scripts/lock.py writes it).
	PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(BIN)/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

# To change or upgrade a dependency: edit pyproject.toml's ranges if need be, `make lock`
# (the newest versions the ranges allow, installed and written to constraints.txt), then
# `make test`, and commit both files if it passes. Not through `setup`: where a pin cannot
# install (a new range excludes it, a newer Python has no wheel for it), that would fail.
lock:
	scripts/setup-system --run
	$(PYTHON) scripts/check-python.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	PYTHONWARNINGS="ignore:Editable installation:UserWarning" $(BIN)/pip install --quiet --upgrade --upgrade-strategy eager -e '.[$(EXTRAS)]'
	$(BIN)/python scripts/lock.py
	touch $(STAMP)

clean:
	rm -rf $(VENV) node_modules var tests/artifacts .pytest_cache .mypy_cache .ruff_cache
