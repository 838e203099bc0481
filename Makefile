# schemaless developer entry points.  Each target works on a fresh Debian machine with
# nothing installed by hand, as root or through sudo.
#
#   make test PYTEST_ARGS='tests/test_local.py -x'     make bench BENCH_ARGS='--entities 100000'

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
TEST_JOBS ?= 2
BENCH_ARGS ?=
BACKFILL_ARGS ?= --entities 200000
TIMELINE_ARGS ?= --scale 0.05
LAYOUT_ARGS ?= --per-server 8,64 --rounds 5
BENCH_SKIP ?=
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
APT_PACKAGES := mariadb-server mariadb-client libmariadb-dev pkg-config gcc python3-dev python3-venv

# Is a program there? mariadbd lives in /usr/sbin, which a user's PATH may lack.
HAVE = have() { command -v "$$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$$1" ]; }

.PHONY: help deps venv test demo lint fmt bench dist local-up local-down local-status clean

help:
	@echo "targets: deps venv test demo lint fmt bench dist local-up local-down local-status clean"
	@echo "variables: PYTEST_ARGS, TEST_JOBS (pytest processes, 0: one), BENCH_ARGS, BACKFILL_ARGS, TIMELINE_ARGS, LAYOUT_ARGS, BENCH_SKIP,"
	@echo "  PYTHON (default python3)"

# MariaDB server and client, and what building mysqlclient needs; apt only if missing.
deps:
	@$(HAVE); missing=""; \
	have mariadbd || missing="$$missing mariadbd"; \
	have mariadb-install-db || missing="$$missing mariadb-install-db"; \
	{ have mariadb_config || have mysql_config; } || missing="$$missing mariadb_config"; \
	have pkg-config || missing="$$missing pkg-config"; \
	have gcc || missing="$$missing gcc"; \
	$(PYTHON) -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	$(PYTHON) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
		|| missing="$$missing python3-dev"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	echo "deps: missing:$$missing; installing Debian packages"; \
	$(SUDO) apt-get update -q; \
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		$(APT_PACKAGES) \
		|| echo "deps: apt-get install reported an error (often the packaged service failing to start here); checking what got installed"; \
	have mariadbd || { echo "deps: mariadbd is still missing" >&2; exit 1; }; \
	have mariadb-install-db || { echo "deps: mariadb-install-db is still missing" >&2; exit 1; }; \
	{ have mariadb_config || have mysql_config; } || { echo "deps: mariadb_config is still missing" >&2; exit 1; }; \
	echo "deps: ok"

venv: $(STAMP)

# Re-installed only when pyproject.toml changes (or the venv is missing or broken).
$(STAMP): pyproject.toml cleaner/_rows.c
	@if ! $(PY) -m pip --version >/dev/null 2>&1; then \
		echo "venv: creating $(VENV)"; rm -rf $(VENV); $(PYTHON) -m venv $(VENV); \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

test: deps venv
	$(PY) -m pytest -n $(TEST_JOBS) $(PYTEST_ARGS)

demo: deps venv
	$(PY) -m schemaless.demo

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	gcc -fsyntax-only -std=c11 -Wall -Wextra -Werror \
		-I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" cleaner/_rows.c
	gcc -fsyntax-only -std=c11 -Wall -Wextra -Werror bench/delayproxy.c

fmt: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Every benchmark, then docs/benchmarks.md's tables and plots (docs/results/, README's
# headline) from their results.  BENCH_SKIP='backfill timeline layout': those keep
# their blocks.  The backfill runs apart, on more entities (at 20,000 it is all start-up).
bench: deps venv
	$(PY) -m bench --dump $(BENCH_ARGS)
	$(if $(filter backfill,$(BENCH_SKIP)),,$(PY) -m bench --backfill --ops get --threads 1 --no-codec $(BACKFILL_ARGS))
	$(if $(filter timeline,$(BENCH_SKIP)),,$(PY) -m bench.timeline $(TIMELINE_ARGS))
	$(if $(filter layout,$(BENCH_SKIP)),,$(PY) -m bench.layout $(LAYOUT_ARGS))
	$(PY) -m bench.page

# The release files (sdist and wheel) in dist/, checked as PyPI would.
dist: venv
	rm -rf dist
	$(PY) -m build --no-isolation --outdir dist .
	$(PY) -m twine check --strict dist/*

# The default local cluster: $$SCHEMALESS_LOCAL_DIR or ./.schemaless-local.
local-up: deps venv
	@$(PY) -c 'import logging; logging.basicConfig(level=logging.INFO, format="%(message)s"); \
		from schemaless.local import LocalCluster; c = LocalCluster().up(); \
		print("servers:", " ".join(c.addresses)); print("option file:", c.option_file)'

local-down: venv
	@$(PY) -c 'import logging; logging.basicConfig(level=logging.INFO, format="%(message)s"); \
		from schemaless.local import LocalCluster; LocalCluster().down()'

local-status: venv
	@$(VENV)/bin/schemaless local status || [ $$? -eq 3 ]  # 3: none in the folder, said

# Not the local cluster data (.schemaless-local/, .pytest-cluster/).
clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
