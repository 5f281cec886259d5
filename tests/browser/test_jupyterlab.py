"""The quickstart notebook run in JupyterLab in headless Chromium: the views render and update;
and the Dask dashboard's Workbench page following a fit on a local cluster.

Starts JupyterLab on 127.0.0.1 (a free port, a random token, a temporary root
and settings folder), opens the quickstart, runs every cell, checks the graph
view's nodes and the training view's progress, and keeps screenshots. Uses
Debian's ``chromium`` (installed with apt-get when missing) driven by
Playwright; no browser is ever downloaded.
"""

from __future__ import annotations

import contextlib
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
README_DASHBOARD = REPO / "docs" / "dashboard.png"


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
        "logits = matmul(x, w) + b\nloss = mean(softmax_cross_entropy(logits, y))\nacc = accuracy(logits, y)\n"
        "train = optimizers.SGD(0.1).minimize(loss)",
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
            goto_notebook(page, url, token, "quickstart")
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
            assert nodes.count() == 15  # the loss and accuracy ops; the gradients, the optimizer, the statistics folded
            assert graph.locator("g.wb-node[data-kind='scope']").count() == 3
            assert graph.locator("g.wb-node[data-kind='placeholder']").count() == 2
            assert graph.locator("g.wb-node[data-kind='variable']").count() == 2
            assert graph.locator("path.wb-edge").count() >= 9

            # Clicking a node shows its definition; clicking a folded scope opens it (a kernel round trip).
            graph.locator("g.wb-node[data-id='matmul']").click()
            assert "matmul(x, w)" in graph.locator(".wb-details").inner_text()
            graph.locator("g.wb-node[data-id='gradients']").click()
            page.wait_for_function(
                "() => document.querySelector('.wb-graph').querySelectorAll('g.wb-node').length > 15", timeout=15_000
            )
            assert graph.locator("g.wb-scope[data-scope='gradients']").count() == 1
            graph.locator(
                "g.wb-scope[data-scope='gradients'] text.wb-box-title"
            ).click()  # fold it again for the screenshot
            page.wait_for_function(  # folded again: one node for the scope, none of its members (later cells add ops)
                "() => { const g = document.querySelector('.wb-graph');"
                " return !g.querySelector(\"g.wb-scope[data-scope='gradients']\")"
                " && !!g.querySelector(\"g.wb-node[data-id='gradients']\"); }",
                timeout=15_000,
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
            document.querySelectorAll('.jp-WindowedPanel-outer').forEach((e) => { e.scrollTop = 0; });
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


def goto_notebook(page, url, token, name):
    """Open ``name``.ipynb in JupyterLab and wait for its kernel."""
    page.goto(f"{url}/lab/workspaces/{name}/tree/{name}.ipynb?reset&token={token}", wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                           " && window.jupyterapp.shell.currentWidget.sessionContext"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
                           " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected'",
                           timeout=60_000)  # fmt: skip


def open_notebook(page, url, token, name, wait: bool = True):
    """Open ``name``.ipynb in JupyterLab and run all its cells (without waiting for them: ``wait=False``)."""
    goto_notebook(page, url, token, name)
    if wait:
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    else:
        page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")


@contextlib.contextmanager
def notebook_page(lab, name: str, cells, width: int = 1300, height: int = 1600, wait: bool = True):
    """A page of headless Chromium with a notebook of ``cells`` open in JupyterLab, all cells started
    (and run, unless ``wait=False``)."""
    chromium = ensure_chromium()
    import nbformat
    from playwright.sync_api import sync_playwright

    url, token, root = lab
    nbformat.write(new_notebook(cells), root / f"{name}.ipynb")
    with sync_playwright() as pw:
        browser = launch(pw, chromium)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            open_notebook(page, url, token, name, wait)
            yield page
        finally:
            browser.close()


def test_scaling_cluster_views_and_live_graph_states(lab, tmp_path):
    with notebook_page(lab, "views", VIEWS_NOTEBOOK) as page:
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


MODELS_NOTEBOOK = [
    "%load_ext workbench",
    "%%flow cnn\n"
    "x = placeholder('x', shape=(None, 64))\ny = placeholder('y', shape=(None,), dtype='int64')\n"
    "h = reshape(x, (-1, 1, 8, 8))\n"
    "for i, (cin, cout) in enumerate([(1, 8), (8, 16)], start=1):\n"
    "    with name_scope(f'conv{i}'):\n"
    "        k = variable('k', shape=(cout, cin, 3, 3), init='he_normal')\n"
    "        c = variable('c', shape=(cout, 1, 1), init='zeros')\n"
    "        h = max_pool2d(relu(conv2d(h, k, padding='same') + c), 2)\n"
    "with name_scope('dense'):\n"
    "    logits = reshape(h, (-1, 64)) @ variable('w', shape=(64, 10)) + variable('b', shape=(10,), init='zeros')\n"
    "loss = mean(softmax_cross_entropy(logits, y))\ntrain = Adam(0.01).minimize(loss)",
    "%%flow mlp6\n"
    "h = placeholder('x', shape=(None, 64))\ny = placeholder('y', shape=(None,), dtype='int64')\n"
    "for i, units in enumerate([64, 48, 32, 32, 16, 10], start=1):\n"
    "    with name_scope(f'layer{i}'):\n"
    "        h = matmul(h, variable('w', shape=(h.shape[1], units))) + variable('b', shape=(units,))\n"
    "        h = relu(h) if i < 6 else h\n"
    "loss = mean(softmax_cross_entropy(h, y))\nacc = accuracy(h, y)\ntrain = SGD(0.1).minimize(loss)",
    "import workbench as wb\nfrom sklearn.datasets import load_digits\ndigits = load_digits()\n"
    "history = wb.Session(mlp6, seed=0).fit(mlp6.train, data={'x': (digits.data / 16).astype('float32'),"
    " 'y': digits.target}, batch_size=64, steps=150, fetches={'loss': mlp6.loss, 'accuracy': mlp6.acc})",
]

# Each scope box (in the drawing's own coordinates) against every node: members inside, others outside.
BOX_CHECK = """(view) => {
    const num = (e, a) => Number(e.getAttribute(a));
    const nodes = [...view.querySelectorAll('g.wb-node')].map((g) => {
        const [x, y] = g.getAttribute('transform').match(/-?[0-9.]+/g).map(Number);
        const r = g.querySelector('.wb-shape');
        return { id: g.dataset.id, x, y, w: num(r, 'width'), h: num(r, 'height') };
    });
    const bad = [];
    for (const s of view.querySelectorAll('g.wb-scope')) {
        const r = s.querySelector('rect.wb-box');
        const b = { x: num(r, 'x'), y: num(r, 'y'), w: num(r, 'width'), h: num(r, 'height') };
        for (const n of nodes) {
            const member = n.id.startsWith(s.dataset.scope + '/');
            const inside = b.x <= n.x && n.x + n.w <= b.x + b.w && b.y <= n.y && n.y + n.h <= b.y + b.h;
            const touches = n.x < b.x + b.w && b.x < n.x + n.w && n.y < b.y + b.h && b.y < n.y + n.h;
            if (member ? !inside : touches) bad.push(`${s.dataset.scope}: ${n.id}`);
        }
    }
    return { nodes: nodes.length, boxes: view.querySelectorAll('g.wb-scope').length, bad };
}"""


def test_graph_views_of_a_cnn_and_a_deep_mlp_fold_search_zoom_and_box_only_members(lab, tmp_path):
    with notebook_page(lab, "models", MODELS_NOTEBOOK, height=1500) as page:
        page.locator(".wb-graph").nth(1).wait_for(timeout=60_000)
        wait_for_last_cell(page)
        cnn, mlp = (page.locator(".wb-view").filter(has=page.locator(".wb-graph")).nth(i) for i in (0, 1))
        # Folded at first: the conv and dense scopes, gradients and Adam are single nodes.
        for scope in ("conv1", "conv2", "dense", "gradients", "Adam"):
            assert cnn.locator(f"g.wb-node[data-kind='scope'][data-id='{scope}']").count() == 1, scope
        page.screenshot(path=str(tmp_path / "graphs-folded.png"))

        # Search reveals an op inside a folded scope, highlighted; the others stay folded.
        cnn.locator("input.wb-search").fill("conv2/conv2d")
        cnn.locator("input.wb-search").press("Enter")
        cnn.locator("g.wb-node.wb-highlight[data-id='conv2/conv2d']").wait_for(timeout=15_000)
        assert cnn.locator("g.wb-scope[data-scope='conv2']").count() == 1
        assert cnn.locator("g.wb-node[data-kind='scope'][data-id='conv1']").count() == 1
        assert "conv2/conv2d" in cnn.locator(".wb-details").inner_text()
        cnn.screenshot(path=str(tmp_path / "cnn-search.png"))

        # Unfold everything, a level at a time: every box holds its members and nothing else.
        for _ in range(4):
            cnn.locator("button", has_text="unfold one level").click()
        page.wait_for_function("(v) => v.querySelectorAll('g.wb-node').length > 100",
                               arg=cnn.element_handle(), timeout=15_000)  # fmt: skip
        result = cnn.evaluate(BOX_CHECK)
        assert result["boxes"] >= 5 and result["bad"] == [], result
        svg = cnn.locator("svg.wb-svg")
        canvas = cnn.locator(".wb-canvas").bounding_box()
        zoom = float(svg.get_attribute("data-zoom"))
        assert zoom >= 0.55 - 1e-3  # opening scopes keeps a readable zoom: a wider drawing scrolls
        assert svg.bounding_box()["width"] <= canvas["width"] or zoom == pytest.approx(0.55, abs=1e-3)
        cnn.locator("button", has_text="+").click()
        assert float(svg.get_attribute("data-zoom")) == pytest.approx(zoom * 1.25, rel=1e-2)
        cnn.locator("button", has_text="fit width").click()
        assert svg.bounding_box()["width"] <= canvas["width"] + 1  # the button fits the whole width
        cnn.screenshot(path=str(tmp_path / "cnn-unfolded.png"))
        cnn.locator("button[title='fold every name scope']").click()
        page.wait_for_function("(v) => v.querySelectorAll('g.wb-node').length < 15",
                               arg=cnn.element_handle(), timeout=15_000)  # fmt: skip

        # The 6-layer MLP: layers folded, then opened one by one inside their own boxes.
        assert mlp.locator("g.wb-node[data-kind='scope']").count() == 8  # 6 layers, gradients, SGD
        assert mlp.locator("g.wb-node[data-id='accuracy']").count() == 1
        for i in range(1, 7):
            mlp.locator(f"g.wb-node[data-id='layer{i}']").click()
            mlp.locator(f"g.wb-scope[data-scope='layer{i}']").wait_for(timeout=15_000)
        result = mlp.evaluate(BOX_CHECK)
        assert result["boxes"] == 6 and result["bad"] == [], result
        mlp.scroll_into_view_if_needed()
        mlp.screenshot(path=str(tmp_path / "mlp6-layers-open.png"))

        # Its training: the median samples/s in the headline, a log scale and smoothing of the curves.
        training = page.locator(".wb-training").first
        training.locator(".wb-progress[data-status='done']").wait_for(timeout=60_000)
        assert "samples/s (median)" in training.locator(".wb-progress-text").inner_text()
        loss = training.locator("svg[data-curve='loss']")
        assert loss.get_attribute("data-scale") == "linear" and loss.locator("path.wb-smooth").count() == 1
        smooth = loss.locator("path.wb-smooth").get_attribute("d")
        training.locator("input.wb-log").check()
        page.wait_for_function("() => document.querySelector(\".wb-training svg[data-curve='loss']\")"
                               ".getAttribute('data-scale') === 'log'", timeout=10_000)  # fmt: skip
        training.locator("input.wb-smoothing").fill("0.95")
        assert training.locator("svg[data-curve='loss'] path.wb-smooth").get_attribute("d") != smooth
        assert training.locator("svg[data-curve='accuracy'] path.wb-line").count() == 2  # raw and smoothed
        training.scroll_into_view_if_needed()
        training.screenshot(path=str(tmp_path / "mlp6-training.png"))


PLAYGROUND_NOTEBOOK = [
    "from workbench.widgets.playground import Playground\n"
    "app = Playground(dataset='xor', hidden=(4, 2), learning_rate=0.1, size=260, resolution=60)\napp",
]


def test_playground_draws_the_network_and_updates_it_live(lab, tmp_path):
    with notebook_page(lab, "playground", PLAYGROUND_NOTEBOOK, width=1400, height=1100) as page:
        app = page.locator(".wb-playground").first
        app.locator("svg.wb-playground-network").wait_for(timeout=60_000)
        wait_for_last_cell(page)
        network = app.locator("svg.wb-playground-network")
        assert network.locator("g.wb-feature").count() == 2 and network.locator("g.wb-neuron").count() == 6
        assert network.locator("path.wb-weight").count() == 2 * 4 + 4 * 2 + 2
        assert app.locator("svg.wb-playground-loss .wb-legend-item").count() == 2
        # Every heat map is a decoded image, not a broken one.
        sizes = network.evaluate("(svg) => [...svg.querySelectorAll('image')].map((i) => i.getBBox().width)")
        assert sizes and min(sizes) == 40
        before = network.inner_html()
        page.screenshot(path=str(tmp_path / "playground-start.png"))

        # Training from the Play button redraws the network (weights and heat maps change).
        app.locator("button", has_text="Play").click()
        page.wait_for_function(
            "() => /step [1-9][0-9,]* /.test(document.querySelector('.wb-playground-status').textContent)",
            timeout=30_000,
        )
        page.wait_for_timeout(1500)
        app.locator("button", has_text="Pause").click()
        assert network.inner_html() != before

        # + adds a hidden layer; a layer's - removes a neuron: the drawing follows.
        app.locator("button.wb-playground-plus").first.click()
        page.wait_for_function("() => document.querySelectorAll('.wb-playground-network g.wb-neuron').length === 8",
                               timeout=15_000)  # fmt: skip
        app.locator(".wb-playground-layer-buttons").first.locator("button.wb-playground-minus").click()
        page.wait_for_function("() => document.querySelectorAll('.wb-playground-network g.wb-neuron').length === 7",
                               timeout=15_000)  # fmt: skip
        assert "3 hidden layers" in app.inner_text()
        app.locator("button", has_text="Step").click()
        page.wait_for_timeout(1000)
        page.screenshot(path=str(tmp_path / "playground-trained.png"))


def test_dashboard_workbench_page_follows_a_fit(tmp_path):
    """The Workbench page of a local cluster's dashboard, opened in Chromium while the digits MLP trains
    on two workers: the fit's title, loss curve and phase timeline update live."""
    chromium = ensure_chromium()
    import threading

    from playwright.sync_api import sync_playwright
    from sklearn.datasets import load_digits

    import workbench as wb
    from workbench.dashboard import forward, stop

    digits = load_digits()
    data = {"x": (digits.data / 16).astype("float32"), "y": digits.target.astype("int64")}
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(
            wb.matmul(x, wb.variable("w1", shape=(64, 32), init="glorot_uniform")) + wb.variable("b1", shape=(32,))
        )
        loss = wb.mean(
            wb.softmax_cross_entropy(wb.matmul(h, wb.variable("w2", shape=(32, 10), init="glorot_uniform")), y)
        )
        train = wb.optimizers.SGD(0.1).minimize(loss)
    client = wb.cluster.connect("local", n_workers=2)
    forward()
    errors: list = []
    try:
        client.wait_for_workers(2, timeout=60)
        page_url = client.dashboard_link.rsplit("/", 1)[0] + "/individual-workbench"
        sess = wb.Session(g, seed=0, cluster=client)

        seen = threading.Event()  # the page showed the fit running

        def pace(record):  # steps slow (0.2 s) until the page has seen the fit run: 300 fast steps can end first
            if not seen.is_set():
                seen.wait(0.2)

        def fit():
            try:
                sess.fit(train, data, batch_size=64, steps=300, replicas=2, fetches={"loss": loss}, callback=pace)
            except Exception as e:  # noqa: BLE001 - reported by the test below
                errors.append(e)

        trainer = threading.Thread(target=fit, name="dashboard-fit")
        trainer.start()
        with sync_playwright() as pw:
            browser = launch(pw, chromium)
            try:
                page = browser.new_page(viewport={"width": 1100, "height": 720})
                page.goto(page_url, wait_until="domcontentloaded")
                title = page.locator(".wb-fit-title")
                title.filter(has_text="running").first.wait_for(timeout=60_000)  # live, during the fit
                assert "steps/s" in title.first.inner_text()
                seen.set()
                trainer.join(timeout=120)
                title.filter(has_text="done · step 300 / 300").first.wait_for(timeout=30_000)
                assert page.locator("canvas").count() >= 1
                page.wait_for_timeout(1000)  # the last redraw of the plots
                clip = {"x": 0, "y": 0, "width": 1060, "height": 430}  # the page's content, not the empty rest
                page.screenshot(path=str(tmp_path / "dashboard.png"), clip=clip)
                if os.environ.get("WORKBENCH_UPDATE_SCREENSHOT") == "1":
                    README_DASHBOARD.parent.mkdir(exist_ok=True)
                    page.screenshot(path=str(README_DASHBOARD), clip=clip)
            finally:
                seen.set()
                browser.close()
    finally:
        stop()
        wb.cluster.close(client)
    assert not errors, errors
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


STATS_NOTEBOOK = [
    "%load_ext workbench",
    "%%flow deep\n"
    "h = placeholder('x', shape=(None, 64))\ny = placeholder('y', shape=(None,), dtype='int64')\n"
    "for i, units in enumerate([32, 16, 10], start=1):\n"
    "    with name_scope(f'layer{i}'):\n"
    "        h = matmul(h, variable('w', shape=(h.shape[1], units), init='glorot_uniform')) + variable('b', shape=(units,))\n"
    "        h = relu(h) if i < 3 else h\n"
    "loss = mean(softmax_cross_entropy(h, y))\nacc = accuracy(h, y)\ntrain = SGD(0.2).minimize(loss)",
    "import workbench as wb\nfrom sklearn.datasets import load_digits\ndigits = load_digits()\n"
    "x, y = (digits.data / 16).astype('float32'), digits.target\n"
    "x_train = x[:1400].copy()\nx_train[::97] *= 30  # a few corrupted images: the batches holding them spike\n"
    "sess = wb.Session(deep, seed=0)\n"
    "history = sess.fit(deep.train, data={'x': x_train, 'y': y[:1400]}, batch_size=32, steps=120,"
    " fetches={'loss': deep.loss, 'accuracy': deep.acc}, validation=({'x': x[1400:], 'y': y[1400:]}, 10), stats=2)",
    "norms = {s: v['layer1/w/grad_norm'] for s, v in history.stats.items()}\nspike = max(norms, key=norms.get)\n"
    "layer = history.stats[spike]['layer1/w/grad_norm'] + history.stats[spike]['layer1/b/grad_norm']\n"
    "print(f'spike at step {spike}: {norms[spike]:.6g} layer {layer:.6g}')",
]


def test_validation_curve_and_live_statistics_with_the_scrubber(lab, tmp_path):
    with notebook_page(lab, "stats", STATS_NOTEBOOK, height=1500) as page:
        training = page.locator(".wb-training").first
        training.locator(".wb-progress[data-status='done']").wait_for(timeout=90_000)
        wait_for_last_cell(page)
        printed = page.locator(".jp-OutputArea-output", has_text="spike at step").first.inner_text()
        spike, norm, layer_norm = re.search(r"spike at step (\d+): (\S+) layer (\S+)", printed).groups()
        spike, norm, layer_norm = int(spike), float(norm), float(layer_norm)

        # The validation curve in the loss chart, with a legend; and in the accuracy chart.
        loss = training.locator("svg[data-curve='loss']")
        assert loss.locator("path.wb-val").count() == 1 and loss.locator("circle.wb-val-point").count() == 12
        assert loss.locator(".wb-legend-item").all_text_contents() == ["train", "validation"]
        assert training.locator("svg[data-curve='accuracy'] path.wb-val").count() == 1
        assert " · val " in loss.locator("text").first.text_content()

        # The graph view of the %%flow cell: linked to the fit, filled by each layer's gradient norm.
        graph = page.locator(".wb-view").filter(has=page.locator(".wb-graph")).first
        bar = graph.locator(".wb-stats")
        assert bar.is_visible() and graph.locator("select.wb-stat").input_value() == "grad_norm"
        assert graph.locator("g.wb-node[data-stat]").count() == 3  # the three folded layers
        assert bar.locator(".wb-stat-step").get_attribute("data-step") == "120"
        page.screenshot(path=str(tmp_path / "stats-latest.png"))

        # Clicking the loss curve at the spike shows that step's statistics: layer1's gradient norm blew up.
        box = loss.bounding_box()
        x = 44 + (spike - 1) / (120 - 1) * (260 - 44 - 8)  # the chart's own x scale (260 px wide, margins 44 and 8)
        loss.click(position={"x": x * box["width"] / 260, "y": 60})
        page.wait_for_function("(s) => document.querySelector('.wb-stats .wb-stat-step').dataset.step === String(s)",
                               arg=spike, timeout=15_000)  # fmt: skip
        assert training.locator(f"svg[data-curve='loss'] line.wb-marker[data-step='{spike}']").count() == 1
        layer1 = graph.locator("g.wb-node[data-id='layer1']")  # folded: the sum of its gradient norms
        assert float(layer1.get_attribute("data-stat")) == pytest.approx(layer_norm, rel=1e-4)
        values = [float(v) for v in graph.locator("g.wb-node[data-stat]").evaluate_all(
            "(nodes) => nodes.map((n) => n.dataset.stat)")]  # fmt: skip
        assert max(values) == float(layer1.get_attribute("data-stat"))
        layer1.click()  # a folded scope opens: its variables show their own norms, the statistics ops stay folded
        graph.locator("g.wb-node[data-id='layer1/w'][data-stat]").wait_for(timeout=15_000)
        assert float(graph.locator("g.wb-node[data-id='layer1/w']").get_attribute("data-stat")) == pytest.approx(
            norm, rel=1e-4
        )
        assert graph.locator("g.wb-node[data-kind='scope'][data-id='stats']").count() == 1
        graph.locator("g.wb-node[data-id='layer1/w']").click()  # its details name the statistic
        assert f"gradient norm at step {spike}" in graph.locator(".wb-details").inner_text()
        graph.scroll_into_view_if_needed()
        page.screenshot(path=str(tmp_path / "stats-spike.png"))

        # The scrubber: the first recorded step, marked on the training view's curves too.
        graph.locator("input.wb-scrubber").evaluate("(s) => { s.value = '0'; s.dispatchEvent(new Event('input')); }")
        training.locator("line.wb-marker[data-step='2']").first.wait_for(state="attached", timeout=15_000)
        assert bar.locator(".wb-stat-step").get_attribute("data-step") == "2"
        graph.locator("select.wb-stat").select_option("std")
        page.wait_for_function("() => document.querySelector('.wb-stats .wb-stat-scale').textContent.includes('activation std')",
                               timeout=15_000)  # fmt: skip
        assert graph.locator("g.wb-node[data-stat]").count() >= 3
        page.screenshot(path=str(tmp_path / "stats-scrubbed.png"))

        # Fold all folds everything, the statistics the fit added included; unfold one level opens the
        # outermost scopes only (the statistics' own scopes stay folded).
        graph.locator("button", has_text="fold all").click()
        page.wait_for_function(
            "() => !document.querySelector('.wb-graph g.wb-node[data-id=\"layer1/w\"]')", timeout=15_000
        )
        ids = graph.locator("g.wb-node").evaluate_all("(nodes) => nodes.map((n) => n.dataset.id)")
        assert "stats" in ids and all("/" not in i for i in ids), ids  # only top-level nodes: every scope folded
        assert "scopes folded" in graph.locator(".wb-title").first.inner_text()
        graph.locator("button", has_text="unfold one level").click()
        graph.locator("g.wb-node[data-id='layer1/w']").wait_for(timeout=15_000)
        ids = graph.locator("g.wb-node").evaluate_all("(nodes) => nodes.map((n) => n.dataset.id)")
        assert "stats" not in ids and any(i.startswith("stats/") for i in ids), ids
        assert not any(i.count("/") > 1 and i.startswith("stats/") for i in ids), ids  # one level only


CLOSE_NOTEBOOK = [
    "%load_ext workbench",
    "%flow_cluster local -n 1",
    "import time; time.sleep(1)",
    "%flow_cluster close",
]


def test_cluster_view_says_closed_after_the_cluster_closes(lab, tmp_path):
    with notebook_page(lab, "close", CLOSE_NOTEBOOK) as page:
        wait_for_last_cell(page)
        cluster = page.locator(".wb-cluster").first
        page.wait_for_function("() => /· closed/.test(document.querySelector('.wb-cluster .wb-title').textContent)",
                               timeout=30_000)  # fmt: skip
        assert cluster.locator("a").count() == 0 and cluster.locator("table").count() == 0  # no live workers, no link
        assert "closed" in page.locator(".wb-cluster").nth(1).inner_text()  # the close cell's own view
        page.screenshot(path=str(tmp_path / "closed.png"))


REOPEN_NOTEBOOK = [
    "%load_ext workbench",
    "%%flow mlp\nx = placeholder('x', shape=(None, 4))\ny = placeholder('y', shape=(None,), dtype='int64')\n"
    "w = variable('w', shape=(4, 3))\nloss = mean(softmax_cross_entropy(matmul(x, w), y))\ntrain = SGD(0.1).minimize(loss)",
    "import numpy as np\nimport workbench as wb\nsess = wb.Session(mlp)\n"
    "h = sess.fit(mlp.train, {'x': np.ones((32, 4), 'float32'), 'y': np.zeros(32, 'int64')}, batch_size=8, steps=20,"
    " fetches={'loss': mlp.loss})",
]


def test_a_reopened_notebook_shows_the_pictures_of_its_views(lab, tmp_path):
    chromium = ensure_chromium()
    from playwright.sync_api import sync_playwright

    url, token, _ = lab
    with notebook_page(lab, "reopen", REOPEN_NOTEBOOK) as page:
        wait_for_last_cell(page)
        page.locator(".wb-training .wb-progress[data-status='done']").wait_for(timeout=60_000)
        assert page.locator(".wb-graph").count() == 1 and page.locator(".wb-training").count() == 1
        assert page.locator(".wb-saved-picture").count() == 2
        assert not page.locator(".wb-saved-picture").first.is_visible()  # live: the views, not their pictures
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
        page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        page.wait_for_timeout(2000)
    with sync_playwright() as pw:  # JupyterLab's default settings: no widget state saved, a fresh kernel
        browser = launch(pw, chromium)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1600})
            goto_notebook(page, url, token, "reopen")
            pictures = page.locator(".wb-saved-picture")
            pictures.first.wait_for(state="visible", timeout=60_000)
            page.wait_for_timeout(3000)  # the widget manager has given up on the models by now
            page.screenshot(path=str(tmp_path / "reopened.png"))
            assert pictures.count() == 2 and all(pictures.nth(i).is_visible() for i in range(2))
            assert "run the cell again for the live view" in pictures.first.inner_text()
            errors = page.get_by_text("Error displaying widget")
            shown = [i for i in range(errors.count()) if errors.nth(i).is_visible()]
            assert not shown, page.evaluate(
                "() => [...document.querySelectorAll('.jp-OutputArea-child')].map((c) => c.outerHTML.slice(0, 300))"
            )
            alts = [pictures.nth(i).locator("img").get_attribute("alt") for i in range(2)]
            assert alts[0].startswith("graph mlp · ") and alts[1].startswith("training · 20 steps · done · loss ")
        finally:
            browser.close()


STOP_NOTEBOOK = [
    "import numpy as np\nimport workbench as wb\n"
    "g = wb.Graph(name='mlp')\nwith g.as_default():\n"
    "    x = wb.placeholder('x', shape=(None, 6))\n    y = wb.placeholder('y', shape=(None,), dtype='int64')\n"
    "    w = wb.variable('w', shape=(6, 3))\n    loss = wb.mean(wb.softmax_cross_entropy(wb.matmul(x, w), y))\n"
    "    train = wb.optimizers.Adam(0.05).minimize(loss)\n"
    "rng = np.random.default_rng(0)\ndata = {'x': rng.normal(size=(256, 6)), 'y': rng.integers(0, 3, 256)}\n"
    "sess = wb.Session(g, seed=0)",
    "history = sess.fit(train, data, batch_size=32, steps=10_000_000, fetches={'loss': loss})",
    "print('steps done', len(history.records))",
]


def test_the_stop_button_ends_a_running_fit_after_its_current_step(lab, tmp_path):
    with notebook_page(lab, "stop", STOP_NOTEBOOK, wait=False) as page:
        view = page.locator(".wb-training").first
        view.locator(".wb-progress-text").wait_for(timeout=60_000)
        page.wait_for_function(  # steps are running
            "() => /step [1-9][0-9]* \\//.test(document.querySelector('.wb-training .wb-progress-text').textContent)",
            timeout=30_000,
        )
        view.locator("button.wb-stop").click()
        page.wait_for_function(
            "() => /stopped at step [1-9]/.test(document.querySelector('.wb-training .wb-title').textContent)",
            timeout=30_000,
        )
        wait_for_last_cell(page)
        assert not view.locator("button.wb-stop").is_visible()  # nothing left to stop
        page.screenshot(path=str(tmp_path / "stopped.png"))
        done = int(page.locator(".jp-OutputArea-output", has_text="steps done").inner_text().split()[-1])
        title = view.locator(".wb-title").inner_text()
        assert 0 < done < 10_000_000 and f"stopped at step {done}" in title
        progress = view.locator(".wb-progress-text").inner_text()
        assert f"step {done} / 10000000" in progress  # the bar agrees with the title


TIMELINE_NOTEBOOK = [
    "%load_ext workbench",
    "%flow_cluster local -n 2",
    "%%flow mlp\nx = placeholder('x', shape=(None, 64))\ny = placeholder('y', shape=(None,), dtype='int64')\n"
    "w = variable('w', shape=(64, 10), init='glorot_uniform')\nloss = mean(softmax_cross_entropy(matmul(x, w), y))\n"
    "train = SGD(0.1).minimize(loss)",
    "import workbench as wb\nfrom sklearn.datasets import load_digits\n"
    "digits = load_digits()\nsess = wb.Session(mlp, seed=0)\n"
    "history = sess.fit(mlp.train, data={'x': (digits.data / 16).astype('float32'), 'y': digits.target},"
    " batch_size=64, steps=40, fetches={'loss': mlp.loss}, strategy='allreduce',"
    " stragglers=wb.stragglers.Fixed(1, 0.1))",
]


def test_timeline_view_is_live_during_a_cluster_fit_and_follows_the_training_views_clicks(lab, tmp_path):
    with notebook_page(lab, "timeline", TIMELINE_NOTEBOOK, height=1500, wait=False) as page:
        timeline = page.locator(".wb-timeline").first
        timeline.locator("rect.wb-span").first.wait_for(timeout=120_000)
        training = page.locator(".wb-training").first
        # live: lanes drawn while the fit still runs
        assert training.locator(".wb-progress[data-status='done']").count() == 0
        assert timeline.get_attribute("data-status") == "running"
        page.screenshot(path=str(tmp_path / "timeline-live.png"))
        training.locator(".wb-progress[data-status='done']").wait_for(timeout=120_000)
        page.wait_for_function("() => document.querySelector('.wb-timeline').dataset.status === 'done'", timeout=30_000)
        assert timeline.locator("line.wb-wait-arrow").count() > 0  # the waits point at the late worker
        late = timeline.locator("rect.wb-wait").first.get_attribute("data-worker")
        assert late and timeline.locator(".wb-timeline-stragglers").inner_text().startswith("waited for most: ")
        timeline.locator("rect.wb-wait").first.hover()
        assert "waiting for" in timeline.locator(".wb-timeline-hover").inner_text()
        # a click on the loss curve at step 10: the timeline scrolls back to it and outlines its spans
        loss = training.locator("svg[data-curve='loss']")
        box = loss.bounding_box()
        x = 44 + (10 - 1) / (40 - 1) * (260 - 44 - 8)
        loss.click(position={"x": x * box["width"] / 260, "y": 60})
        timeline.locator("rect.wb-span.wb-selected").first.wait_for(timeout=15_000)
        step = int(timeline.locator("rect.wb-span.wb-selected").first.get_attribute("data-step"))
        assert abs(step - 10) <= 1
        first, last = (int(s) for s in timeline.get_attribute("data-shown").split("-"))
        assert first <= step <= last < 40
        page.screenshot(path=str(tmp_path / "timeline-selected.png"))
        # a click on a span selects its step in the training view
        spans = timeline.locator(f"rect.wb-span[data-step='{first}']")  # its widest: a thin one can be covered
        widths = spans.evaluate_all("rects => rects.map(r => r.getBBox().width)")
        spans.nth(widths.index(max(widths))).click()
        training.locator(f"svg[data-curve='loss'] line.wb-marker[data-step='{first}']").wait_for(
            state="attached", timeout=15_000
        )
