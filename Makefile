# The two commands of the README:
#   make report   the head-to-head comparison on the built-in default workload
#   make test     lint, type check and the whole test suite
# Both create (or reuse) the virtual environment in .venv and install the project.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.prefixkv-installed
REPORT_DIR ?= prefixkv-report

.PHONY: test report bench lint typecheck clean

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

clean:
	rm -rf $(VENV) .mypy-path .mypy_cache .pytest_cache .ruff_cache $(REPORT_DIR)
