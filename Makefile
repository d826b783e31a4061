# Two entry points for a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs everything it needs on first use.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# The CPU build of torch; a plain `pip install torch` pulls a multi-GB CUDA build.
TORCH_VERSION := 2.13.0
TORCH_WHEEL   := $(firstword $(wildcard /opt/wheels/torch-$(TORCH_VERSION)+cpu-*.whl))
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
PLUGIN_DIRS := $(wildcard plugins/precguard-*)
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format bench clean

# setup.py and the kernel: an editable install builds the extension only when installed
$(STAMP): pyproject.toml setup.py src/precguard/capture/_fused.cpp src/precguard/capture/_fused_kernels.h $(wildcard plugins/*/pyproject.toml) Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@if $(PY) -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$(TORCH_VERSION)') else 1)" 2>/dev/null; then \
		echo "torch $(TORCH_VERSION) already installed"; \
	elif [ -n "$(TORCH_WHEEL)" ]; then \
		$(PIP) install -q "$(TORCH_WHEEL)"; \
	else \
		$(PIP) install -q "torch==$(TORCH_VERSION)" --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	$(PIP) install -q -e ".[test]" $(foreach d,$(PLUGIN_DIRS),-e ./$(d))
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m precguard.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples plugins
	$(VENV)/bin/ruff format --check src tests benchmarks examples plugins

format: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks examples plugins
	$(VENV)/bin/ruff check --fix src tests benchmarks examples plugins

# the whole suite: tests/ and each vendor plugin's own tests (testpaths in pyproject.toml)
test: lint
	$(PY) -m pytest -q

# the same without the tests marked slow (those that start a process)
test-fast: lint
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
