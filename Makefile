# Developer entry points. Everything runs from a project-local virtualenv at .venv that
# this Makefile creates and installs itself, pinned by constraints.txt.
#
#   make test      lint, the whole test suite, and the docs build (if mkdocs.yml exists)
#   make test-deployment  end-to-end test against real Airflow components (scheduler, two
#                  triggerers, LocalExecutor workers, api-server) and the emulator, ~3 minutes;
#                  DEPLOYMENT_DB=postgres runs it on a PostgreSQL cluster of its own, with the
#                  50-sensor failover scenario (installs postgresql and its drivers when missing);
#                  EXECUTOR=celery runs Airflow's CeleryExecutor on PostgreSQL and Redis with two
#                  Celery workers and the FAB auth manager (installs redis-server and the providers)
#   make test-conformance  RFC 6455 as the Autobahn|Testsuite fuzzing server sees it: an echo client
#                  on GatewaySocket held to one on websockets' own client, on the oldest and the
#                  newest websockets the package allows (installs the server, which runs on
#                  Python 2.7, into .cache/conformance; skipped where no Python 2.7 is found)
#   make test-ui   the Airflow UI in Debian's Chromium (Playwright): connection form, Test button,
#                  human review, XCom view; writes docs/images/ui-*.png (installs chromium and
#                  playwright when missing)
#   make demo      end-to-end demo against the embedded gateway emulator
#   make review-demo  a person's review answered through Airflow's REST API (api-server on loopback)
#   make emulator  run the gateway emulator in the foreground (API key "emulator-key")
#   make lock      regenerate constraints.txt from a throwaway venv
#   make docs      build the documentation site (no tests)
#   make dist      build the sdist and the wheel into dist/ and check them
#   make test-matrix  the whole suite against the built wheel on every supported Airflow × Python
#   make lock-matrix  regenerate constraints/airflow-<minor>-py<python>.txt

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := test,docs,release

PYTEST_ARGS ?=
# pytest-xdist workers of 'make test' (whole test files per worker, as in the matrix); 0 runs the
# suite in one process. Four on two cores: most tests wait on loopback sockets and timers (two
# workers kept two cores about a third busy, 6.4 min; four take about 4 min).
TEST_WORKERS ?= 4
DEPLOYMENT_DB ?= sqlite
# The deployment test's executor: local (LocalExecutor) or celery (CeleryExecutor, two workers).
EXECUTOR ?= local
DEMO_ARGS ?=
EMULATOR_ARGS ?=
BENCH_ARGS ?=
# Corners of the support matrix, AIRFLOW:PYTHON; empty: all nine.
MATRIX ?=
# pytest-xdist workers per corner (whole test files per worker); 0 runs the suite in one process.
MATRIX_WORKERS ?= 2
# Corners run side by side (each in its own venv and tree).
MATRIX_JOBS ?= 1

LOCK_VENV := .cache/lock-venv
# What production deployments install beside the provider (the FAB auth manager, the Celery executor,
# the PostgreSQL and Redis drivers): every lock resolves them with the project (the list is
# scripts/matrix.py's, which locks the corners' files with it).
PRODUCTION = $(shell $(PYTHON) scripts/matrix.py production)

# Quieter, reproducible pip runs.
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export PIP_NO_INPUT := 1
# mkdocs-material prints a banner about MkDocs 2.0 on every build.
export NO_MKDOCS_2_WARNING := 1

.PHONY: help venv install test test-deployment test-ui test-conformance lint demo review-demo emulator bench lock clean distclean check-python \
	docs dist test-matrix lock-matrix

help:
	@echo "Targets:"
	@echo "  make test      create $(VENV), install from constraints.txt, lint, run the tests, build the docs"
	@echo "  make test-deployment  end-to-end test with a real scheduler, two triggerers and workers (~3 min)"
	@echo "                 DEPLOYMENT_DB=postgres: on PostgreSQL, plus a 50-sensor triggerer failover"
	@echo "                 EXECUTOR=celery: CeleryExecutor, PostgreSQL, Redis, two workers, FAB auth"
	@echo "  make test-ui   drive the Airflow UI in Chromium; writes the screenshots in docs/images"
	@echo "  make test-conformance  the Autobahn|Testsuite RFC 6455 cases against the client's socket"
	@echo "                 (needs Python 2.7: PYTHON27=/path/to/python2.7 when not found)"
	@echo "  make demo      run the end-to-end demo against the embedded emulator (DEMO_ARGS=...)"
	@echo "  make review-demo  answer a review through the REST API, as a script would (DEMO_ARGS=...)"
	@echo "  make emulator  run the gateway emulator: systemzero-emulator --api-key emulator-key (EMULATOR_ARGS=...)"
	@echo "  make lint      ruff check and ruff format --check"
	@echo "  make bench     run the benchmarks (BENCH_ARGS=...)"
	@echo "  make lock      regenerate constraints.txt"
	@echo "  make docs      build the documentation site into .cache/site (no tests)"
	@echo "  make dist      build and check the sdist and the wheel (dist/)"
	@echo "  make test-matrix  the suite against the built wheel on Airflow 3.1-3.3 x Python 3.11-3.13"
	@echo "                 (MATRIX=\"3.1:3.11 3.3:3.13\" picks corners)"
	@echo "  make lock-matrix  regenerate the per-corner constraints/ files (MATRIX=... as above)"
	@echo "  make clean     remove caches and build artefacts (distclean also removes $(VENV))"
	@echo "Variables: PYTHON=$(PYTHON) PYTEST_ARGS=$(PYTEST_ARGS) TEST_WORKERS=$(TEST_WORKERS)"

check-python:
	@command -v "$(PYTHON)" >/dev/null 2>&1 || { \
	  echo "error: '$(PYTHON)' not found; install Python 3.11+ or run 'make PYTHON=/path/to/python3.11'" >&2; exit 1; }
	@"$(PYTHON)" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "error: Python 3.11+ is required, but $(PYTHON) is $$("$(PYTHON)" -c 'import platform; print(platform.python_version())')." >&2; \
	  echo "       Run 'make PYTHON=/path/to/python3.11 ...'." >&2; exit 1; }

# The interpreter of the venv; created once.
$(BIN)/python:
	@$(MAKE) --no-print-directory check-python
	$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' || { \
	  echo "error: $(VENV) does not run Python 3.11+; remove it ('make distclean') and retry." >&2; exit 1; }

# (Re)installs when pyproject.toml or constraints.txt changes.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	@touch $@

venv install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),--numprocesses=$(TEST_WORKERS) --dist=loadfile) $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory docs

# The documentation site, strict: a broken link or a missing page fails the build.
docs: $(STAMP)
	@# No -q here: with mkdocs 1.6 it drops warnings before --strict can count them.
	$(BIN)/mkdocs build --strict -d .cache/site
	$(BIN)/python scripts/check_site.py .cache/site

# The release artefacts: sdist and wheel, built in isolation, then checked the way an index would.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*
	$(BIN)/check-wheel-contents dist/*.whl

# Every supported Airflow minor (newest patch) on every supported Python: a fresh venv per corner
# installs the built wheel, pinned by constraints/airflow-<minor>-py<python>.txt, and runs the whole
# suite from a copy of tests/ outside the checkout. Corners run one after another.
test-matrix: dist
	$(BIN)/python scripts/matrix.py run $(MATRIX) --workers $(MATRIX_WORKERS) --jobs $(MATRIX_JOBS) --pytest-args="$(PYTEST_ARGS)"

lock-matrix: check-python
	$(PYTHON) scripts/matrix.py lock $(MATRIX)

# The deployment test (tests/deployment): only the tests marked 'deployment', which plain
# 'make test' collects and skips. Component logs of a failure are printed with the report.
# EXECUTOR=celery runs the Celery deployment instead (tests/deployment/test_celery.py: PostgreSQL,
# Redis, two Celery workers; installs redis-server and the Celery provider when missing).
test-deployment: $(STAMP)
	SZ_DEPLOYMENT_DB=$(DEPLOYMENT_DB) SZ_DEPLOYMENT_EXECUTOR=$(EXECUTOR) $(BIN)/pytest -q -m deployment \
	  $(if $(filter celery,$(EXECUTOR)),tests/deployment/test_celery.py,tests/deployment) $(PYTEST_ARGS)

# The UI test (tests/ui): only the tests marked 'ui'; 'make test' collects and skips them.
test-ui: $(STAMP)
	$(BIN)/pytest -q -m ui tests/ui $(PYTEST_ARGS)

# The RFC 6455 conformance run (tests/conformance): only the tests marked 'conformance'. The
# fuzzing server's virtualenv (Python 2.7) and one per websockets release are made under
# .cache/conformance the first time.
test-conformance: $(STAMP)
	$(BIN)/pytest -q -m conformance tests/conformance $(PYTEST_ARGS)

# The demos' usage lines and hints name the make command (the same modules run from an installed
# package as 'python -m ...').
demo: $(STAMP)
	SYSTEMZERO_DEMO_MAKE="make demo" $(BIN)/python -m airflow_provider_systemzero.demo $(DEMO_ARGS)

review-demo: $(STAMP)
	SYSTEMZERO_DEMO_MAKE="make review-demo" $(BIN)/python -m airflow_provider_systemzero.review_demo $(DEMO_ARGS)

emulator: $(STAMP)
	$(BIN)/systemzero-emulator --api-key emulator-key $(EMULATOR_ARGS)

bench: $(STAMP)
	@if [ -d benchmarks ]; then \
	  echo "$(BIN)/python -m benchmarks $(BENCH_ARGS)"; \
	  $(BIN)/python -m benchmarks $(BENCH_ARGS); \
	else \
	  echo "error: no benchmarks/ directory" >&2; exit 1; \
	fi

# Resolves the newest versions allowed by pyproject.toml in a throwaway venv, then freezes them.
lock: check-python
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet -e ".[$(EXTRAS)]" $(foreach p,$(PRODUCTION),'$(p)')
	{ \
	  echo "# Reproducible lock of every package the project installs: runtime plus the test and docs extras,"; \
	  echo "# resolved together with the production stack ($(PRODUCTION)),"; \
	  echo "# which the deployment test installs from it and 'make install' does not."; \
	  echo "# Used as 'pip install -c constraints.txt -e \".[$(EXTRAS)]\"' by 'make install'."; \
	  echo "# Regenerate with 'make lock' (resolves pyproject.toml unconstrained in a throwaway venv, then"; \
	  echo "# 'pip freeze --exclude-editable'). Python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version())')."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable; \
	} > constraints.txt.new
	mv constraints.txt.new constraints.txt
	rm -rf $(LOCK_VENV)
	@echo "constraints.txt regenerated; run 'make test' to install and check it."

clean:
	rm -rf .cache .pytest_cache .ruff_cache .hypothesis site build dist *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
