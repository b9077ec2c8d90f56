# Two entry points a new machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck unit test-dynamodb-local coverage bench bench-functions clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m idempotency_middleware demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(VENV)/bin/pytest -q

# The store contract suite against Amazon's DynamoDB Local (Java, in a private network
# namespace); prints "DynamoDB Local: SKIPPED (reason)" where Java or unshare is missing.
test-dynamodb-local: $(STAMP)
	@bash scripts/dynamodb-local.sh

# Branch coverage of the package over the DynamoDB Local run and the whole suite, threads
# and subprocesses included ([tool.coverage] in pyproject.toml): the suite runs under
# `coverage run`; the DynamoDB Local pytest (in its own namespaces) starts coverage through
# COVERAGE_PROCESS_START and coverage's .pth file. One report at the end; below fail_under
# it fails. A failing suite fails make with pytest's status, after the report.
COVERAGE := $(VENV)/bin/coverage
COVERAGE_DATA := $(CURDIR)/.cache/coverage/data

coverage: $(STAMP)
	@mkdir -p $(dir $(COVERAGE_DATA))
	$(COVERAGE) erase
	COVERAGE_PROCESS_START=$(CURDIR)/pyproject.toml COVERAGE_FILE=$(COVERAGE_DATA) \
	  bash scripts/dynamodb-local.sh
	@status=0; \
	$(COVERAGE) run -m pytest -q || status=$$?; \
	$(COVERAGE) combine --quiet && $(COVERAGE) report || { [ $$status -ne 0 ] || status=2; }; \
	exit $$status

test: lint typecheck coverage

BENCH_STAMP := $(VENV)/.bench-installed

# Benchmark-only dependencies (the four peers, pyinstrument). A peer that cannot be
# installed is skipped with a warning; its row in the overhead table says so.
$(BENCH_STAMP): $(STAMP) benchmarks/requirements.txt
	@if $(PY) -m pip install --quiet -r benchmarks/requirements.txt; then touch $@; else \
	  for req in $$(grep -v '^[[:space:]]*#' benchmarks/requirements.txt); do \
	    $(PY) -m pip install --quiet "$$req" || echo "bench: could not install $$req; its table row will say so"; \
	  done; \
	fi

bench: $(BENCH_STAMP)
	$(PY) -m benchmarks.run_all

# idempotent against Powertools' idempotent_function, both on Amazon's DynamoDB Local.
bench-functions: $(BENCH_STAMP)
	bash scripts/dynamodb-local.sh --exec $(PY) -m benchmarks.functions

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .cache/coverage
