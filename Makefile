# The two commands of the README:
#   make report   the head-to-head comparison on the built-in default workload
#   make test     lint, type check and the whole test suite
# Both create (or reuse) the virtual environment in .venv and install the project.
#   make test-engines   prefixkv inside the real vLLM 0.33 and SGLang 0.5.23 (CPU), in
#                       side environments built once under $(PEERS) (see the README)

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.prefixkv-installed
REPORT_DIR ?= prefixkv-report

PEERS ?= .peers
# Any Python with the engine installed will do (it gets prefixkv, --no-deps, editable).
VLLM_PYTHON ?= $(PEERS)/vllm/bin/python
SGLANG_PYTHON ?= $(PEERS)/sglang/bin/python
# The engine tests run apart from the default suite: own conftest, no project addopts.
ENGINE_PYTEST := -m pytest -o addopts="-ra --strict-markers" --confcutdir=tests/engines -p no:cacheprovider

.PHONY: test report bench lint typecheck clean test-engines engine-envs

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

test: lint typecheck
	$(BIN)/python -m pytest

report: $(STAMP)
	$(BIN)/prefixkv compare --out $(REPORT_DIR)

bench: $(STAMP)
	$(BIN)/python -m pytest benchmarks --benchmark-only -p no:cacheprovider

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

test-engines: engine-envs
	$(VLLM_PYTHON) $(ENGINE_PYTEST) tests/engines/vllm
	$(SGLANG_PYTHON) $(ENGINE_PYTEST) tests/engines/sglang

clean:
	rm -rf $(VENV) .mypy-path .mypy_cache .pytest_cache .ruff_cache $(REPORT_DIR)
