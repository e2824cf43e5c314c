# oomscope: `make help` lists the targets. Everything runs from ./.venv, created on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
export PORT

.DEFAULT_GOAL := help
.PHONY: help install static migrate run test lint typecheck bench reliability diffbench mutation clean

help: ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt requirements-dev.txt client/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -e ./client  # README: python -m oomscope_client upload ...
	@touch $@

install: $(VENV)/.installed ## create .venv, install the pinned requirements, build the compiled reader and replay loops
	@# The C reader (analysis/_snapread.c) and replays (analysis/allocator/_replaycore.c, _policycore.c) with the
	@# machine's compiler and zlib; without them the Python reader and loops run.
	@$(PY) setup.py -q build_ext --inplace >/dev/null 2>var-build-ext.log \
	  && rm -f var-build-ext.log \
	  || echo "oomscope: the compiled reader and replay loops were not built (no C compiler, Python headers or zlib.h; see var-build-ext.log): the Python ones run"

static: install ## copy BokehJS into static/bokeh/<version>/ and collect static files under var/
	$(PY) scripts/copy_bokehjs.py
	$(PY) manage.py collectstatic --noinput --verbosity 0

migrate: install ## apply database migrations (SQLite var/db.sqlite3 unless DATABASE_URL is set)
	$(PY) manage.py migrate --noinput

run: migrate static ## Redis + Celery worker (with beat) + the site on http://127.0.0.1:$(PORT), supervised; Ctrl-C stops all
	@bash scripts/run.sh

test: install ## the whole suite (tests/); PostgreSQL when DATABASE_URL is set, a private Redis unless REDIS_URL is
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install ## ruff lint
	$(VENV)/bin/ruff check .

typecheck: install ## mypy --strict on analysis/ and webapp/ (django-stubs)
	$(VENV)/bin/mypy

mutation: install ## mutmut on the core rules, each module against its own tests, and the hand mutants with scripts/access_mutants.py's (not part of `make test`)
	$(PY) scripts/mutation.py $(MUTATION_ARGS)

bench: install ## reader/analysis benchmark on ../shared/snapshots/huge_all_stacks.pickle.gz
	$(PY) scripts/bench.py

RELIABILITY_PG ?= postgres://postgres@127.0.0.1:5432/harden_rel
# RELIABILITY_ARGS=--attacks: only issue 22's attacks (3-4 min); --only NAME...: some scenarios.
# No PostgreSQL at $(RELIABILITY_PG): that run says so and is skipped.
reliability: static ## load, fault and attack runs against real sites (SQLite, then $(RELIABILITY_PG)) + the long reader fuzz; minutes
	$(PY) scripts/reliability.py --postgres "$(RELIABILITY_PG)" $(RELIABILITY_ARGS)
	OOMSCOPE_FUZZ_SECONDS=$${OOMSCOPE_FUZZ_SECONDS:-300} $(PY) -m pytest tests/webapp/test_hardening_fuzz.py -q -p no:cacheprovider
	OOMSCOPE_ORDER_FUZZ_SECONDS=$${OOMSCOPE_ORDER_FUZZ_SECONDS:-300} $(PY) -m pytest tests/analysis/test_event_order.py -q -p no:cacheprovider -k fuzz

diffbench: install ## the allocator model against real runs (tests/fixtures/captures and tests/fixtures): table and totals
	$(PY) scripts/diffbench.py

clean: ## remove .venv and var/ (database, uploads, logs) and the built reader
	rm -rf $(VENV) var build analysis/_snapread*.so analysis/allocator/_replaycore*.so var-build-ext.log
