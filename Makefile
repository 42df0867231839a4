# Every target CI runs lives here. `make test` is what .ci/run calls.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint pytest demo soak bench screenshots clean

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

# Long crash-loop, concurrency and property runs: the same tests with bigger counts.
soak: $(STAMP)
	SYNCD_CRASH_ITERATIONS=200 SYNCD_CONCURRENT_WRITERS=200 SYNCD_PROPERTY_EXAMPLES=500 \
		$(PY) -m pytest -q tests/local_store/test_crash.py tests/local_store/test_concurrency.py \
		tests/local_store/test_apply.py
	SYNCD_CRASH_ITERATIONS=40 SYNCD_STATEFUL_EXAMPLES=100 SYNCD_STATEFUL_STEPS=50 \
		SYNCD_PROPERTY_EXAMPLES=300 SYNCD_SYNC_PASSES=20 SYNCD_BOOTSTRAP_ROWS=3000 \
		$(PY) -m pytest -q tests/sync/test_stateful.py tests/sync/test_crash_pull.py \
		tests/sync/test_semantics.py
	SYNCD_HUB_CONCURRENCY_RUNS=20 $(PY) -m pytest -q tests/hub/test_pg_processes.py

bench: $(STAMP)
	$(PY) bench/store.py
	$(PY) bench/recall_eval.py --by-kind
	$(PY) bench/recall_speed.py
	$(PY) bench/embed.py
	$(PY) bench/http.py
	$(PY) bench/sync.py
	$(PY) bench/hub.py

# The web page's four views in a real headless Chromium (the browser tests), saved for the README.
screenshots: $(STAMP)
	SYNCD_SCREENSHOT_DIR=docs/screenshots $(PY) -m pytest -q tests/web

demo: $(STAMP)
	$(PY) -m syncd demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
