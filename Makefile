# make run   -- install (once) and run the main job on the embedded defaults
# make test  -- install (once) and run the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=
# Test modules run on JOBS pytest-xdist workers, a whole module per worker (module
# fixtures stay single); JOBS=0 runs them in this process. Two on two cores: three were
# slower (a fresh-clone run on an AMD EPYC VM, 2 cores: 37:20 against 31:30 with two).
JOBS ?= 2

.PHONY: install native-deps run test clean

install: $(STAMP)

# The native checkpoint writer (csrc/) needs a C++ compiler and the headers of OpenSSL
# (sha256) and libxxhash (xxh3). Without them setup.py still installs, silently, with the
# Python writer only; so they are brought here (apt-get, as root) or named, and the build
# is checked after the install. BATON_ALLOW_NO_NATIVE=1 installs without the native writer.
NATIVE_PACKAGES := g++ libssl-dev libxxhash-dev
native-deps:
	@if [ -f /usr/include/xxhash.h ] && [ -f /usr/include/openssl/sha.h ] && command -v g++ >/dev/null; then :; \
	elif [ "$$BATON_ALLOW_NO_NATIVE" = 1 ]; then echo "baton: building without the native writer (BATON_ALLOW_NO_NATIVE=1)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(NATIVE_PACKAGES); \
	else echo "baton: the native checkpoint writer needs $(NATIVE_PACKAGES) (or your system's" \
		"equivalents); install them, or run with BATON_ALLOW_NO_NATIVE=1 to use the Python writer" >&2; exit 2; fi

# torch is installed first, by pip and pinned to the CPU build that lies on this disk (pip's
# configuration points at it; uv does not read that): a bare `torch` requirement would pull a
# multi-GB CUDA build. The package's own requirement stays a range so GPU machines can use
# their own build, and the installed 2.13.0 satisfies it. The rest is installed by uv, which
# fetches and unpacks in parallel: the same versions as pip's resolver picks (pip freeze
# compared), 23 s against pip's 83 s on a 2-core AMD EPYC VM with empty caches.
UV_VERSION := 0.13.10
# setup.py builds csrc/ during the editable install: the native checkpoint writer into ckpt/,
# what portable mode preloads ahead of MKL (core/mkl_preload.py) into core/.
$(STAMP): pyproject.toml setup.py csrc/native_writer.cpp csrc/mkl_preload.c
	@$(MAKE) --no-print-directory native-deps
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q "torch==2.13.0" "uv==$(UV_VERSION)"
	$(BIN)/uv pip install -q --python $(BIN)/python -e ".[test]"
	@$(BIN)/python -c "import ckpt._native_writer" 2>/dev/null || [ "$$BATON_ALLOW_NO_NATIVE" = 1 ] || \
		{ echo "baton: ckpt._native_writer did not build (see pip's output above); fix the" \
		"build or run with BATON_ALLOW_NO_NATIVE=1 to use the Python writer" >&2; exit 2; }
	@ls core/_mkl_preload*.so >/dev/null 2>&1 || { echo "baton: core/_mkl_preload (csrc/mkl_preload.c)" \
		"did not build (see pip's output above); portable mode needs it" >&2; exit 2; }
	$(BIN)/python -m stages.prebuild
	$(BIN)/python -m flows.prefect_template
	touch $(STAMP)

run: install
	$(BIN)/baton run $(ARGS)

test: install
	$(BIN)/python -m pytest -q -ra --durations=40 -n $(JOBS) --dist loadfile --no-loadscope-reorder $(ARGS)

clean:
	rm -rf $(VENV) runs
