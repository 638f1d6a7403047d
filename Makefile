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
	rm -rf build/tiny build/tiny-mix build/tiny-export
	$(BIN)/dsx tiny build/tiny
	$(BIN)/dsx inspect build/tiny
	$(BIN)/dsx quantize build/tiny --out build/tiny-mix --type a8w8_fp8_wint4 --mtp-type a8w8_fp8 --force
	$(BIN)/dsx inspect build/tiny-mix
	$(BIN)/dsx verify build/tiny-mix --reference build/tiny
	$(BIN)/dsx export build/tiny --out build/tiny-export --speculate --max-seq-len 256 --force
	$(BIN)/dsx generate build/tiny-export --prompt "DeepSeek" --max-new-tokens 16 --speculate 2

test: setup
	$(BIN)/python -m pytest -q

clean:
	rm -rf build $(VENV)
