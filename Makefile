# The two entry points the README promises: `make demo` and `make test`.
# Each installs what it needs: the harness in .venv, the vLLM CPU engine in its own venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test install engine

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

engine:
	bash scripts/install-engine.sh

demo: install engine
	$(BIN)/harness demo

test: install engine
	$(BIN)/python -m pytest
