# make run   -- install (once) and run the main job on the embedded defaults
# make test  -- install (once) and run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
# Test modules run on JOBS pytest-xdist workers, a whole module per worker (module
# fixtures stay single); JOBS=0 runs them in this process.
JOBS ?= 2

.PHONY: install run test clean

install: $(STAMP)

# torch is installed first and pinned to the CPU build that lies on this disk: a bare
# `torch` requirement would pull a multi-GB CUDA build. The package's own requirement
# stays a range so GPU machines can use their own build.
# setup.py builds csrc/ (the native checkpoint writer) into ckpt/ during the editable install.
$(STAMP): pyproject.toml setup.py csrc/native_writer.cpp
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/python -m stages.prebuild
	touch $(STAMP)

run: install
	$(BIN)/baton run $(ARGS)

test: install
	$(BIN)/python -m pytest -q -ra --durations=40 -n $(JOBS) --dist loadfile --no-loadscope-reorder $(ARGS)

clean:
	rm -rf $(VENV) runs
