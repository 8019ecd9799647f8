# The two entry points the README promises: `make demo` and `make test`.
# Each installs what it needs: the harness in .venv, the vLLM CPU engine in its own venv; the tests also
# Debian's chromium (apt-get), which renders the HTML report.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test install engine browser

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

engine:
	bash scripts/install-engine.sh

# The HTML report is tested in a real browser: Debian's headless Chromium.
browser:
	command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update && $(SUDO) apt-get install -y chromium; }

demo: install engine
	$(BIN)/harness demo

# Lint and type-check first: they take seconds, the tests minutes.
test: install engine browser
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
