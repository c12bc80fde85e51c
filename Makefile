# The two commands of the README:
#   make run   - set up (first time) and start the whole service for this machine
#   make test  - set up (first time) and run the whole test suite, as CI does
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.towerq-installed

BIOME := node_modules/.bin/biome

.PHONY: run test lint lint-web typecheck pytest setup clean

run: setup
	$(BIN)/towerq up

test: setup
	scripts/setup-system --test
	$(MAKE) --no-print-directory lint typecheck pytest

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

pytest:
	$(BIN)/pytest

setup: $(STAMP)

$(STAMP): pyproject.toml
	scripts/setup-system --run
	$(PYTHON) scripts/check-python.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[cpu,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) node_modules var tests/artifacts .pytest_cache .mypy_cache .ruff_cache
