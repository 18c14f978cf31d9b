# Every target bootstraps .venv on a fresh machine, so `make test` works on a clean clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test check lint format typecheck pytest bench soak clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: $(STAMP)
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest

check: lint typecheck

test: check pytest

bench: $(STAMP)
	$(BIN)/python bench/service_bench.py

# Larger property-test runs; e.g. `make soak EXAMPLES=5000 STEPS=100`.
EXAMPLES ?= 2000
STEPS ?= 80
soak: $(STAMP)
	MOONRUN_STATEFUL_EXAMPLES=$(EXAMPLES) MOONRUN_STATEFUL_STEPS=$(STEPS) \
		$(BIN)/pytest -p no:cacheprovider tests/test_stateful.py -x

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
