# make demo: create .venv, install ledgerlm, run the whole pipeline on the built-in corpus.
# make test: the same venv plus dev extras, then lint (ruff, the import layers) and the test suite.
# make test-slow: the same venv plus dev extras, then only the tests marked slow.
PYTHON ?= python3
VENV ?= .venv
# The CPU build of PyTorch; override e.g. `make demo TORCH=torch==2.14.1`.
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin

.PHONY: install demo test test-slow lint browser bench clean

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
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/lint-imports --no-logo --no-cache

# Headless Chromium + chromedriver for the report's browser test (skipped without them).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	( [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  chromium chromium-driver ) || \
	echo "browser: could not install chromium chromium-driver (needs root and apt-get);" \
	  "the browser test will be skipped"

# --durations=20: the log says where the time went. -n: one pytest worker per core (at
# most 4), each test file on one worker so its module fixtures are built once: 17 min
# instead of 26 on 2 cores. The slow tests run one at a time (their timings and kills).
test: lint browser
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile --durations=20

test-slow: $(VENV)/.dev-installed
	$(BIN)/python -m pytest -m slow --durations=20

clean:
	rm -rf $(VENV) ledgerlm-work .pytest_cache .ruff_cache
