# The two commands of the README:
#   make report   the head-to-head comparison on the built-in default workload
#   make test     lint, type check and the whole test suite, on the pure-Python package
#                 and on the compiled build (skipped, said once, without a C compiler)
# Both create (or reuse) the virtual environment in .venv and install the project.
#   make build-compiled   the wheel with the hot modules compiled by mypyc -> dist/
#   PREFIXKV_BUILD=compiled make report|bench   run those on the compiled build
#   make test-engines   prefixkv inside the real vLLM 0.33 and SGLang 0.5.23 (CPU), in
#                       side environments built once under $(PEERS) (see the README)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.prefixkv-installed
REPORT_DIR ?= prefixkv-report

# The compiled build: cached under build/mypyc/ by a hash of what it compiles, laid out
# with the working tree's Python as an import tree that goes first on PYTHONPATH.
COMPILED_SITE := build/mypyc/site
PREFIXKV_BUILD ?= pure
# Prefix of a recipe line: puts the compiled site on PYTHONPATH when PREFIXKV_BUILD is
# "compiled" and the machine can build it (else the script says why, once).
with_build = site=; if [ "$(PREFIXKV_BUILD)" = compiled ]; then \
	site=$$($(BIN)/python .ci/build_compiled.py --site $(COMPILED_SITE)) || exit 1; fi; \
	if [ -n "$$site" ]; then export PYTHONPATH="$$site$${PYTHONPATH:+:$$PYTHONPATH}"; fi;

PEERS ?= .peers
# Any Python with the engine installed will do (it gets prefixkv, --no-deps, editable).
VLLM_PYTHON ?= $(PEERS)/vllm/bin/python
SGLANG_PYTHON ?= $(PEERS)/sglang/bin/python
# The engine tests run apart from the default suite: own conftest, no project addopts.
ENGINE_PYTEST := -m pytest -o addopts="-ra --strict-markers" --confcutdir=tests/engines -p no:cacheprovider

.PHONY: test test-compiled report bench lint typecheck clean test-engines engine-envs build-compiled

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

# mypy cannot follow setuptools' editable-install finder, so it reads the three
# source folders through a prefixkv/ tree of symbolic links.
.mypy-path/prefixkv:
	mkdir -p .mypy-path/prefixkv
	for d in indexes storage adapters; do ln -sfn ../../$$d .mypy-path/prefixkv/$$d; done

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) .mypy-path/prefixkv
	MYPYPATH=.mypy-path $(BIN)/mypy -p prefixkv.indexes -p prefixkv.storage -p prefixkv.adapters

# The suite on the pure-Python package, then on the compiled build (a test checks that
# each run loaded the build it names).
test: lint typecheck
	PREFIXKV_EXPECT_BUILD="pure Python" $(BIN)/python -m pytest
	@$(MAKE) --no-print-directory test-compiled

test-compiled: $(STAMP)
	@site=$$($(BIN)/python .ci/build_compiled.py --site $(COMPILED_SITE)) || exit 1; \
	if [ -n "$$site" ]; then \
	  echo "PYTHONPATH=$$site: the suite on the compiled build"; \
	  PYTHONPATH="$$site$${PYTHONPATH:+:$$PYTHONPATH}" PREFIXKV_EXPECT_BUILD=compiled \
	    $(BIN)/python -m pytest -p no:cacheprovider; \
	fi

build-compiled: $(STAMP)
	$(BIN)/python .ci/build_compiled.py --require --wheel-dir dist

report: $(STAMP)
	@$(with_build) set -x; $(BIN)/prefixkv compare --out $(REPORT_DIR)

bench: $(STAMP)
	@$(with_build) set -x; $(BIN)/python -m pytest benchmarks --benchmark-only -p no:cacheprovider

# Builds (or reuses: the script checks first) the side environments, then puts this
# checkout into each, --no-deps, so SGLang finds prefixkv's plug-in entry point.
engine-envs:
	test "$(VLLM_PYTHON)" != "$(PEERS)/vllm/bin/python" || bash benchmarks/peers/setup_env.sh vllm $(PEERS)/vllm
	test "$(SGLANG_PYTHON)" != "$(PEERS)/sglang/bin/python" || bash benchmarks/peers/setup_env.sh sglang $(PEERS)/sglang
	for py in $(VLLM_PYTHON) $(SGLANG_PYTHON); do \
	  $$py -c "import prefixkv.adapters.plugins" 2>/dev/null && \
	  $$py -c "import importlib.metadata as m, sys; sys.exit(not m.entry_points(group='sglang.srt.plugins', name='prefixkv'))" || \
	  $$py -m pip install --quiet --disable-pip-version-check --no-deps -e . || exit 1; \
	done
	$(SGLANG_PYTHON) benchmarks/peers/check_env.py sglang

test-engines: engine-envs
	$(VLLM_PYTHON) $(ENGINE_PYTEST) tests/engines/vllm
	$(SGLANG_PYTHON) $(ENGINE_PYTEST) tests/engines/sglang

clean:
	rm -rf $(VENV) .mypy-path .mypy_cache .pytest_cache .ruff_cache $(REPORT_DIR) build/mypyc
