# `make test` and `make serve` each set up everything they need on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: test lint unit serve bench bench-normalize clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.deps-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -e '.[test,lint]'
	touch $@

lint: $(VENV)/.deps-test
	$(PY) -m ruff check proxy engine_launcher tests bench
	$(PY) -m ruff format --check proxy engine_launcher
	$(PY) -m mypy

unit: $(VENV)/.deps-test
	$(PY) -m pytest -q

test: lint unit

bench: $(VENV)/.deps-test
	$(PY) bench/proxy_overhead.py

bench-normalize: $(VENV)/.deps-test
	$(PY) bench/normalize_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
