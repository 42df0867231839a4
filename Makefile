# Every target CI runs lives here. `make test` is what .ci/run calls.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint pytest demo soak bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check protocol local_store syncd tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

pytest: $(STAMP)
	$(PY) -m pytest -q

test: lint pytest

# Long crash-loop and concurrency runs: the same tests with bigger counts.
soak: $(STAMP)
	SYNCD_CRASH_ITERATIONS=200 SYNCD_CONCURRENT_WRITERS=200 $(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) bench/store.py

demo: $(STAMP)
	$(PY) -m syncd demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
