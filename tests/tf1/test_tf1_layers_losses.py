"""``workbench.tf1``'s ``tf.layers``, ``tf.losses`` and the array and activation names research code of the
TensorFlow 1.x era uses, against their definitions; and the "TF Layers" tutorial's CNN, trained."""

import numpy as np
import pytest

import workbench as wb
import workbench.tf1 as tf
from workbench.demo import load_digits
from workbench.testing import assert_close
from workbench.tf1 import UnsupportedError


@pytest.fixture(autouse=True)
def fresh_graph():
    tf.reset_default_graph()
    yield
    while tf.get_default_session() is not None:
        tf.get_default_session().close()
    tf.reset_default_graph()


def run(fetches, feed_dict=None):
    return tf.Session().run(fetches, feed_dict=feed_dict)


X = np.random.default_rng(0).normal(size=(3, 6)).astype("float32")


def test_split_unstack_slice_squeeze_tile_pad_add_n():
    x = tf.placeholder(tf.float32, [None, 6])
    halves = tf.split(x, 2, axis=1)
    sized = tf.split(x, [1, -1, 2], 1)
    rows = tf.unstack(tf.reshape(x, [-1, 2, 3]), axis=1)
    got = run(
        [*halves, *sized, *rows, tf.slice(x, [1, 2], [-1, 3]), tf.squeeze(tf.reshape(x, [-1, 1, 6, 1]), [1]),
         tf.tile(x, [2, 3]), tf.pad(x, [[1, 0], [0, 2]], constant_values=-1.0),
         tf.pad(x, [[0, 0], [2, 2]], mode="REFLECT"), tf.add_n([x, x, 2 * x])],
        {x: X},
    )  # fmt: skip
    want = [
        *np.split(X, 2, axis=1), X[:, :1], X[:, 1:4], X[:, 4:], *np.moveaxis(X.reshape(-1, 2, 3), 1, 0),
        X[1:, 2:5], X.reshape(-1, 6, 1), np.tile(X, (2, 3)), np.pad(X, [(1, 0), (0, 2)], constant_values=-1.0),
        np.pad(X, [(0, 0), (2, 2)], mode="reflect"), 4 * X,
    ]  # fmt: skip
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert halves[0].shape == (None, 3) and rows[0].shape == (None, 3)


def test_array_names_check_their_shapes():
    x = tf.placeholder(tf.float32, [None, 6])
    with pytest.raises(wb.ShapeError, match="does not split into 4 equal parts"):
        tf.split(x, 4, axis=1)
    with pytest.raises(wb.ShapeError, match=r"sizes \[2, 2\] do not add up to axis 1's 6"):
        tf.split(x, [2, 2], axis=1)
    with pytest.raises(wb.ShapeError, match=r"axes \[1\] of shape \(None, 6\) are not of size 1"):
        tf.squeeze(x, [1])
    with pytest.raises(wb.ShapeError, match="axis 0 of shape"):
        tf.unstack(x)
    with pytest.raises(
        UnsupportedError, match=r"tf.shape: shapes are static in workbench; use x.shape \(here \(None, 6\)"
    ):
        tf.shape(x)
    with pytest.raises(UnsupportedError, match="mode 'SYMMETRIC' is not supported"):
        tf.pad(x, [[0, 0], [1, 1]], mode="SYMMETRIC")


def test_math_names_match_their_definitions():
    x = tf.placeholder(tf.float32, [None, 6])
    b = tf.placeholder(tf.bool, [None, 6])
    mask = X > 0
    got = run(
        [tf.reduce_logsumexp(x, axis=1), tf.reduce_logsumexp(x, 0, keepdims=True), tf.clip_by_norm(x, 1.0),
         tf.clip_by_norm(x, 100.0), tf.logical_and(b, tf.logical_not(b)), tf.logical_or(b, tf.logical_not(b)),
         tf.logical_and(b, b), tf.range(2, 9, 3), tf.range(4)],
        {x: X, b: mask},
    )  # fmt: skip
    assert_close(got[0], np.log(np.exp(X.astype(np.float64)).sum(1)), rtol=1e-6)
    assert got[1].shape == (1, 6)
    assert_close(np.linalg.norm(got[2]), 1.0, rtol=1e-6)
    assert_close(got[3], X, rtol=1e-6)
    assert not got[4].any() and got[5].all()
    np.testing.assert_array_equal(got[6], mask)
    np.testing.assert_array_equal(got[7], [2, 5, 8])
    np.testing.assert_array_equal(got[8], [0, 1, 2, 3])
    with tf.Session() as sess:
        assert sess.run(tf.no_op()) is None


def test_nn_activations_and_normalization_match_their_definitions():
    x = tf.placeholder(tf.float64, [None, 6])
    v = X.astype(np.float64) * 3
    mean, var = tf.nn.moments(x, [0])
    got = run(
        [tf.nn.elu(x), tf.nn.selu(x), tf.nn.softplus(x), tf.nn.leaky_relu(x, 0.1), tf.nn.l2_normalize(x, 1),
         mean, var, tf.nn.batch_normalization(x, mean, var, 0.5, 2.0, 1e-3)],
        {x: v},
    )  # fmt: skip
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    want = [
        np.where(v > 0, v, np.expm1(v)), scale * np.where(v > 0, v, alpha * np.expm1(v)), np.log1p(np.exp(v)),
        np.where(v > 0, v, 0.1 * v), v / np.linalg.norm(v, axis=1, keepdims=True), v.mean(0), v.var(0),
        (v - v.mean(0)) / np.sqrt(v.var(0) + 1e-3) * 2.0 + 0.5,
    ]  # fmt: skip
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-12)
    big = run(tf.nn.softplus(x), {x: np.array([[800.0, -800.0, 0, 0, 0, 0]])})
    assert np.isfinite(big).all() and big[0, 0] == 800.0


def test_embedding_lookup_top_k_in_top_k():
    table = tf.Variable(tf.constant(np.arange(12.0).reshape(4, 3), dtype=tf.float32))
    ids = tf.placeholder(tf.int64, [None])
    logits = tf.placeholder(tf.float32, [None, 4])
    labels = tf.placeholder(tf.int32, [None])
    values, indices = tf.nn.top_k(logits, 2)
    scores = np.array([[0.1, 0.9, 0.5, 0.0], [0.7, 0.1, 0.2, 0.3]], dtype="float32")
    got = run(
        [tf.nn.embedding_lookup(table, ids), values, indices, tf.nn.in_top_k(logits, labels, 2)],
        {ids: [3, 0, 3], logits: scores, labels: [2, 1]},
    )
    np.testing.assert_array_equal(got[0], np.arange(12.0).reshape(4, 3)[[3, 0, 3]])
    np.testing.assert_array_equal(got[1], np.array([[0.9, 0.5], [0.7, 0.3]], dtype="float32"))
    np.testing.assert_array_equal(got[2], [[1, 2], [0, 3]])
    np.testing.assert_array_equal(got[3], [True, False])


def test_losses_are_the_means_of_the_per_example_losses():
    logits = tf.placeholder(tf.float64, [None, 3])
    labels = tf.placeholder(tf.int64, [None])
    target = tf.placeholder(tf.float64, [None, 3])
    z = np.random.default_rng(1).normal(size=(5, 3))
    y = np.array([0, 2, 1, 1, 0])
    t = np.random.default_rng(2).uniform(size=(5, 3))
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    got = run(
        [tf.losses.sparse_softmax_cross_entropy(labels, logits), tf.losses.softmax_cross_entropy(tf.one_hot(labels, 3,
         dtype=tf.float64), logits, weights=2.0), tf.losses.sigmoid_cross_entropy(target, logits),
         tf.losses.mean_squared_error(target, logits), tf.losses.absolute_difference(target, logits),
         tf.losses.softmax_cross_entropy(tf.one_hot(labels, 3, dtype=tf.float64), logits, label_smoothing=0.3)],
        {logits: z, labels: y, target: t},
    )  # fmt: skip
    nll = -log_p[np.arange(5), y]
    smooth = np.eye(3)[y] * 0.7 + 0.1
    sigmoid_ce = np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))
    want = [nll.mean(), 2 * nll.mean(), sigmoid_ce.mean(), ((z - t) ** 2).mean(), np.abs(z - t).mean(),
            -(smooth * log_p).sum(1).mean()]  # fmt: skip
    for g, w in zip(got, want):
        assert_close(g, w, rtol=1e-12)
    with pytest.raises(UnsupportedError, match="losses are not collected in the graph"):
        tf.losses.get_total_loss()
    with pytest.raises(wb.ArgumentError, match="weights must be a number"):
        tf.losses.mean_squared_error(target, logits, weights=target)


def test_layers_make_tensorflow_s_variables_in_nhwc():
    x = tf.placeholder(tf.float32, [None, 8, 8, 3])
    training = tf.placeholder_with_default(False, ())
    h = tf.layers.conv2d(x, 4, [3, 3], padding="same", activation=tf.nn.relu)
    pooled = tf.layers.max_pooling2d(h, pool_size=2, strides=2)
    averaged = tf.layers.average_pooling2d(h, 2, 2, padding="same")
    normed = tf.layers.batch_normalization(pooled, training=training)
    flat = tf.layers.flatten(tf.layers.dropout(normed, rate=0.5, training=training))
    out = tf.layers.dense(flat, 5)
    graph = tf.get_default_graph()
    variables = {v.name: v for v in graph.variables}
    names = list(variables)
    assert names[:2] == ["conv2d/kernel", "conv2d/bias"] and "dense/kernel" in names
    assert "batch_normalization/moving_mean" in names and "batch_normalization/moving_variance" in names
    assert variables["conv2d/kernel"].shape == (3, 3, 3, 4)
    assert (pooled.shape, averaged.shape, flat.shape, out.shape) == (
        (None, 4, 4, 4), (None, 4, 4, 4), (None, 64), (None, 5))  # fmt: skip
    sess = tf.Session()
    v = np.random.default_rng(3).normal(size=(2, 8, 8, 3)).astype("float32")
    kernel, bias = sess.run([variables["conv2d/kernel"], variables["conv2d/bias"]])
    got_h, got_pool = sess.run([h, pooled], {x: v})
    padded = np.pad(v, [(0, 0), (1, 1), (1, 1), (0, 0)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # n, 8, 8, c, 3, 3
    want = np.maximum(np.einsum("nhwcij,ijco->nhwo", windows, kernel) + bias, 0)
    assert_close(got_h, want, rtol=1e-5)
    np.testing.assert_array_equal(got_pool, got_h.reshape(2, 4, 2, 4, 2, 4).max(axis=(2, 4)))
    # inference (training defaults to False): dropout off, batch norm on its moving statistics
    first = sess.run(out, {x: v})
    np.testing.assert_array_equal(first, sess.run(out, {x: v}))
    with pytest.raises(UnsupportedError, match="kernel_initializer not supported"):
        tf.layers.dense(flat, 3, kernel_initializer=tf.zeros([64, 3]))
    with pytest.raises(UnsupportedError, match="data_format='channels_first' is not supported"):
        tf.layers.conv2d(x, 4, 3, data_format="channels_first")


def test_global_step_and_optimizers_without_an_equivalent():
    assert tf.train.get_global_step() is None
    step = tf.train.get_or_create_global_step()
    assert tf.train.get_or_create_global_step() is step and tf.train.get_global_step() is step
    w = tf.Variable(tf.constant([1.0]))
    train = tf.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(w * w), global_step=step)
    sess = tf.Session()
    for _ in range(3):
        sess.run(train)
    assert sess.run(step) == 3 and sess.run(step).dtype == np.int64
    for call, says in [
        (lambda: tf.train.RMSPropOptimizer(0.01), "workbench has SGD, Momentum"),
        (lambda: tf.train.exponential_decay(0.1, step, 100, 0.9), "learning rates are numbers here"),
        (lambda: tf.metrics.accuracy(w, w), "streaming metrics are not graph state here"),
        (lambda: tf.string, None),
    ]:
        if says is None:
            assert callable(call())
            continue
        with pytest.raises(UnsupportedError, match=says):
            call()


@pytest.mark.slow  # 150 steps of the tutorial's network (3.3M multiply-adds per example): ~15 s
def test_the_tf_layers_tutorial_cnn_trains_on_the_digits():
    """The model function of "A Guide to TF Layers: Building a Convolutional Neural Network" (its layer calls as
    written, on 8x8 digits instead of 28x28), trained with a ``sess.run`` loop instead of an Estimator."""
    digits = load_digits(seed=0)
    features = {"x": tf.placeholder(tf.float32, [None, 64])}
    labels = tf.placeholder(tf.int64, [None])
    is_training = tf.placeholder_with_default(False, ())
    input_layer = tf.reshape(features["x"], [-1, 8, 8, 1])
    conv1 = tf.layers.conv2d(inputs=input_layer, filters=32, kernel_size=[5, 5], padding="same", activation=tf.nn.relu)
    pool1 = tf.layers.max_pooling2d(inputs=conv1, pool_size=[2, 2], strides=2)
    conv2 = tf.layers.conv2d(inputs=pool1, filters=64, kernel_size=[5, 5], padding="same", activation=tf.nn.relu)
    pool2 = tf.layers.max_pooling2d(inputs=conv2, pool_size=[2, 2], strides=2)
    pool2_flat = tf.reshape(pool2, [-1, 2 * 2 * 64])
    dense = tf.layers.dense(inputs=pool2_flat, units=1024, activation=tf.nn.relu)
    dropout = tf.layers.dropout(inputs=dense, rate=0.4, training=is_training)
    logits = tf.layers.dense(inputs=dropout, units=10)
    predictions = {"classes": tf.argmax(input=logits, axis=1), "probabilities": tf.nn.softmax(logits, name="softmax")}
    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    optimizer = tf.train.AdamOptimizer(learning_rate=1e-3)
    train_op = optimizer.minimize(loss=loss, global_step=tf.train.get_or_create_global_step())
    accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions["classes"], labels), tf.float32))

    rng = np.random.default_rng(0)
    with tf.Session() as sess:
        sess.run(tf.global_variables_initializer())
        for _ in range(150):
            batch = rng.choice(len(digits.x_train), 50, replace=False)
            sess.run(train_op, {features["x"]: digits.x_train[batch], labels: digits.y_train[batch], is_training: True})
        test_accuracy = sess.run(accuracy, {features["x"]: digits.x_test, labels: digits.y_test})
        assert sess.run(tf.train.get_global_step()) == 150
    assert test_accuracy >= 0.9
