"""The example notebooks: stored without outputs, each one runs to the end in a real kernel, and the
executed copy shows a picture of every view without a kernel (saved outputs, ``nbconvert --to html``).

The kernel is this test run's Python (a kernelspec written to a temporary
folder), so it sees the same installation of workbench as the tests.
"""

import base64
import html
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "workbench-test-python"
CELL_TIMEOUT = 60  # seconds for any one cell; the whole notebook is bounded by pytest's timeout
STARTUP_TIMEOUT = 60
NOTEBOOK_NAMES = [
    "quickstart.ipynb",
    "distributed.ipynb",
    "scaling.ipynb",
    "playground.ipynb",
    "strategies.ipynb",
    "models.ipynb",
    "revisiting_sync_sgd.ipynb",
]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
SVG_MIME = "image/svg+xml"


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


def execute(name: str, folder: Path):
    """Run a notebook in a real kernel as nbclient (and papermill) do; the executed copy is saved in ``folder``."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT,
        startup_timeout=STARTUP_TIMEOUT,
        iopub_timeout=10,
        resources={"metadata": {"path": str(folder)}},  # the kernel's working folder
    )
    client.execute()  # raises CellExecutionError, naming the cell, at the first error
    errors = [out for cell in nb.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors
    nbformat.write(nb, folder / name)
    return nb


# What each notebook's saved pictures show, picture by picture in order (texts that one picture holds):
# the final state of every view, drawn without a kernel.
PICTURES = {
    "quickstart.ipynb": [("graph mlp · 15 nodes", "colour: gradient norm at step 300"),
                         ("graph mlp · 15 nodes", "colour: gradient norm at step 300"),
                         ("training · 300 steps · done", "step 300 / 300 (100%)")],
    "distributed.ipynb": [("graph mlp",), ("training · 30 steps · done",), ("Dask cluster tcp://", "· closed"),
                          ("training · 30 steps · done", "2 replicas"), ("training · 10 steps · done", "2 replicas"),
                          ("timeline · allreduce · done", "waits for"), ("default cluster closed",)],
    "scaling.ipynb": [("graph wide",), ("scaling study · done · 2 of 2 worker counts", "efficiency")],
    "playground.ipynb": [("features", "layer 2", "epoch", "test loss"), ("graph playground",)],
    "strategies.ipynb": [("graph mlp",), ("graph mlp-averaged", "every_4"), ("Dask cluster tcp://", "· closed"),
                         ("training · 48 steps · done", "2 replicas"), ("default cluster closed",)],
    "models.ipynb": [("graph transformer", "block0"), ("training · 150 steps · done",), ("graph resnet", "block1"),
                     ("training · 40 steps · done",), ("graph rnn",), ("training · 150 steps · done",),
                     ("Dask cluster",), ("training · 20 steps · done", "2 replicas"), ("default cluster closed",)],
    "revisiting_sync_sgd.ipynb": [("strategy comparison · virtual clock · done", "sync + 2 backups (60 steps)",
                                   "async (480 steps)", "k-th gradient arrival"),
                                  ("strategy comparison · virtual clock · done", "N=7, b=3"),
                                  ("Dask cluster tcp://", "· closed"),
                                  ("strategy comparison · wall clock · done", "sync + 1 backup (10 steps)", "async (20 steps)"),
                                  ("default cluster closed",)],
}  # fmt: skip


def pictures(nb) -> list[str]:
    """The SVG pictures in a notebook's saved outputs; every widget output must be followed by its picture."""
    found = []
    for cell in nb.cells:
        outputs = cell.get("outputs", [])
        for i, out in enumerate(outputs):
            data = out.get("data", {})
            if WIDGET_MIME in data:  # the picture is the next output (what a reopened JupyterLab shows)
                after = outputs[i + 1].get("data", {}) if i + 1 < len(outputs) else {}
                assert SVG_MIME in after and "wb-saved-picture" in after.get("text/html", ""), (
                    f"a widget output without a picture after it: {sorted(after)}"
                )
            if SVG_MIME in data:
                ET.fromstring(data[SVG_MIME])  # well-formed
                found.append(data[SVG_MIME])
    return found


def assert_shows(svgs: list[str], expected: list[tuple[str, ...]]) -> None:
    """The pictures, in order, include one holding each group of ``expected`` texts."""
    remaining = [html.unescape(svg) for svg in svgs]
    for texts in expected:
        match = next((i for i, svg in enumerate(remaining) if all(t in svg for t in texts)), None)
        assert match is not None, f"no picture (after the previous one) shows {texts}"
        remaining = remaining[match + 1 :]


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_notebook_runs_and_saves_pictures_of_its_views(name, kernel_env, tmp_path):
    nb = execute(name, tmp_path)
    svgs = pictures(nb)
    assert_shows(svgs, PICTURES[name])
    if name == "playground.ipynb":
        assert "data:image/png;base64," in svgs[0]  # the decision boundary itself
        assert "layer 2" in svgs[0]  # the network as later cells left it (two hidden layers), not as first shown
    # nbconvert --to html of the outputs without the widget state (as JupyterLab saves a notebook; nbclient saved
    # the state, which the preprocessor drops): the pictures, inline, nothing to fetch
    command = ["jupyter", "nbconvert", "--to", "html", "--ClearMetadataPreprocessor.enabled=True", str(tmp_path / name)]
    result = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = (tmp_path / name).with_suffix(".html").read_text(encoding="utf-8")
    images = [
        base64.b64decode(src).decode()
        for src in re.findall(r'<img[^>]* src="data:image/svg\+xml;base64,([^"]+)"', page)
    ]
    inline = [svg for svg in images if 'class="wb-snapshot"' in svg]
    assert len(inline) == len(svgs)
    assert_shows(inline, PICTURES[name])
    assert "widget-view+json" not in page.split("<body", 1)[1]  # no widget left for a missing manager


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_distributed_notebook_runs_unmodified_on_a_configured_cli_cluster(kernel_env, tmp_path, monkeypatch, dask_cli):
    processes = dask_cli(tmp_path)
    try:
        address = processes.scheduler()
        for i in range(2):
            processes.worker(address, f"cli{i}")
        processes.connect(address, workers=2).close()
        monkeypatch.setenv("DASK_WORKBENCH__CLUSTER__ADDRESS", address)  # the kernel inherits it
        nb = execute("distributed.ipynb", tmp_path)
        svgs = pictures(nb)
        assert_shows(svgs, [(f"Dask cluster {address} · disconnected",), ("training · 30 steps · done", "2 replicas"),
                            (f"disconnected from {address}; that cluster keeps running",)])  # fmt: skip
        assert processes.running()
        client = processes.connect(address, workers=2)  # the notebook let it go; it still works
        try:
            assert sorted(w["name"] for w in client.scheduler_info()["workers"].values()) == ["cli0", "cli1"]
            assert client.submit(sum, [1, 2], pure=False).result(timeout=30) == 3
        finally:
            client.close()
    finally:
        processes.stop()
