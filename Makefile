# One entry point for humans and CI (.ci/run calls `make test`).
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Lint only the directories that exist (chaos/ and bench/ may not yet).
LINT_DIRS := $(wildcard deadman tests chaos bench examples)

# First interpreter that is Python >= 3.11 (pyenv shims for missing versions fail the
# probe and are skipped). Recursive (?=), so it is only probed when a venv is created.
PYTHON ?= $(shell for p in python3.11 python3.12 python3.13 python3; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& { echo "$$p"; break; }; done)

.PHONY: help venv install check fmt test demo clean db-start db-stop

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  %-10s %s\n", $$1, $$2}'

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "error: Python >= 3.11 not found (set PYTHON=...)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# Re-installs only when pyproject.toml changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -q -e '.[dev]'
	touch $@

venv: install ## Same as install
install: $(STAMP) ## Create .venv and install the package with dev extras

check: install ## Lint, format check and type check
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy

fmt: install ## Format and auto-fix lint
	$(BIN)/ruff format $(LINT_DIRS)
	$(BIN)/ruff check --fix $(LINT_DIRS)

# pytest exits 5 when it collects nothing; that fails the target like any failure.
# Two pytest-xdist workers (DECISIONS 43; three were tried and undone, 91), each with
# its own throwaway cluster.
TEST_WORKERS ?= 2
test: check browser-deps pgbouncer-deps faketime-deps ## check, then the whole test suite
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal

demo: install ## Start a private Postgres and run the demo
	$(BIN)/deadman demo

db-start: install ## Start the private demo Postgres (.deadman/)
	$(BIN)/deadman devdb start

db-stop: install ## Stop the private demo Postgres
	$(BIN)/deadman devdb stop

clean: ## Stop the demo Postgres, remove .venv, .deadman and caches
	-@test -x $(BIN)/deadman && $(BIN)/deadman devdb remove
	rm -rf $(VENV) .deadman .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# Benchmarks: a separate venv (.venv-bench) with the package plus the pinned peers
# (bench/requirements.txt); the peers are never runtime dependencies of deadman.
BENCH_BIN := .venv-bench/bin
BENCH_STAMP := .venv-bench/.installed
.PHONY: bench bench-quick

$(BENCH_STAMP): pyproject.toml bench/requirements.txt
	@test -x $(BENCH_BIN)/python || { test -n "$(PYTHON)" && $(PYTHON) -m venv .venv-bench; }
	$(BENCH_BIN)/pip install --disable-pip-version-check -q -e . -r bench/requirements.txt
	touch $@

bench: $(BENCH_STAMP) ## Full benchmarks (peers, HTTP, 1M-job scale, 10-min retention; ~60 min on 2 cores): BENCHMARKS.md
	$(BENCH_BIN)/python -m bench.run

bench-quick: $(BENCH_STAMP) ## Benchmark smoke run of every phase (< 5 min), written under bench/results/
	$(BENCH_BIN)/python -m bench.run --quick

# The dashboard's browser test drives Debian's chromium (never a downloaded browser).
# Installed only when missing, and only where we can: root with apt-get.
.PHONY: browser-deps
browser-deps: ## Install chromium for the dashboard's browser test (root + apt-get only)
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "browser-deps: /usr/bin/chromium missing and cannot apt-get it (not root?)" >&2; fi

# deploy/docker-compose.yml for real, with images built locally (deploy/test_compose.sh
# says how); minutes, so not part of `make test`. Bounded: TERM after the limit, which
# still tears the stack down.
COMPOSE_TEST_LIMIT_S ?= 1200
.PHONY: test-compose
test-compose: install ## Bring up deploy/docker-compose.yml and check it (docker; root installs it)
	HOST_PYTHON=$(BIN)/python timeout -k 120 $(COMPOSE_TEST_LIMIT_S) deploy/test_compose.sh

# The many-hosts tests (tests/acceptance/test_hosts.py, chaos --hosts) run one host's
# worker under libfaketime (Debian's faketime package). Installed only when missing.
.PHONY: faketime-deps
faketime-deps: ## Install libfaketime for the many-hosts tests (root + apt-get only)
	@if [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; \
	else echo "faketime-deps: libfaketime missing and cannot apt-get it (not root?)" >&2; fi

# The PgBouncer tests (tests/pgbouncer/) start Debian's pgbouncer in transaction mode in
# front of the test cluster. Installed only when missing, and only where we can.
.PHONY: pgbouncer-deps
pgbouncer-deps: ## Install pgbouncer for the PgBouncer tests (root + apt-get only)
	@if [ -x /usr/sbin/pgbouncer ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer; \
	else echo "pgbouncer-deps: /usr/sbin/pgbouncer missing and cannot apt-get it (not root?)" >&2; fi
