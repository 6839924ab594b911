# pgstage — `make demo` and `make test` work on a fresh machine (Python 3.11+ only).
# DATABASE_URL unset: an embedded PostgreSQL is started under .data/ (pgserver).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_WORKERS ?= 2
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install test test-fast nemesis e2e screenshots lint format demo worker run shell migrate stop-db bench clean

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

install: $(STAMP) .env

## The whole suite, slow fault-injection tests included (they run real workers);
## the browser tests need Chromium and run in `make e2e`.
test: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not e2e"

## Everything but the slow fault-injection tests.
test-fast: install
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow and not e2e"

## The nemesis (tests/nemesis): random faults drawn from a seed against real workers, a
## recorded history and a checker. `make nemesis SEED=… SECONDS=…` replays a seed (the
## command a failing run prints adds KINDS=…, SCALE=…, NEW_TASK=1); without SEED, a new
## one. Fault durations are the full ranges (SCALE=1); the history's path is printed.
SECONDS ?= 600
SCALE ?= 1
KINDS ?=
NEW_TASK ?=
nemesis: install
	$(BIN)/python -m tests.nemesis.runner $(if $(SEED),--seed $(SEED)) --seconds $(SECONDS) \
		--scale $(SCALE) $(if $(KINDS),--kinds $(KINDS)) $(if $(NEW_TASK),--new-task)

## Browser tests: Playwright drives Debian's Chromium, installed here when missing
## (needs root, as on CI); screenshots land in test-output/.
e2e: install
	test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)
	$(BIN)/python -m pytest -m e2e

## The browser tests again, writing their screenshots into docs/images/ (the README's).
screenshots:
	E2E_SCREENSHOTS=$(CURDIR)/docs/images $(MAKE) e2e

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

migrate: install
	$(BIN)/python manage.py migrate --noinput -v 0

demo: migrate
	$(BIN)/python manage.py demo

worker: migrate
	$(BIN)/python manage.py procrastinate worker

## The production web server (gunicorn, static files by whitenoise) and a supervised
## worker: `make run HOST=0.0.0.0 PORT=9000`.
run: migrate
	$(BIN)/python manage.py run_all --host $(HOST) --port $(PORT)

## A shell whose python is the project's: run `python manage.py …` there.
shell: install
	@echo "python is $(CURDIR)/$(BIN)/python; run 'python manage.py help' (exit to leave)"
	@PATH="$(CURDIR)/$(BIN):$$PATH" VIRTUAL_ENV="$(CURDIR)/$(VENV)" $${SHELL:-/bin/sh}

## Every benchmark scenario, side by side with plain procrastinate (it migrates its own
## database: DATABASE_URL, or pgstage_bench on the embedded server); writes
## bench/results/latest.json and docs/benchmarks.md. BENCH_ARGS=--quick for development.
bench: install
	$(BIN)/python -m bench $(BENCH_ARGS)

stop-db:
	@if [ -f .data/pg/postmaster.pid ]; then \
		kill -INT $$(head -1 .data/pg/postmaster.pid) && echo "embedded PostgreSQL stopped"; \
	else echo "embedded PostgreSQL is not running"; fi

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-output
