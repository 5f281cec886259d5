"""fold_transposes: NHWC models on NCHW ops keep one transpose at each end, with the same values."""

import numpy as np
import pytest

import workbench as wb
import workbench.tf1 as tf
from workbench.graph import passes
from workbench.graph.compile import compile_plan
from workbench.graph.layout import fold_transposes
from workbench.testing import assert_close

TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def transposes(graph, batched=None):
    """The transpose ops of ``graph`` (only those over the batch, with ``batched=True``)."""
    found = [op for op in graph.operations if op.type == "transpose"]
    return [op for op in found if None in op.outputs[0].shape] if batched else found


def run_both(graph, fetches, feeds, state):
    """``fetches`` computed by the plan with the transposes folded and by the plan without."""
    fed = list(feeds)
    plain = passes.optimize(graph, fetches, fed, transposes=False)
    folded = passes.optimize(graph, fetches, fed)
    passes.validate(folded)
    results = []
    for g in (folded, plain):
        plan = compile_plan(g, fetches, fed, state={k: v.copy() for k, v in state.items()}, optimized=True)
        results.append(plan.run([feeds[n] for n in plan.feed_names]))
    return folded, plain, results


def test_an_inverse_pair_cancels_and_the_name_stays_an_alias():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 4, 5), dtype="float64")
        back = wb.transpose(wb.transpose(x, TO_NHWC), TO_NCHW, name="back")
        y = wb.relu(back)
    value = np.random.default_rng(0).normal(size=(2, 3, 4, 5))
    folded, _, (got, want) = run_both(g, [y.name], {"x": value}, {})
    assert transposes(folded) == [] and folded.resolve("back") == "x"
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("fetch_outer", [False, True])
def test_a_pair_that_does_not_cancel_becomes_one_transpose(fetch_outer):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(2, 3, 4, 5), dtype="float64")
        outer = wb.transpose(wb.transpose(x, (1, 0, 2, 3)), (0, 1, 3, 2), name="outer")
        y = wb.tanh(outer)
    fetches = [outer.name, y.name] if fetch_outer else [y.name]
    value = np.random.default_rng(1).normal(size=(2, 3, 4, 5))
    folded, plain, (got, want) = run_both(g, fetches, {"x": value}, {})
    assert len(transposes(plain)) == 2 and len(transposes(folded)) == 1
    (op,) = transposes(folded)
    assert op.name == "outer" and op.inputs[0].name == "x" and op.attrs["perm"] == (1, 0, 3, 2)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_elementwise_ops_and_a_broadcast_bias_run_in_the_base_layout():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 4, 5), dtype="float64")
        b = wb.variable("b", init=np.arange(3.0), dtype="float64")
        h = wb.relu(wb.transpose(x, TO_NHWC) * 2.0 + b)  # the NHWC bias add of a tf1 conv layer
        pooled = wb.transpose(h, TO_NCHW)
        y = wb.sum(pooled * pooled)
    value = np.random.default_rng(2).normal(size=(2, 3, 4, 5))
    folded, _, (got, want) = run_both(g, [y.name], {"x": value}, {"b": np.arange(3.0)})
    assert transposes(folded) == []
    (reshape,) = [op for op in folded.operations if op.type == "reshape"]
    assert reshape.outputs[0].shape == (1, 3, 1, 1)
    assert_close(got[0], want[0], rtol=1e-12)


def test_reductions_of_a_transposed_tensor_reduce_the_base():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 4, 5), dtype="float64")
        t = wb.transpose(x, TO_NHWC)
        outs = [
            wb.sum(t, axis=(0, 1, 2)),  # a bias's gradient: (C,)
            wb.mean(t),
            wb.max(t, axis=3),  # (N, H, W), the base's order too
            wb.mean(t, axis=-1, keepdims=False),
            wb.sum(wb.min(t, axis=(1, 2), keepdims=True)),
            wb.tanh(wb.sum(t, axis=0)),  # (H, W, C) from the base's (C, H, W): one small transpose
        ]
    value = np.random.default_rng(3).normal(size=(2, 3, 4, 5))
    folded, _, (got, want) = run_both(g, [o.name for o in outs], {"x": value}, {})
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert_close(a, b, rtol=1e-12)
    (op,) = transposes(folded)
    assert op.inputs[0].shape == (3, 4, 5) and op.attrs["perm"] == (1, 2, 0)


def test_a_region_that_would_need_more_transposes_is_left_alone():
    g = wb.Graph()
    with g.as_default():  # as Adam's moments of an HWIO filter gradient: a full-size operand each
        x = wb.placeholder("x", shape=(5, 5, 3, 4), dtype="float64")
        m = wb.placeholder("m", shape=(3, 4, 5, 5), dtype="float64")
        v = wb.placeholder("v", shape=(3, 4, 5, 5), dtype="float64")
        t = wb.transpose(x, (2, 3, 0, 1))
        a, c = m + 0.1 * t, v + 0.1 * (t * t)
    before = passes.optimize(g, [a.name, c.name], ["x", "m", "v"], transposes=False)
    assert fold_transposes(before, [a.name, c.name]) is before


def deep_mnist(dtype):
    """The Deep MNIST tutorial's network (8x8 digits, fewer channels), in ``dtype``."""
    tf.reset_default_graph()
    rng = np.random.default_rng(4)
    x = tf.placeholder(dtype, shape=[None, 64])
    y_ = tf.placeholder(dtype, shape=[None, 10])

    def variable(*shape, scale=0.1):
        return tf.Variable(tf.constant(rng.normal(scale=scale, size=shape), dtype=dtype))

    def conv_pool(inputs, w, b, pool):
        h = tf.nn.relu(tf.nn.conv2d(inputs, w, strides=[1, 1, 1, 1], padding="SAME") + b)
        return pool(h, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")

    h1 = conv_pool(tf.reshape(x, [-1, 8, 8, 1]), variable(5, 5, 1, 8), variable(8), tf.nn.max_pool)
    h2 = conv_pool(h1, variable(5, 5, 8, 16), variable(16), tf.nn.avg_pool)
    h = tf.nn.relu(tf.matmul(tf.reshape(h2, [-1, 2 * 2 * 16]), variable(64, 32)) + variable(32))
    logits = tf.matmul(h, variable(32, 10)) + variable(10)
    loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y_, logits=logits))
    train = tf.train.AdamOptimizer(1e-3).minimize(loss)
    graph = tf.get_default_graph()
    variables = [op.outputs[0] for op in graph.operations if op.type == "variable" and "/" not in op.name]
    return graph, x, y_, logits, loss, train, variables


def test_a_stack_of_nhwc_layers_keeps_one_transpose_at_each_end():
    graph, x, y_, logits, loss, train, _ = deep_mnist(tf.float32)
    fed = [x.op.name, y_.op.name]
    inference = passes.optimize(graph, [logits.name], fed)
    assert [op.name for op in transposes(inference, batched=True)] == ["Conv2D/transpose", "AvgPool/transpose_1"]
    step = passes.optimize(graph, [train.name, loss.name], fed)
    plain = passes.optimize(graph, [train.name, loss.name], fed, transposes=False)
    assert len(transposes(plain, batched=True)) == 15
    assert len(transposes(step, batched=True)) == 3  # and the backward pass's first, of the flattened gradient


def test_gradients_and_training_steps_equal_the_plan_without_folding_in_float64():
    graph, x, y_, logits, loss, train, variables = deep_mnist(tf.float64)
    grads = wb.gradients(loss, variables)
    rng = np.random.default_rng(5)
    feeds = {x.op.name: rng.random((6, 64)), y_.op.name: np.eye(10)[rng.integers(10, size=6)]}
    session = wb.Session(graph)
    session.initialize()
    state = dict(session.variables)
    fetches = [loss.name] + [g.name for g in grads]
    folded, _, (got, want) = run_both(graph, fetches, feeds, state)
    assert len(transposes(folded, batched=True)) < 6
    for name, a, b in zip(fetches, got, want):
        assert a.shape == b.shape, name
        assert_close(a, b, rtol=1e-11, err_msg=name)

    states = []  # three Adam steps each: the variables the updates write stay equal too
    for transposes_ in (True, False):
        values = {k: v.copy() for k, v in state.items()}
        opt = passes.optimize(graph, [train.name, loss.name], list(feeds), transposes=transposes_)
        plan = compile_plan(opt, [train.name, loss.name], list(feeds), state=values, optimized=True)
        for _ in range(3):
            plan.run([feeds[n] for n in plan.feed_names])
        states.append(values)
    for name in state:
        assert_close(states[0][name], states[1][name], rtol=1e-10, err_msg=name)
