"""The %%flow and %flow_cluster magics in a real IPython shell, and in a real kernel (slow)."""

import re

import dask
import numpy as np
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import workbench as wb
from workbench import cluster as wb_cluster
from workbench.widgets import GraphView

EXAMPLE = """%%flow mlp
x = placeholder("x", shape=(None, 64))
y = placeholder("y", shape=(None,), dtype="int64")
w = variable("w", shape=(64, 10), init="glorot_uniform")
b = variable("b", shape=(10,), init="zeros")
loss = mean(softmax_cross_entropy(matmul(x, w) + b, y))
train = optimizers.SGD(0.1).minimize(loss)
"""


@pytest.fixture
def ip(monkeypatch):
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "workbench")
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *objs, **kw: shown.extend(objs))
    shell.shown = shown
    yield shell
    for name in ("mlp", "bad", "data", "other"):
        shell.user_ns.pop(name, None)


def run(ip, cell):
    result = ip.run_cell(cell)
    return result.error_in_exec or result.error_before_exec


def test_the_issue_example(ip):
    assert run(ip, "%load_ext workbench") is None
    assert run(ip, EXAMPLE) is None
    mlp = ip.user_ns["mlp"]
    assert isinstance(mlp, wb.Graph) and mlp.name == "mlp"
    assert mlp.loss.op.type == "mean" and mlp.loss.shape == ()
    assert isinstance(mlp.train, wb.Operation) and mlp.train.name == "SGD/update"
    assert isinstance(mlp.w, wb.Variable) and mlp.x.op.type == "placeholder"
    assert "placeholder" not in ip.user_ns  # ops are in scope in the cell, not added to the user's names
    (view,) = ip.shown
    assert isinstance(view, GraphView) and view.graph is mlp and view.collapsed == ["SGD", "gradients"]
    sess = wb.Session(mlp)
    history = sess.fit(mlp.train, {"x": np.zeros((32, 64)), "y": np.zeros(32, "int64")}, batch_size=8, steps=2)
    assert len(history) == 2


def test_operations_remember_their_line_in_the_cell(ip):
    run(ip, EXAMPLE)
    source = ip.user_ns["mlp"].w.op.source
    assert source.lineno == 4  # the %%flow line is line 1, as the notebook shows the cell
    assert source.code == 'w = variable("w", shape=(64, 10), init="glorot_uniform")'


def test_rerunning_replaces_the_graph(ip):
    run(ip, EXAMPLE)
    first = ip.user_ns["mlp"]
    run(ip, EXAMPLE)
    second = ip.user_ns["mlp"]
    assert second is not first and len(second.operations) == len(first.operations)
    assert not ip.shown[0].following and ip.shown[1].following  # the old view stopped listening


def test_an_old_session_after_rerunning_the_cell_says_the_graph_was_rebuilt(ip):
    run(ip, EXAMPLE)
    sess = wb.Session(ip.user_ns["mlp"])
    run(ip, EXAMPLE)
    mlp = ip.user_ns["mlp"]
    feeds = {"x": np.zeros((4, 64), "float32"), "y": np.zeros(4, "int64")}
    rebuilt = r"the graph 'mlp' was rebuilt by re-running %%flow mlp; create a new Session"
    with pytest.raises(wb.GraphError, match=rebuilt):
        sess.run(mlp.loss, feeds)
    with pytest.raises(wb.FeedError, match=rebuilt + r" \(feed key 'x' belongs to graph"):
        sess.run("mean", {mlp.x: feeds["x"], "y": feeds["y"]})
    assert np.isfinite(wb.Session(mlp).run(mlp.loss, feeds))  # a new session runs the new graph


def test_accuracy_and_argmax_are_in_a_flow_cell(ip):
    cell = EXAMPLE + "\nlogits = matmul(x, w) + b\nacc = accuracy(logits, y)\nguess = argmax(logits, axis=1)\n"
    assert run(ip, cell) is None
    mlp = ip.user_ns["mlp"]
    assert mlp.acc.op.type == "mean" and mlp.guess.dtype == "int64" and mlp.guess.shape == (None,)


def test_user_names_are_visible_and_reductions_have_tf1_names(ip):
    ip.user_ns["data"] = np.ones((3, 4), "float32")
    cell = "%%flow other -q\nc = constant(data)\ns = reduce_sum(c, axis=1)\nbig = reduce_max(s)\nlow = wb.min(s)\n"
    assert run(ip, cell) is None
    g = ip.user_ns["other"]
    assert g.c.shape == (3, 4) and g.s.op.type == "sum" and g.big.op.type == "max" and g.low.op.type == "min"
    assert ip.shown == []  # -q: no view


def test_flow_cells_leave_python_builtins_alone(ip):
    import builtins

    from workbench.magics import flow_namespace

    names = flow_namespace()
    for name in ("sum", "max", "min", "abs", "all", "any", "pow", "round"):
        assert name not in names, name
    ip.user_ns["data"] = np.ones((3, 4), "float32")
    cell = (
        "%%flow other -q\nparts = [constant(data) * k for k in range(3)]\ntotal = sum(a for a in parts)\n"
        "n = sum(len(p) for p in parts)\nbiggest = max(3, 7)\nlow = min([4, 2])\nflag = all([True, 1]) and any([0, 1])\n"
        "p = pow(2, 5)\nr = round(2.6)\nm = abs(-3)\n"
    )
    assert run(ip, cell) is None
    g = ip.user_ns["other"]
    assert g.total.op.type == "add" and g.total.shape == (3, 4)
    assert (ip.user_ns.get("n"), ip.user_ns.get("biggest")) == (None, None)  # cell names stay in the cell
    assert builtins.sum is sum


@pytest.mark.parametrize(
    "code, says",
    [
        (
            "s = sum(c, axis=1)",
            r"sum\(\.\.\.\) here is Python's sum: for a reduction write reduce_sum\(c, axis=1\) or wb\.sum",
        ),
        ("s = max(c)", r"max\(\.\.\.\) here is Python's max: for a reduction write reduce_max\(c\) or wb\.max\(c\)"),
        (
            "s = all(c > 0.0, axis=0)",
            r"all\(\.\.\.\) here is Python's all: for a reduction write reduce_all\(c > 0\.0, axis=0\) or wb\.all",
        ),
    ],
)
def test_old_reduction_names_in_a_flow_cell_say_what_to_write(ip, code, says):
    ip.user_ns["data"] = np.ones((3, 4), "float32")
    error = run(ip, f"%%flow other -q\nc = constant(data)\n{code}\n")
    assert isinstance(error, wb.WorkbenchError)
    report = error.flow_report
    assert report.splitlines()[:2] == ["%%flow other, line 3:", f"    {code}"]
    assert re.search(says, report), report
    assert len(report.splitlines()) == 3  # the cell's line, its code and the message: no frames of workbench


def test_a_graph_build_error_reports_the_cell_line_without_internals(ip):
    cell = '%%flow bad\nx = placeholder("x", shape=(None, 64))\nw = variable("w", shape=(32, 10))\nh = matmul(x, w)\n'
    error = run(ip, cell)
    assert isinstance(error, wb.ShapeError)
    report = error._render_traceback_()
    assert report[0] == "%%flow bad, line 4:"
    assert report[1].strip() == "h = matmul(x, w)"
    assert report[2].startswith("ShapeError: matmul 'matmul': inner dimensions differ")
    assert "workbench" not in "\n".join(report).replace("%%flow", "")
    assert "bad" not in ip.user_ns  # a failed cell binds nothing


def test_other_errors_show_only_the_cells_frames(ip):
    error = run(ip, "%%flow bad\nx = placeholder('x')\nz = undefined_name + 1\n")
    assert isinstance(error, NameError)
    report = "\n".join(error._render_traceback_())
    assert "line 3" in report and "undefined_name" in report and "magics.py" not in report


def test_syntax_errors_name_the_cell_line(ip):
    error = run(ip, "%%flow bad\nx = placeholder('x'\n")
    assert isinstance(error, SyntaxError) and error.lineno == 2


@pytest.mark.parametrize("line", ["%%flow", "%%flow 1mlp", "%%flow mlp --nope", "%%flow mlp extra"])
def test_bad_flow_arguments_are_usage_errors(ip, line):
    assert isinstance(run(ip, f"{line}\nx = 1\n"), UsageError)


def test_flow_help_comes_from_magic_arguments(ip):
    doc = ip.find_cell_magic("flow").__doc__
    assert "usage: %flow [-q] [--expand] name" in doc.replace("\n", " ") or "--expand" in doc


@pytest.mark.parametrize(
    "line, message",
    [("foo", "not 'local', 'close' or a scheduler address"), ("local -n 0", "positive number"),
     ("tcp://h:1 -n 2", "local cluster only"), ("local -n x", "invalid int value")],
)  # fmt: skip
def test_bad_cluster_arguments_are_usage_errors(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("flow_cluster", line)


@pytest.fixture
def fake_cluster(monkeypatch):
    calls = []
    state = {"client": None}
    info = {"scheduler": "tcp://127.0.0.1:1", "dashboard": "http://127.0.0.1:2/status",
            "workers": [{"address": "tcp://127.0.0.1:3", "name": "0", "threads": 1, "memory": 1, "gpus": 0}]}  # fmt: skip

    def set_default(target, **kwargs):
        calls.append(("set_default", target, kwargs))
        state["client"] = object()
        return state["client"]

    def close_default():
        calls.append(("close_default",))
        had, state["client"] = state["client"], None
        return "disconnected from tcp://127.0.0.1:1; that cluster keeps running" if had else None

    monkeypatch.setattr(wb_cluster, "set_default", set_default)
    monkeypatch.setattr(wb_cluster, "close_default", close_default)
    monkeypatch.setattr(wb_cluster, "default_client", lambda: state["client"])
    monkeypatch.setattr(wb_cluster, "info", lambda client: info)
    return calls


def test_flow_cluster_sets_shows_and_closes_the_default(ip, fake_cluster):
    view = ip.run_line_magic("flow_cluster", "local -n 2")
    assert fake_cluster[-1] == ("set_default", "local", {"n_workers": 2})
    assert view.info["dashboard"] == "http://127.0.0.1:2/status"
    assert ip.run_line_magic("flow_cluster", "").info["workers"][0]["threads"] == 1
    ip.run_line_magic("flow_cluster", "tcp://10.0.0.1:8786")
    assert fake_cluster[-1] == ("set_default", "tcp://10.0.0.1:8786", {"n_workers": None})
    view = ip.run_line_magic("flow_cluster", "close")
    assert view.info is None and "keeps running" in view.message
    assert fake_cluster[-1] == ("close_default",)
    assert "no default cluster" in ip.run_line_magic("flow_cluster", "close").message


@pytest.mark.parametrize(
    "configured, expected", [(None, "local"), ("local", "local"), ("tcp://10.0.0.2:8786", "tcp://10.0.0.2:8786")]
)
def test_flow_cluster_without_argument_uses_the_configured_default(ip, fake_cluster, configured, expected):
    with dask.config.set({"workbench.cluster.address": configured} if configured else {}):
        view = ip.run_line_magic("flow_cluster", "")
        assert fake_cluster[-1] == ("set_default", expected, {"n_workers": None})
        assert view.info["workers"][0]["threads"] == 1 and expected in view.message
        ip.run_line_magic("flow_cluster", "")  # a default is set now: shown, not replaced
        assert len(fake_cluster) == 1
        ip.run_line_magic("flow_cluster", "-n 3")  # -n: a local cluster of that size
        assert fake_cluster[-1] == ("set_default", "local", {"n_workers": 3})


def test_flow_cluster_with_a_bad_configured_address(ip, fake_cluster):
    with dask.config.set({"workbench.cluster.address": "scheduler:8786"}):
        with pytest.raises(UsageError, match="'scheduler:8786' \\(from workbench.cluster.address\\) is not"):
            ip.run_line_magic("flow_cluster", "")


def test_flow_cluster_reports_an_unreachable_scheduler_briefly(ip, monkeypatch):
    def refuse(target, **kwargs):
        raise wb.ClusterError(f"cannot reach the Dask scheduler at {target}")

    monkeypatch.setattr(wb_cluster, "set_default", refuse)
    with pytest.raises(wb.ClusterError) as info:
        ip.run_line_magic("flow_cluster", "tcp://127.0.0.1:9")
    assert info.value._render_traceback_() == ["ClusterError: cannot reach the Dask scheduler at tcp://127.0.0.1:9"]


@pytest.mark.slow
def test_flow_cluster_local_starts_a_real_cluster(ip):
    try:
        view = ip.run_line_magic("flow_cluster", "local -n 1")
        (worker,) = view.info["workers"]
        assert worker["threads"] == 1 and worker["memory"] > 0
        assert view.info["dashboard"].startswith("http://")
        assert ip.run_line_magic("flow_cluster", "").info["scheduler"] == view.info["scheduler"]
    finally:
        ip.run_line_magic("flow_cluster", "close")
    assert wb_cluster.default_client() is None


# -- a real kernel ------------------------------------------------------------------------

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.mark.slow
def test_magics_and_views_in_a_real_kernel(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "%load_ext workbench",
        EXAMPLE,
        "import numpy as np\nimport workbench as wb\nassert isinstance(mlp, wb.Graph) and mlp.loss.op.type == 'mean'\n"
        "sess = wb.Session(mlp)\n"
        "h = sess.fit(mlp.train, {'x': np.random.rand(64, 64), 'y': np.arange(64) % 10}, batch_size=16, steps=30,"
        " fetches={'loss': mlp.loss})",
        "%%flow broken\nx = placeholder('x', shape=(None, 3))\nw = variable('w', shape=(4, 2))\nh = matmul(x, w)",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()  # fmt: skip
    outputs = [c.outputs for c in nb.cells]
    assert not [o for o in outputs[0] + outputs[1] + outputs[2] if o.output_type == "error"]
    assert any(WIDGET_VIEW in o.get("data", {}) for o in outputs[1])  # the GraphView
    assert any(WIDGET_VIEW in o.get("data", {}) for o in outputs[2])  # the TrainingView, shown by fit
    (error,) = [o for o in outputs[3] if o.output_type == "error"]
    assert error.ename == "ShapeError"
    assert error.traceback[:2] == ["%%flow broken, line 4:", "    h = matmul(x, w)"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    models = [m["state"] for m in state.values() if m["model_name"] == "AnyModel"]
    trainings = [m for m in models if "steps" in m.get("state", {})]
    assert trainings and trainings[-1]["state"]["step"] == 30 and trainings[-1]["state"]["status"] == "done"


def test_a_cell_that_uses_another_graph_s_tensor_is_a_graph_error(ip):
    """Fixes: ``y = ga.x + 1`` in a ``%%flow gb`` cell silently added ops to ga."""
    assert run(ip, '%%flow mlp -q\nx = placeholder("x", shape=(None, 3))\n') is None
    ga = ip.user_ns["mlp"]
    before = len(ga.operations)
    error = run(ip, '%%flow other -q\nz = placeholder("z", shape=(None, 3))\ny = mlp.x + 1\n')
    assert isinstance(error, wb.GraphError)
    assert "'x' belongs to graph 'mlp', but graph 'other' is being built; tensors must be from the same graph" in str(
        error
    )
    assert "line 3" in error.flow_report and "y = mlp.x + 1" in error.flow_report
    assert len(ga.operations) == before  # nothing was added to the other graph


def test_mixing_graphs_in_python_is_a_graph_error():
    ga, gb = wb.Graph(name="ga"), wb.Graph(name="gb")
    with ga.as_default():
        x = wb.placeholder("x", shape=(None,))
    with gb.as_default():
        with pytest.raises(wb.GraphError, match="'x' belongs to graph 'ga', but graph 'gb' is being built"):
            wb.exp(x)
        with pytest.raises(wb.GraphError, match="must be from the same graph"):
            wb.group(x)
        with pytest.raises(wb.GraphError, match="must be from the same graph"):
            wb.optimizers.SGD(0.1).minimize(wb.mean(x))
    assert len(ga.operations) == 1
    y = x * 2.0  # outside any block: the op goes to the graph of its inputs, as before
    assert y.graph is ga


def test_control_flow_and_the_new_ops_are_in_a_flow_cell(ip):
    cell = (
        "%%flow other\n"
        'xs = placeholder("xs", shape=(5, 2, 3))\n'
        'w = variable("w", shape=(3, 3))\n'
        "h, hs = scan(lambda h, x: (gelu(layer_norm(matmul(h, w) + x)), h), xs, zeros_like(xs[0]))\n"
        'training = placeholder("training", shape=(), dtype="bool")\n'
        "y = cond(training, lambda: reduce_sum(square(h)), lambda: reduce_sum(clip(h, -1.0, 1.0)))\n"
    )
    assert run(ip, cell) is None
    other = ip.user_ns["other"]
    assert other.h.op.type == "scan" and other.y.op.type == "cond" and other.hs.shape == (5, 2, 3)
    value = wb.Session(other).run(other.y, {"xs": np.ones((5, 2, 3), np.float32), "training": False})
    assert np.isfinite(value)
