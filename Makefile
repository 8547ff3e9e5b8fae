# Riverbed build entry points. `make run` and `make test` are all a newcomer needs.

PYTHON ?= python3
VENV ?= .venv
PY = $(VENV)/bin/python
# Extras installed into the venv; add more comma-separated (e.g. dev,spark).
EXTRAS ?= dev,spark
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (0: in this process, one test at a time).
TEST_WORKERS ?= 3

# ruff fails on a path that does not exist, so lint only the directories that do.
LINT_PATHS := $(wildcard src tests bench examples)

.PHONY: venv run test lint fmt bench-storage bench-spark bench-mqtt bench-competing clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[$(EXTRAS)]'
	touch $@

# The broker on 127.0.0.1:1883 (anonymous clients allowed); Ctrl-C stops it.
run: venv
	$(VENV)/bin/riverbed serve --allow-anonymous

# Each line stops make at its first failure.
test: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Fix what ruff can fix by itself (imports, formatting).
fmt: venv
	$(VENV)/bin/ruff check --fix $(LINT_PATHS)
	$(VENV)/bin/ruff format $(LINT_PATHS)

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
