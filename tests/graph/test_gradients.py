"""gradients(): reverse mode as graph ops."""

import numpy as np
import pytest

import workbench as wb


def run(graph, fetches, feed=None):
    return wb.Session(graph).run(fetches, feed)


def test_fan_in_is_summed(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    y = wb.sum(x * x + 3.0 * x + wb.exp(x))  # x used by three paths (and twice by one op)
    (dx,) = wb.gradients(y, [x])
    value = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(run(graph, dx, {x: value}), 2 * value + 3.0 + np.exp(value), rtol=1e-12)


def test_same_x_listed_twice_and_several_ys(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    y1, y2 = wb.sum(x * 2.0), wb.sum(x * x)
    dx, dx_again = wb.gradients([y1, y2], [x, x])
    value = np.array([1.0, -3.0])
    got, again = run(graph, [dx, dx_again], {x: value})
    np.testing.assert_allclose(got, 2.0 + 2 * value)
    np.testing.assert_array_equal(got, again)


def test_grad_ys_weights_the_ys(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    y = x * 3.0
    (dx,) = wb.gradients(y, [x], grad_ys=[wb.constant(np.array([1.0, 10.0]))])
    np.testing.assert_allclose(run(graph, dx, {x: [0.0, 0.0]}), [3.0, 30.0])


@pytest.mark.parametrize(
    "xshape, bshape",
    [((2, 3), (3,)), ((2, 3), (1, 3)), ((2, 3), (2, 1)), ((2, 3), ()), ((4, 2, 3), (2, 3)), ((4, 2, 3), (4, 1, 1))],
)
def test_broadcasting_is_undone(graph, xshape, bshape):
    rng = np.random.default_rng(0)
    a = wb.placeholder("a", shape=xshape, dtype="float64")
    b = wb.placeholder("b", shape=bshape, dtype="float64")
    c = wb.constant(rng.normal(size=xshape))
    y = wb.sum((a * b + b) * c)
    da, db = wb.gradients(y, [a, b])
    assert da.shape == xshape and db.shape == bshape
    av, bv, cv = rng.normal(size=xshape), rng.normal(size=bshape), c.op.attrs["value"]
    got_a, got_b = run(graph, [da, db], {a: av, b: bv})
    np.testing.assert_allclose(got_a, bv * cv + np.zeros(xshape), rtol=1e-12)
    np.testing.assert_allclose(got_b, reduce_to((av + 1.0) * cv, bshape), rtol=1e-12)


def reduce_to(array, shape):
    """Sum ``array`` over the axes along which ``shape`` was broadcast to it."""
    extra = array.ndim - len(shape)
    array = array.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and array.shape[i] != 1)
    return array.sum(axis=axes, keepdims=True)


def test_broadcasting_with_unknown_batch_size(graph):
    x = wb.placeholder("x", shape=(None, 3), dtype="float64")
    b = wb.variable("b", shape=(3,), init=0.0, dtype="float64")
    (db,) = wb.gradients(wb.sum(x + b), [b])
    assert db.shape == (3,)
    np.testing.assert_array_equal(run(graph, db, {x: np.ones((5, 3))}), [5.0, 5.0, 5.0])


def test_only_axes_that_may_be_stretched_are_summed(graph):
    # (None, 3) + (3,): the batch axis of h is never stretched, so its gradient needs no
    # reduce_to_like (which would keep h alive until the backward pass just for its shape)
    x = wb.placeholder("x", shape=(None, 4), dtype="float64")
    w = wb.variable("w", shape=(4, 3), init=1.0, dtype="float64")
    b = wb.variable("b", shape=(3,), init=0.0, dtype="float64")
    h = x @ w
    dh, dw, db = wb.gradients(wb.sum(h + b), [h, w, b])
    assert dh.op.type != "reduce_to_like" and dw.op.type == "matmul" and db.op.type == "reduce_to_like"
    # (None, 3) + (None, 1): the other input's batch axis may be 1, so x's gradient is summed too
    c = wb.placeholder("c", shape=(None, 1), dtype="float64")
    dx, dc = wb.gradients(wb.sum(h + c), [h, c])
    assert dx.op.type == "reduce_to_like" and dc.op.type == "reduce_to_like"
    value = run(graph, dx, {x: np.ones((2, 4)), c: np.ones((1, 1))})
    np.testing.assert_array_equal(value, np.ones((2, 3)))


def test_batched_matmul_broadcast_is_undone(graph):
    rng = np.random.default_rng(1)
    a = wb.placeholder("a", shape=(4, 2, 3), dtype="float64")
    w = wb.placeholder("w", shape=(3, 5), dtype="float64")
    (dw,) = wb.gradients(wb.sum(a @ w), [w])
    assert dw.shape == (3, 5)
    av = rng.normal(size=(4, 2, 3))
    expected = np.einsum("bij,k->jk", av, np.ones(5))
    np.testing.assert_allclose(run(graph, dw, {a: av, w: rng.normal(size=(3, 5))}), expected, rtol=1e-12)


def test_unconnected_xs_get_none(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    z = wb.placeholder("z", shape=(2,), dtype="float64")
    w = wb.variable("w", shape=(2,), init=1.0, dtype="float64")
    unused = w * 2.0
    y = wb.sum(x * 2.0)
    dx, dz, dw = wb.gradients(y, [x, z, w])
    assert dz is None and dw is None and dx is not None
    assert unused.op in w.graph.operations


def test_int_path_carries_no_gradient(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    i = wb.cast(x, "int64")
    y = wb.sum(wb.cast(i, "float64") * x)
    (dx,) = wb.gradients(y, [x])
    np.testing.assert_allclose(run(graph, dx, {x: [1.5, 2.5, -1.0]}), [1.0, 2.0, -1.0])


def test_zero_gradient_ops_stop_the_flow(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    y = wb.sum(wb.stop_gradient(x * 2.0) * x + wb.sign(x * 3.0) + wb.ones_like(x * 4.0))
    (dx,) = wb.gradients(y, [x])
    value = np.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(run(graph, dx, {x: value}), 2 * value)


def test_non_differentiable_path_raises(graph):
    x = wb.placeholder("x", shape=(1, 1, 4, 4), dtype="float64")
    gp = wb.placeholder("gp", shape=(1, 1, 2, 2), dtype="float64")
    (gx,) = wb.gradients(wb.max_pool2d(x, 2), [x], grad_ys=[gp])
    assert gx.op.type == "max_pool2d_grad"
    # the op's inputs are the xs themselves
    with pytest.raises(wb.GradientError, match=r"gradient of 'max_pool2d_grad' with respect to input 0 is not defined"):
        wb.gradients(wb.sum(gx), [gp])
    with pytest.raises(wb.GradientError, match=r"gradient of 'max_pool2d_grad' with respect to input 1 is not defined"):
        wb.gradients(wb.sum(gx), [x])
    # and through other ops, with the source line of the op
    with pytest.raises(wb.GradientError, match=r"(?s)with respect to input 0 is not defined.*test_gradients.py"):
        wb.gradients(wb.sum(wb.tanh(gx)), [wb.tanh(gp).op.inputs[0]])


def test_cross_entropy_second_derivative_raises(graph):
    logits = wb.placeholder("logits", shape=(2, 3), dtype="float64")
    labels = wb.placeholder("labels", shape=(2,), dtype="int64")
    (g,) = wb.gradients(wb.mean(wb.softmax_cross_entropy(logits, labels)), [logits])
    with pytest.raises(
        wb.GradientError, match=r"gradient of 'softmax_cross_entropy_grad' with respect to input \d is not defined"
    ):
        wb.gradients(wb.sum(g * g), [logits])


def test_gradient_with_respect_to_an_int_tensor_is_an_error(graph):
    i = wb.placeholder("i", shape=(2,), dtype="int64")
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    with pytest.raises(wb.GradientError, match="cannot differentiate .* 'i': its dtype is int64"):
        wb.gradients(wb.sum(x), [i])


def test_gradients_needs_tensors(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    with pytest.raises(wb.GraphError, match="at least one y"):
        wb.gradients([], [x])
    with pytest.raises(wb.GraphError, match="takes tensors"):
        wb.gradients(wb.sum(x), ["x"])


def test_mlp_gradient_matches_finite_differences(graph):
    rng = np.random.default_rng(2)
    x = wb.placeholder("x", shape=(None, 4), dtype="float64")
    y = wb.placeholder("y", shape=(None,), dtype="int64")
    w1 = wb.variable("w1", init=rng.normal(size=(4, 5)), dtype="float64")
    b1 = wb.variable("b1", init=rng.normal(size=(5,)), dtype="float64")
    w2 = wb.variable("w2", init=rng.normal(size=(5, 3)), dtype="float64")
    loss = wb.mean(wb.softmax_cross_entropy(wb.tanh(x @ w1 + b1) @ w2, y))
    grads = wb.gradients(loss, [w1, b1, w2])
    sess = wb.Session(graph)
    feed = {x: rng.normal(size=(6, 4)), y: rng.integers(0, 3, size=6)}
    analytic = sess.run(grads, feed)
    eps = 1e-6
    for var, got in zip([w1, b1, w2], analytic):
        base = sess.variables[var.name]
        numeric = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            for sign in (1, -1):
                bumped = base.copy()
                bumped[idx] += sign * eps
                _set(sess, var, bumped)
                numeric[idx] += sign * sess.run(loss, feed) / (2 * eps)
        _set(sess, var, base)
        np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


def _set(sess, var, value):
    sess.set_variables({var.name: np.array(value)})
