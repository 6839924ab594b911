# pgstage — `make demo` and `make test` work on a fresh machine (Python 3.11+ only).
# DATABASE_URL unset: an embedded PostgreSQL is started under .data/ (pgserver).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 2
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: help install test test-fast nemesis e2e screenshots lint format demo worker run shell migrate stop-db bench clean

## Every target, one line each (the "## " note on its line).
help:  ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z0-9-]+):.*## (.*)/\1\t\2/' | expand -t 14


$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

## A random SECRET_KEY for this checkout (the settings read .env; the environment wins).
## With DEBUG off the built-in development key is refused (system check site.E001).
.env:
	@echo "SECRET_KEY=$$($(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))')" > .env
	@echo "wrote .env: a random SECRET_KEY for this checkout"

install: $(STAMP) .env  ## create .venv with the project and its dev tools, and a .env

## The embedded PostgreSQL (DATABASE_URL unset): the test targets start it when it is not
## running and stop it afterwards; one that was running already is left running.
PGDATA_DIR = $${PGSTAGE_DATA_DIR:-.data}/pg
EMBEDDED_START = $(BIN)/python -c 'import sys; from pathlib import Path; \
	from config.embedded import embedded_database_url; embedded_database_url(Path(sys.argv[1]))'
define with_embedded
	@started=; if [ -z "$$DATABASE_URL" ] && ! { [ -f $(PGDATA_DIR)/postmaster.pid ] && \
		kill -0 $$(head -1 $(PGDATA_DIR)/postmaster.pid) 2>/dev/null; }; then \
		echo "starting the embedded PostgreSQL under $(PGDATA_DIR) for the tests"; \
		$(EMBEDDED_START) $(PGDATA_DIR) && started=1; fi; \
	$(1); status=$$?; \
	if [ -n "$$started" ]; then kill -INT $$(head -1 $(PGDATA_DIR)/postmaster.pid) && \
		echo "embedded PostgreSQL stopped (the tests started it)"; fi; \
	exit $$status
endef

## The whole suite, slow fault-injection tests included (they run real workers);
## the browser tests need Chromium and run in `make e2e`.
test: install  ## the whole suite but the browser tests, slow fault-injection tests included
	$(call with_embedded,$(BIN)/python -m pytest --create-db -n $(PYTEST_WORKERS) --dist loadgroup -m "not e2e")

## Everything but the slow fault-injection tests.
test-fast: install  ## the suite without the slow and browser tests
	$(call with_embedded,$(BIN)/python -m pytest --create-db -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow and not e2e")

## The nemesis (tests/nemesis): random faults drawn from a seed against real workers, a
## recorded history and a checker. `make nemesis SEED=… SECONDS=…` replays a seed (the
## command a failing run prints adds KINDS=…, SCALE=…, NEW_TASK=1); without SEED, a new
## one. Fault durations are the full ranges (SCALE=1); the history's path is printed.
SECONDS ?= 600
SCALE ?= 1
KINDS ?=
NEW_TASK ?=
nemesis: install  ## a long randomized fault run (SEED=… SECONDS=… replays a seed)
	$(BIN)/python -m tests.nemesis.runner $(if $(SEED),--seed $(SEED)) --seconds $(SECONDS) \
		--scale $(SCALE) $(if $(KINDS),--kinds $(KINDS)) $(if $(NEW_TASK),--new-task)

## Browser tests: Playwright drives Debian's Chromium, installed here when missing
## (needs root, as on CI); screenshots land in test-output/.
e2e: install  ## the browser tests (installs Debian's Chromium when missing)
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python -m pytest -m e2e

## The browser tests again, writing their screenshots into docs/images/ (the README's).
screenshots:  ## the browser tests, writing their screenshots into docs/images/
	E2E_SCREENSHOTS=$(CURDIR)/docs/images $(MAKE) e2e

## mypy (with django-stubs) type-checks the framework, configured in pyproject.toml.
lint: install  ## ruff check, format check and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install  ## fix what ruff can and format the code
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

migrate: install  ## apply the database migrations
	$(BIN)/python manage.py migrate --noinput -v 0

demo: migrate  ## seed two tenants and run inquiries and analyses through real workers
	$(BIN)/python manage.py demo

worker: migrate  ## run one worker
	$(BIN)/python manage.py procrastinate worker

## The production web server (gunicorn, static files by whitenoise) and a supervised
## worker: `make run HOST=0.0.0.0 PORT=9000`.
run: migrate  ## the web server and a supervised worker (HOST=, PORT=)
	$(BIN)/python manage.py run_all --host $(HOST) --port $(PORT)

## A shell whose python is the project's: run `python manage.py …` there.
shell: install  ## a shell whose python is the project's
	@echo "python is $(CURDIR)/$(BIN)/python; run 'python manage.py help' (exit to leave)"
	@PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" $${SHELL:-/bin/sh}

## Every benchmark scenario, side by side with plain procrastinate (it migrates its own
## database: DATABASE_URL, or pgstage_bench on the embedded server); writes
## bench/results/latest.json and docs/benchmarks.md. BENCH_ARGS=--quick for development.
bench: install  ## every benchmark scenario beside plain procrastinate
	$(BIN)/python -m bench $(BENCH_ARGS)

stop-db:  ## stop the embedded PostgreSQL under .data/
	@if [ -f $(PGDATA_DIR)/postmaster.pid ]; then \
		kill -INT $$(head -1 $(PGDATA_DIR)/postmaster.pid) && echo "embedded PostgreSQL stopped"; \
	else echo "embedded PostgreSQL is not running"; fi

clean:  ## remove .venv, caches and test-output/
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache test-output
