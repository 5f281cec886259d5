"""The quickstart notebook run in JupyterLab in headless Chromium: the views render and update.

Starts JupyterLab on 127.0.0.1 (a free port, a random token, a temporary root
and settings folder), opens the quickstart, runs every cell, checks the graph
view's nodes and the training view's progress, and keeps screenshots. Uses
Debian's ``chromium`` (installed with apt-get when missing) driven by
Playwright; no browser is ever downloaded.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
REPO = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
README_SCREENSHOT = REPO / "docs" / "screenshot.png"


def launch(pw, chromium: str):
    """Debian's Chromium, headless, with no network of its own (Playwright downloads nothing)."""
    return pw.chromium.launch(
        executable_path=chromium,
        args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
    )


def ensure_chromium() -> str:
    """Debian's chromium, installed with apt-get if missing; skips the test if that cannot be done."""
    if not os.path.exists(CHROMIUM) and shutil.which("apt-get"):
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
            try:
                subprocess.run(sudo + cmd, env=env, capture_output=True, timeout=600, check=False)
            except (OSError, subprocess.TimeoutExpired):
                break
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed and apt-get could not install it")
    return CHROMIUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fallback_notebook(path: pathlib.Path) -> None:
    """The issue's example and a short fit, for a tree without notebooks/quickstart.ipynb."""
    import nbformat

    cells = [
        "%load_ext workbench",
        '%%flow mlp\nx = placeholder("x", shape=(None, 64))\ny = placeholder("y", shape=(None,), dtype="int64")\n'
        'w = variable("w", shape=(64, 10), init="glorot_uniform")\nb = variable("b", shape=(10,), init="zeros")\n'
        "loss = mean(softmax_cross_entropy(matmul(x, w) + b, y))\ntrain = optimizers.SGD(0.1).minimize(loss)",
        "import numpy as np\nimport workbench as wb\nfrom sklearn.datasets import load_digits\n"
        "digits = load_digits()\nsess = wb.Session(mlp)\n"
        "history = sess.fit(mlp.train, data={'x': (digits.data / 16).astype('float32'), 'y': digits.target},"
        " batch_size=64, steps=300, fetches={'loss': mlp.loss})",
    ]
    nbformat.write(new_notebook(cells), path)


def new_notebook(sources):
    """A notebook of code cells for the python3 kernel (so JupyterLab asks nothing)."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return nb


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server: (base url, token, root folder); stopped by pid afterwards."""
    pytest.importorskip("jupyterlab")
    root = tmp_path_factory.mktemp("lab-root")
    home = tmp_path_factory.mktemp("lab-home")
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # Draw every cell (no windowing), so all outputs exist in the page at once.
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    apputils = home / "settings" / "@jupyterlab" / "apputils-extension"
    apputils.mkdir(parents=True)
    (apputils / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))  # no pop-up
    port, token = free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
        "JUPYTER_CONFIG_DIR": str(home / "config"),
        "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
        "IPYTHONDIR": str(home / "ipython"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "lab.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not start:\n{(home / 'lab.log').read_text()[-3000:]}")
            time.sleep(0.25)
        yield url, token, root
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def test_quickstart_renders_graph_and_training_views(lab, tmp_path):
    chromium = ensure_chromium()
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    name = "quickstart.ipynb"
    if QUICKSTART.exists():
        shutil.copy(QUICKSTART, root / name)
    else:
        fallback_notebook(root / name)
    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    with sync_playwright() as pw:
        browser = launch(pw, chromium)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/lab/workspaces/quickstart/tree/{name}?reset&token={token}", wait_until="domcontentloaded")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected'",
                                   timeout=60_000)  # fmt: skip
            page.evaluate("() => window.jupyterapp.commands.execute('application:toggle-left-area')")
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # The training view follows fit live and ends in its final state.
            done = page.locator(".wb-training .wb-progress[data-status='done']")
            done.first.wait_for(timeout=90_000)
            progress = page.locator(".wb-training .wb-progress-text").first.inner_text()
            assert re.search(r"step (\d+) / \1 \(100%\)", progress) and "samples/s" in progress, progress
            assert page.locator(".wb-training svg[data-curve='loss'] path.wb-line").count() >= 1

            # The graph view: every visible node drawn, gradients and the optimizer folded.
            graph = page.locator(".wb-graph").first
            nodes = graph.locator("g.wb-node")
            assert nodes.count() == 10
            assert graph.locator("g.wb-node[data-kind='scope']").count() == 2
            assert graph.locator("g.wb-node[data-kind='placeholder']").count() == 2
            assert graph.locator("g.wb-node[data-kind='variable']").count() == 2
            assert graph.locator("path.wb-edge").count() >= 9

            # Clicking a node shows its definition; clicking a folded scope opens it (a kernel round trip).
            graph.locator("g.wb-node[data-id='matmul']").click()
            assert "matmul(x, w)" in graph.locator(".wb-details").inner_text()
            graph.locator("g.wb-node[data-id='gradients']").click()
            page.wait_for_function(
                "() => document.querySelector('.wb-graph').querySelectorAll('g.wb-node').length > 10", timeout=15_000
            )
            assert graph.locator("g.wb-scope[data-scope='gradients']").count() == 1
            graph.locator("g.wb-scope[data-scope='gradients'] text.wb-box-title").click()  # fold it again for the screenshot
            page.wait_for_function(
                "() => document.querySelector('.wb-graph').querySelectorAll('g.wb-node').length === 10", timeout=15_000
            )
            wait_for_last_cell(page)
            page.screenshot(path=str(tmp_path / "quickstart.png"))
            save_readme_screenshot(page, tmp_path / "readme.png")
            assert not [e for e in errors if "wb-" in e or "anywidget" in e.lower()], errors
        finally:
            browser.close()
    assert (tmp_path / "quickstart.png").stat().st_size > 10_000


def wait_for_last_cell(page) -> None:
    """Wait until no cell is queued or running (no ``[*]`` prompt left)."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('.jp-InputArea-prompt')].every(p => !p.textContent.includes('*'))",
        timeout=60_000,
    )


def save_readme_screenshot(page, path) -> None:
    """The README's picture: the ``%%flow`` cell with its graph view and the ``fit`` cell with its
    training view (the cells between them hidden). Written to ``path``; to docs/screenshot.png
    as well when WORKBENCH_UPDATE_SCREENSHOT=1, so a test run leaves the repository as it was."""
    page.evaluate(
        """() => {
            const cells = [...document.querySelectorAll('.jp-Notebook .jp-Cell')];
            const keep = (c) => c.querySelector('.wb-training') ||
                (c.querySelector('.wb-graph') && c.textContent.includes('%%flow'));
            cells.forEach((c) => { if (!keep(c)) c.style.display = 'none'; });
            document.querySelectorAll('.jp-Notebook .jp-Cell.jp-mod-selected, .jp-mod-active')
                .forEach((c) => c.classList.remove('jp-mod-selected', 'jp-mod-active'));
            document.querySelector('.jp-Notebook').scrollTop = 0;
        }"""
    )
    cells = page.locator(".jp-Notebook .jp-Cell:visible")
    first, last = cells.first.bounding_box(), cells.last.bounding_box()
    x0, y0 = first["x"], first["y"]
    width = max(first["width"], last["width"])
    height = min(last["y"] + last["height"], page.viewport_size["height"]) - y0
    clip = {"x": x0, "y": y0, "width": min(width, 1240), "height": height}
    page.screenshot(path=str(path), clip=clip)
    if os.environ.get("WORKBENCH_UPDATE_SCREENSHOT") == "1":
        README_SCREENSHOT.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(README_SCREENSHOT), clip=clip)


VIEWS_NOTEBOOK = [
    "import workbench as wb\nfrom workbench.events import ROOT, EventStream\n"
    "from workbench.widgets import ClusterView, GraphView",
    # A scaling study's events: the hook installed by `import workbench` shows a ScalingView.
    "rows = [dict(workers=n, samples_per_s=s, speedup=s / 100, efficiency=s / 100 / n)"
    " for n, s in ((1, 100.0), (2, 185.0), (4, 330.0))]\n"
    "ROOT.emit('scaling_started', workers=[1, 2, 4])\n"
    "for row in rows:\n    ROOT.emit('scaling_point', **row)\n"
    "ROOT.emit('scaling_finished', rows=rows)",
    "ClusterView({'scheduler': 'tcp://127.0.0.1:8786', 'dashboard': 'http://127.0.0.1:8787/status',"
    " 'workers': [{'address': 'tcp://127.0.0.1:4001', 'name': '0', 'threads': 1, 'memory': 2**31, 'gpus': 0}]})",
    "g = wb.Graph(name='g')\nwith g.as_default():\n    x = wb.placeholder('x', shape=(None, 2))\n"
    "    y = wb.log(wb.sum(x, axis=1))\nstream = EventStream(session='s1', graph=g.token)\nview = GraphView(g).follow(stream)\nview",
    "stream.emit('run_started', ops=['x', 'sum', 'log'])\nstream.emit('run_failed', op='log', error='NaN')",
]


def test_scaling_cluster_views_and_live_graph_states(lab, tmp_path):
    chromium = ensure_chromium()
    import nbformat
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    nbformat.write(new_notebook(VIEWS_NOTEBOOK), root / "views.ipynb")
    with sync_playwright() as pw:
        browser = launch(pw, chromium)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1600})
            page.goto(f"{url}/lab/workspaces/views/tree/views.ipynb?reset&token={token}", wait_until="domcontentloaded")
            page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                                   " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected'",
                                   timeout=60_000)  # fmt: skip
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            try:
                page.locator(".wb-graph g.wb-node[data-state='error']").wait_for(timeout=60_000)
            finally:
                page.screenshot(path=str(tmp_path / "views.png"))
            graph = page.locator(".wb-graph").first
            assert graph.locator("g.wb-node[data-state='done']").count() == 2  # x and sum ran, log failed
            scaling = page.locator(".wb-scaling").first
            assert "done · 3 of 3 worker counts" in scaling.locator(".wb-title").inner_text()
            assert scaling.locator("circle.wb-point").count() == 6  # 3 throughput + 3 speedup points
            assert "83%" in scaling.locator("table").inner_text()  # efficiency of 4 workers
            cluster = page.locator(".wb-cluster").first
            assert "1 workers · 1 threads · 2.0 GiB" in cluster.locator(".wb-title").inner_text()
            assert cluster.locator("a").get_attribute("href") == "http://127.0.0.1:8787/status"
            wait_for_last_cell(page)
            page.screenshot(path=str(tmp_path / "views.png"))
        finally:
            browser.close()
