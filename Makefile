# Set-up and the two everyday jobs. Needs only python3 (3.11+) and access to PyPI.
#   make demo        create .venv if missing, install workbench, run the main job
#   make test        create .venv if missing, install workbench[test], run every test
#   make test-quick  the same without tests marked slow
# Installs run again only when pyproject.toml changes (stamp files in .venv).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-quick

demo: $(VENV)/.installed
	$(PY) -m workbench.demo

test: $(VENV)/.installed-test
	$(PY) -m pytest

test-quick: $(VENV)/.installed-test
	$(PY) -m pytest -m "not slow"

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
