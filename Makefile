# Set-up and the two everyday jobs. Needs only python3 (3.11+) and access to PyPI.
#   make demo        create .venv if missing, install workbench, run the main job
#   make test        create .venv if missing, install workbench[test], run every test
#   make test-quick  the same without tests marked slow
#   make lint        ruff: the formatting and the checks of pyproject's [tool.ruff.lint]
#   make test-blas   the quick cluster and training tests on another BLAS kernel (OPENBLAS_CORETYPE)
# Installs run again only when pyproject.toml changes (stamp files in .venv).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Bytecode is cached (an environment that turns it off makes every test module, and every worker
# process a test starts, compile workbench from source again).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-quick lint test-blas

demo: $(VENV)/.installed
	$(PY) -m workbench.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest

test-quick: $(VENV)/.installed-test
	$(PY) -m pytest -m "not slow"

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff format --check workbench tests
	$(VENV)/bin/ruff check workbench tests

# Float comparisons must not depend on the BLAS kernel numpy's OpenBLAS picks for this CPU: run the
# quick cluster and training tests once more with another one (Haswell, or Sandybridge where the CPU's
# own is Haswell; where OPENBLAS_CORETYPE is set, without it).
BLAS_TESTS := tests/cluster tests/test_training.py tests/test_fitloop.py tests/test_session.py tests/test_optimizers.py
BLAS_CORE = $(PY) -c 'import numpy; from threadpoolctl import threadpool_info as i; \
	print(next((x.get("architecture", "") for x in i() if x.get("internal_api") == "openblas"), ""))'
test-blas: $(VENV)/.installed-test
	@if [ -n "$$OPENBLAS_CORETYPE" ]; then \
		echo "test-blas: OPENBLAS_CORETYPE unset (was $$OPENBLAS_CORETYPE)"; \
		env -u OPENBLAS_CORETYPE $(PY) -m pytest -q -m "not slow" $(BLAS_TESTS); \
	else \
		core=Haswell; [ "$$($(BLAS_CORE))" = Haswell ] && core=Sandybridge; \
		echo "test-blas: OPENBLAS_CORETYPE=$$core (the CPU's own: $$($(BLAS_CORE)))"; \
		OPENBLAS_CORETYPE=$$core $(PY) -m pytest -q -m "not slow" $(BLAS_TESTS); \
	fi

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "workbench needs Python 3.11 or newer; $(PYTHON) is $$($(PYTHON) -V 2>&1)" >&2; exit 1; }
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		{ echo "$(PYTHON) cannot create virtual environments; on Debian or Ubuntu: apt-get install python3-venv" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(PY)
	$(PY) -m pip install -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install -e '.[test]'
	touch $@
