"""The example notebooks: stored without outputs, and each one runs to the end in a real kernel.

The kernel is this test run's Python (a kernelspec written to a temporary
folder), so it sees the same installation of workbench as the tests.
"""

import json
import os
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "workbench-test-python"
CELL_TIMEOUT = 60  # seconds for any one cell; the whole notebook is bounded by pytest's timeout
STARTUP_TIMEOUT = 60
NOTEBOOK_NAMES = ["quickstart.ipynb", "distributed.ipynb", "scaling.ipynb", "playground.ipynb"]


def test_every_notebook_is_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(NOTEBOOK_NAMES)


@pytest.mark.parametrize("name", sorted(NOTEBOOK_NAMES))
def test_notebooks_are_valid_and_stored_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name}: a cell has stored outputs"
    assert "widgets" not in nb.metadata, f"{name}: stored widget state"


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec that starts this interpreter, found through JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "workbench tests",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root), *([old] if old else [])])
    try:
        yield root
    finally:
        if old is None:
            del os.environ["JUPYTER_PATH"]
        else:
            os.environ["JUPYTER_PATH"] = old


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_notebook_runs_without_error(name, kernel_env, tmp_path):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT,
        startup_timeout=STARTUP_TIMEOUT,
        iopub_timeout=10,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working folder
    )
    client.execute()  # raises CellExecutionError, naming the cell, at the first error
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors
