"""JupyterLab with "Save Widget State Automatically" on: a saved notebook's TrainingView, reopened in a
fresh page, draws its charts from the saved widget state, in their order and colours.

The fit's metrics are fetched as ``loss`` then ``acc`` (and ``val_loss``, drawn in the loss chart), so
a state that lost the order (the notebook file sorts its JSON keys) would put ``acc`` first, in
``loss``'s colour. The setting is JupyterLab's own (``@jupyter-widgets/jupyterlab-manager:plugin``,
``saveState``), set through the settings API of a server of this module's own.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import urllib.request

import pytest

pytestmark = pytest.mark.slow


def _browser_helpers():
    """tests/browser/test_jupyterlab.py's server fixture and page helpers (the suite imports test files
    by path, so a sibling is loaded the same way)."""
    spec = importlib.util.spec_from_file_location(
        "_jupyterlab_helpers", pathlib.Path(__file__).with_name("test_jupyterlab.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_helpers = _browser_helpers()
lab = _helpers.lab  # a JupyterLab server of this module's own (module scope)
ensure_chromium, goto_notebook, launch = _helpers.ensure_chromium, _helpers.goto_notebook, _helpers.launch
notebook_page, wait_for_last_cell = _helpers.notebook_page, _helpers.wait_for_last_cell

NOTEBOOK = [
    "import numpy as np\nimport workbench as wb\n"
    "g = wb.Graph(name='mlp')\nwith g.as_default():\n"
    "    x = wb.placeholder('x', shape=(None, 4))\n    y = wb.placeholder('y', shape=(None,), dtype='int64')\n"
    "    logits = wb.matmul(x, wb.variable('w', shape=(4, 3)))\n"
    "    loss = wb.mean(wb.softmax_cross_entropy(logits, y))\n    acc = wb.accuracy(logits, y)\n"
    "    train = wb.optimizers.SGD(0.1).minimize(loss)\n"
    "rng = np.random.default_rng(0)\ndata = {'x': rng.normal(size=(64, 4)).astype('float32'),"
    " 'y': rng.integers(0, 3, 64)}\nsess = wb.Session(g, seed=0)",
    "h = sess.fit(train, data, batch_size=16, steps=20, fetches={'loss': loss, 'acc': acc}, validation=(data, 5))",
]

#: (chart label, [stroke colour of each line], its title text) for every chart of the first TrainingView
CHARTS = """() => [...document.querySelector('.wb-training').querySelectorAll('svg.wb-chart')].map((svg) => [
    svg.dataset.curve,
    [...svg.querySelectorAll('path.wb-line')].map((p) => p.getAttribute('stroke')),
    svg.querySelector('text').textContent,
])"""


def save_widget_state(url: str, token: str) -> None:
    """Turn on "Save Widget State Automatically" through JupyterLab's settings API."""
    body = json.dumps({"raw": json.dumps({"saveState": True})}).encode()
    request = urllib.request.Request(
        f"{url}/lab/api/settings/@jupyter-widgets/jupyterlab-manager:plugin",
        data=body,
        method="PUT",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status in (200, 204)


def test_a_reopened_training_view_draws_its_charts_in_their_order_and_colours(lab, tmp_path):
    chromium = ensure_chromium()
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    save_widget_state(url, token)
    with notebook_page(lab, "saved-state", NOTEBOOK) as page:
        wait_for_last_cell(page)
        page.locator(".wb-training .wb-progress[data-status='done']").wait_for(timeout=60_000)
        live = page.evaluate(CHARTS)
        title = page.locator(".wb-training .wb-title").inner_text()
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        page.wait_for_timeout(2000)
    assert [c[0] for c in live] == ["loss", "acc", "samples/s"], live
    assert live[0][1][0] != live[1][1][0]  # loss and acc in colours of their own
    saved = json.loads((root / "saved-state.ipynb").read_text())
    assert "application/vnd.jupyter.widget-state+json" in saved["metadata"]["widgets"]

    with sync_playwright() as pw:  # a fresh page: its kernel has no widgets, the notebook's saved state has them
        browser = launch(pw, chromium)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1600})
            goto_notebook(page, url, token, "saved-state")
            page.locator(".wb-training svg.wb-chart").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "reopened-with-state.png"))
            assert page.evaluate(CHARTS) == live
            assert page.locator(".wb-training .wb-title").inner_text() == title
            assert page.locator(".wb-training .wb-progress[data-status='done']").count() == 1
            assert not page.locator(".wb-saved-picture").first.is_visible()  # the view, not its picture
            assert not page.get_by_text("Error displaying widget").first.is_visible()
        finally:
            browser.close()
