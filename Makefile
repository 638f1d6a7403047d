# Set-up is part of every target: a fresh machine needs only python3 (>= 3.11), gcc and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dsx-installed

.PHONY: setup demo test native clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP) native

# Build csrc/ (cached under ~/.cache/dsx by source hash; a no-op when up to date).
native: $(STAMP)
	$(BIN)/python -m ds_export.native.build

# The main job on the embedded default: the bundled tiny DeepSeek-V3 checkpoint, no network.
demo: setup
	rm -rf build/tiny-run
	$(BIN)/dsx run recipes/tiny.yaml --workdir build/tiny-run

test: setup
	$(BIN)/python -m pytest -q --durations=15

clean:
	rm -rf build $(VENV)
