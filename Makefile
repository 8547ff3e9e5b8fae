# Riverbed build entry points. `make run` and `make test` are all a newcomer needs.

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
# Extras `make test` installs into the venv (comma-separated); `make run` needs none.
EXTRAS ?= dev,spark
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (0: in this process, one test at a time).
TEST_WORKERS ?= 3
# `make run PORT=1884` listens on 127.0.0.1:1884; `make run ARGS="..."` adds options to
# `riverbed serve`. With --config in ARGS the file decides who may connect, so
# --allow-anonymous is left out.
# The admin HTTP API listens on 127.0.0.1:$(HTTP_PORT) (docs/http.md; `HTTP_PORT=` turns it
# off, as do --http in ARGS or a config file, which then decide).
PORT ?=
ARGS ?=
HTTP_PORT ?= 8080
HTTP_ADDRESS = $(if $(HTTP_PORT),$(if $(findstring --config,$(ARGS))$(findstring --http,$(ARGS)),,127.0.0.1:$(HTTP_PORT)))
SERVE_ARGS = $(strip $(if $(findstring --config,$(ARGS)),,--allow-anonymous) \
	$(if $(PORT),--mqtt 127.0.0.1:$(PORT)) $(if $(HTTP_ADDRESS),--http $(HTTP_ADDRESS)) $(ARGS))

# ruff fails on a path that does not exist, so lint only the directories that do.
LINT_PATHS := $(wildcard src tests bench examples)

# One stamp per set of extras installed: the core (the broker's own dependencies) for
# `make run`, EXTRAS on top for everything else. Installing the extras installs the
# core too, so their rule stamps both; either order of `make run` and `make test`
# installs only what the venv lacks.
CORE_STAMP = $(VENV)/.installed-core
EXTRAS_STAMP = $(VENV)/.installed-$(EXTRAS)

.PHONY: venv venv-core run test interop-deps lint fmt dashboard-assets bench-storage bench-spark bench-mqtt bench-competing clean

venv: $(EXTRAS_STAMP)

venv-core: $(CORE_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(CORE_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e .
	touch $@

$(EXTRAS_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[$(EXTRAS)]'
	touch $@ $(CORE_STAMP)

# The broker on 127.0.0.1:1883 (anonymous clients allowed, messages in
# ./riverbed-data) and its admin HTTP API on 127.0.0.1:8080; Ctrl-C stops it.
run: venv-core
	@$(PY) -m compileall -q src
	$(if $(HTTP_ADDRESS),@echo "dashboard: http://$(HTTP_ADDRESS)/  admin API: http://$(HTTP_ADDRESS)/api/v1 (docs/dashboard.md, docs/http.md)")
	$(VENV)/bin/riverbed serve $(SERVE_ARGS)

# MQTT.js for the interop tests (tests/interop/js), from its package-lock.json: npm runs
# again only when the lock file changes (npm ci rewrites node_modules/.package-lock.json).
# Without npm the MQTT.js tests skip, and fail in CI (.ci/run installs Node and npm).
INTEROP_JS = tests/interop/js
INTEROP_JS_STAMP = $(INTEROP_JS)/node_modules/.package-lock.json

interop-deps: $(INTEROP_JS_STAMP)

$(INTEROP_JS_STAMP): $(INTEROP_JS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd $(INTEROP_JS) && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline && touch node_modules/.package-lock.json; \
	else \
		echo "npm not found: the MQTT.js interop tests will be skipped (in CI they fail)"; \
	fi

# Bytecode first: where PYTHONDONTWRITEBYTECODE is set (as in the shells this
# project is developed in) no process caches the modules it compiles, and every
# broker, command and Spark worker a test starts would compile Riverbed's
# modules again (half of a broker's start). Python still reads the .pyc files
# compileall writes.
#
# Each line stops make at its first failure. A test worker that dies (a crash,
# an exit) ends the run at once, named: xdist's replacement of a crashed worker
# under --dist loadgroup hangs (seen: a CI run timed out at 98%).
test: venv interop-deps
	$(PY) -m compileall -q $(LINT_PATHS)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup --max-worker-restart=0 $(PYTEST_ARGS)

# Fix what ruff can fix by itself (imports, formatting).
fmt: venv
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

# The dashboard's third-party files (uPlot and its licence) from npm into the package, in
# a directory named with their version (browsers cache them for a year); the copies are
# committed, so installing or running Riverbed needs no Node (docs/dashboard.md).
VENDOR = src/riverbed/http/static/vendor
dashboard-assets:
	cd dashboard && npm ci --ignore-scripts --no-audit --no-fund
	rm -rf $(VENDOR)
	version=$$(node -p 'require("./dashboard/node_modules/uplot/package.json").version') && \
	mkdir -p $(VENDOR)/uplot-$$version && \
	cp dashboard/node_modules/uplot/dist/uPlot.iife.min.js dashboard/node_modules/uplot/dist/uPlot.min.css \
		dashboard/node_modules/uplot/LICENSE $(VENDOR)/uplot-$$version/

bench-storage: venv
	$(PY) bench/storage.py

bench-spark: venv
	$(PY) bench/spark.py

# Needs Debian's mosquitto and an amqtt venv; see docs/benchmarks.md.
bench-mqtt: venv
	$(PY) bench/mqtt.py

# Needs depeche-db 0.13.1 in its own venv (/tmp/depeche-venv); see docs/benchmarks.md.
bench-competing: venv
	$(PY) bench/competing.py

clean:
	rm -rf $(VENV) build dist .mypy_cache .ruff_cache .hypothesis .pytest_cache .import_linter_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -name '*.egg-info' -type d -prune -exec rm -rf {} +
