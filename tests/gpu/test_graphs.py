"""Graph replay bookkeeping and the flat path of fused kernels, on NumPy (no GPU needed)."""

import types

import numpy as np
import pytest

import workbench as wb
from workbench.gpu.graphs import PlanGraphs, capture_obstacle, signature
from workbench.gpu.kernels import FusedKernels
from workbench.graph.plan import Plan
from workbench.ops.fused import run_program


class FakeCapture:
    """CUDA capture on NumPy: nothing counts as run while capturing (variables are put back),
    and a launch runs the captured function again into the captured output list."""

    def __init__(self, state, fail=False):
        self.state, self.fail = state, fail
        self.captures = self.launches = 0

    def capture(self, fn):
        self.captures += 1
        saved = {n: np.array(v, copy=True) for n, v in self.state.items()}
        outputs = fn()
        for n, v in saved.items():
            if isinstance(self.state[n], np.ndarray):
                self.state[n][...] = v
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return (lambda: outputs.__setitem__(slice(None), fn())), outputs, "pool"

    def launch(self, graph):
        self.launches += 1
        graph()

    def empty_like(self, array):
        return np.empty_like(np.asarray(array))

    def copy_into(self, dst, src):
        np.copyto(dst, src)

    def copy(self, array):
        return np.array(array, copy=True)


def _mlp(dropout=False, classify=False):
    """A regression MLP (``classify``: a classifier, whose cross-entropy checks labels on the host)."""
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64") if classify else wb.placeholder("y", shape=(None, 3))
        h = wb.relu(wb.matmul(x, wb.variable("w1", shape=(6, 8))) + wb.variable("b1", shape=(8,), init=0.1))
        if dropout:
            h = wb.dropout(h, 0.5)
        logits = wb.matmul(h, wb.variable("w2", shape=(8, 3))) + wb.variable("b2", shape=(3,), init="zeros")
        error = wb.softmax_cross_entropy(logits, y) if classify else (logits - y) ** 2
        loss = wb.mean(error, name="loss")
        train = wb.optimizers.Adam(0.05).minimize(loss)
    return g, train, loss


def _batch(n=16, seed=0, classify=False):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n) if classify else rng.normal(size=(n, 3)).astype(np.float32)
    return {"x": rng.normal(size=(n, 6)).astype(np.float32), "y": y}


def _variables_of(sess) -> dict:
    """The dict of variable arrays that every plan of ``sess`` reads and updates."""
    return sess.plan_for("loss", _batch(classify=sess.graph.get("y").dtype == "int64")).state


def _graph_session(g, fail=False):
    sess = wb.Session(g, seed=2, device="gpu", emulate=True, cuda_graphs=True)
    sess.device.capture = FakeCapture(_variables_of(sess), fail=fail)
    return sess


def _plan_graphs(sess) -> PlanGraphs:
    (graphs,) = sess.device.plan_graphs()
    return graphs


def test_replays_give_the_losses_and_weights_of_plain_runs():
    g, train, loss = _mlp()
    plain = wb.Session(g, seed=2, device="gpu", emulate=True)
    sess = _graph_session(g)
    batches = [_batch(seed=i) for i in range(7)]
    expected = [plain.run([train, loss], b)[1] for b in batches]
    got = [sess.run([train, loss], b)[1] for b in batches]
    np.testing.assert_array_equal(got, expected)
    for name, value in plain.variables.items():
        np.testing.assert_array_equal(sess.variables[name], value)
    # run 1 makes the arrays the plan owns, run 2 keeps them (ready), run 3 captures, 4..7 replay
    assert sess.device.graph_replays == 4 and sess.device.capture.captures == 1
    assert list(_plan_graphs(sess).graphs) == [signature([batches[0]["x"], batches[0]["y"]])]


def test_fetched_values_are_copies_the_next_replay_leaves_alone():
    g, train, loss = _mlp()
    sess = _graph_session(g)
    b = _batch()
    values = [sess.run([train, loss], b)[1] for _ in range(6)]
    assert len({float(v) for v in values}) == 6  # every step's loss kept its own value


def test_each_feed_signature_warms_up_and_captures_once():
    g, train, loss = _mlp()
    sess = _graph_session(g)
    for n in (16, 16, 16, 8, 8, 8, 16, 8):
        sess.run(train, _batch(n))
    graphs = _plan_graphs(sess)
    assert sorted(k[0][0][0] for k in graphs.graphs) == [8, 16]
    assert graphs.captures == 2 and graphs.replays == 3  # 16: warm, warm, capture; 8: warm, capture, replay; 16; 8


def test_random_ops_and_check_numerics_never_capture():
    g, train, loss = _mlp(dropout=True)
    sess = _graph_session(g)
    for _ in range(4):
        sess.run(train, _batch())
    graphs = _plan_graphs(sess)
    assert "dropout" in graphs.obstacle and sess.device.capture.captures == 0
    g, train, loss = _mlp()
    sess = _graph_session(g)
    for _ in range(4):
        sess.run(train, _batch(), check_numerics=True)
    assert sess.device.capture.captures == 0 and sess.device.graph_replays == 0


def test_plans_that_check_indices_never_capture():
    """A replay would skip the label check of softmax_cross_entropy, so such plans run plainly."""
    g, train, loss = _mlp(classify=True)
    sess = _graph_session(g)
    for _ in range(4):
        sess.run(train, _batch(classify=True))
    graphs = _plan_graphs(sess)
    assert "checks its indices on the host" in graphs.obstacle and sess.device.capture.captures == 0
    bad = _batch(classify=True)
    bad["y"][3] = -1
    with pytest.raises(wb.ExecutionError, match="label -1 at position 3 is out of range"):
        sess.run(train, bad)


def test_updates_that_replace_the_array_are_never_captured():
    g, train, loss = _mlp()
    plan = Plan(g, [train.name], ["x", "y"], np, {}, own_state=False)
    assert "own_state=False" in capture_obstacle(plan)
    sess = _graph_session(g)
    w1 = g.get("w1")
    for _ in range(5):  # fetching the variable's read keeps its update from writing in place
        sess.run([train, w1], _batch())
    assert sess.device.capture.captures == 0 and sess.device.graph_replays == 0


def test_a_failed_capture_falls_back_and_is_not_retried():
    g, train, loss = _mlp()
    plain = wb.Session(g, seed=2, device="gpu", emulate=True)
    sess = _graph_session(g, fail=True)
    batches = [_batch(seed=i) for i in range(6)]
    expected = [plain.run([train, loss], b)[1] for b in batches]
    got = [sess.run([train, loss], b)[1] for b in batches]
    np.testing.assert_array_equal(got, expected)
    assert sess.device.capture.captures == 1 and sess.device.graph_replays == 0
    assert _plan_graphs(sess).obstacle.startswith("capture failed: RuntimeError: operation not permitted")


def test_new_variable_arrays_drop_the_graph():
    g, train, loss = _mlp()
    plain = wb.Session(g, seed=2, device="gpu", emulate=True)
    sess = _graph_session(g)
    b = _batch()
    losses = {}
    for s in (plain, sess):
        for _ in range(4):
            s.run(train, b)
        s.initialize()  # new arrays: the captured ones are stale
        losses[s] = [s.run([train, loss], b)[1] for _ in range(5)]
    np.testing.assert_array_equal(losses[sess], losses[plain])
    assert sess.device.capture.captures == 2
    for name, value in plain.variables.items():
        np.testing.assert_array_equal(sess.variables[name], value)


def test_cuda_graphs_off_runs_plainly():
    g, train, loss = _mlp()
    sess = wb.Session(g, device="gpu", emulate=True, cuda_graphs=False)
    sess.device.capture = FakeCapture(_variables_of(sess))
    for _ in range(4):
        sess.run(train, _batch())
    assert sess.device.capture.captures == 0 and not sess.device.plan_graphs()


def test_capture_decisions_are_events():
    g, train, loss = _mlp()
    sess = wb.Session(g, seed=2, device="gpu", emulate=True, cuda_graphs=True)
    sess.device.capture = FakeCapture(_variables_of(sess))
    seen = []
    sess.events.subscribe(lambda e: seen.append(e) if e["kind"] == "graph_capture" else None)
    for _ in range(4):
        sess.run(train, _batch())
    sess.initialize()
    sess.run(train, _batch())
    assert [e["status"] for e in seen] == ["captured", "dropped"]
    assert seen[0]["signature"] == (((16, 6), "float32"), ((16, 3), "float32"))
    failing = wb.Session(g, seed=2, device="gpu", emulate=True, cuda_graphs=True)
    failing.device.capture = FakeCapture(_variables_of(failing), fail=True)
    seen.clear()
    failing.events.subscribe(lambda e: seen.append(e) if e["kind"] == "graph_capture" else None)
    for _ in range(4):
        failing.run(train, _batch())
    assert [e["status"] for e in seen] == ["skipped"]
    assert seen[0]["reason"].startswith("capture failed: RuntimeError: operation not permitted")


# -- fused kernels on flat views ------------------------------------------------------------

PROGRAM = (("add", (0, 1), (), "float32"), ("relu", (2,), (), "float32"))


def _fake_kernels():
    """FusedKernels over a stand-in CuPy whose kernels record the shapes they are called with."""
    calls = []

    class ElementwiseKernel:
        def __init__(self, params, out, body, name):
            self.name = name

        def __call__(self, *arrays):
            calls.append([a.shape for a in arrays])
            return run_program(np, PROGRAM, arrays)

    fake = types.SimpleNamespace(ndarray=np.ndarray, ElementwiseKernel=ElementwiseKernel)
    return FusedKernels(fake), calls


@pytest.mark.parametrize(
    "shapes,flat",
    [
        (((4, 5, 6), (4, 5, 6)), True),  # same shape, contiguous: 1-D views
        (((4, 5, 6), (6,)), False),  # broadcasting: the N-d kernel
        (((7,), (7,)), False),  # already 1-D
        (((), ()), False),
    ],
)
def test_fused_kernels_run_on_flat_views_when_nothing_broadcasts(shapes, flat):
    kernels, calls = _fake_kernels()
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s).astype(np.float32) for s in shapes]
    out = kernels(np, PROGRAM, arrays)(*arrays)
    np.testing.assert_array_equal(out, run_program(np, PROGRAM, arrays))
    assert out.shape == np.broadcast_shapes(*shapes)
    assert calls == [[(int(np.prod(shapes[0])),)] * 2 if flat else list(shapes)]


def test_fused_kernels_keep_the_nd_path_for_strided_inputs():
    kernels, calls = _fake_kernels()
    a = np.arange(24, dtype=np.float32).reshape(4, 6) - 10
    b = np.ones((6, 4), np.float32).T  # same shape, not C-contiguous
    out = kernels(np, PROGRAM, [a, b])(a, b)
    np.testing.assert_array_equal(out, np.maximum(a + b, 0))
    assert calls == [[(4, 6), (4, 6)]]
