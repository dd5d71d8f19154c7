# make demo: create .venv, install ledgerlm, run the whole pipeline on the built-in corpus.
# make test: the same venv plus dev extras, then lint and the test suite.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of PyTorch; override e.g. `make demo TORCH=torch==2.14.1`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install demo test test-slow lint bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/ledgerlm demo

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

test: lint
	$(BIN)/python -m pytest

test-slow: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -m slow

clean:
	rm -rf $(VENV) ledgerlm-work .pytest_cache .ruff_cache
