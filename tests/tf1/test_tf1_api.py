"""``workbench.tf1``: TensorFlow 1.x's names and argument spellings, mapped onto workbench ops."""

import numpy as np
import pytest

import workbench as wb
import workbench.tf1 as tf
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


def test_placeholder_takes_dtype_shape_name_in_tensorflow_s_order():
    x = tf.placeholder(tf.float32, [None, 64])
    y = tf.placeholder(tf.int64, shape=(None,), name="labels")
    k = tf.placeholder(tf.float32)
    assert (x.name, x.shape, x.dtype) == ("Placeholder", (None, 64), "float32")
    assert (y.name, y.dtype) == ("labels", "int64") and k.name == "Placeholder_1" and k.shape is None
    assert tf.placeholder(np.float64, [2]).dtype == tf.float64
    assert tf.placeholder("float", [None, 784]).dtype == "float32"  # the oldest tutorials' spelling
    with pytest.raises(wb.ArgumentError, match=r"tf.placeholder\('x', ...\): the first argument is the dtype"):
        tf.placeholder("x", [None, 3])


def test_wb_placeholder_with_a_dtype_for_its_name_says_so():
    with pytest.raises(
        wb.ArgumentError, match=r"placeholder\('float32', ...\): the first argument is the placeholder's name"
    ):
        wb.placeholder("float32", [None, 64])
    with pytest.raises(wb.ArgumentError, match="use workbench.tf1.placeholder"):
        wb.placeholder(np.float32, [None, 64])


def test_variable_constant_and_initial_values():
    w = tf.Variable(tf.zeros([3, 2]))
    b = tf.Variable(tf.constant(0.1, shape=[2]), name="b")
    n = tf.Variable(0, trainable=False)
    t = tf.Variable(tf.truncated_normal([1000], stddev=0.1, seed=3))
    assert isinstance(w, wb.Variable) and (w.name, b.name, n.name) == ("Variable", "b", "Variable_1")
    assert not n.trainable and n.dtype == "int64"
    assert [op.type for op in tf.get_default_graph().operations] == ["variable"] * 4  # the constants are gone
    sess = tf.Session()
    values = sess.run([w, b, n, t])
    np.testing.assert_array_equal(values[1], np.full(2, 0.1, "float32"))
    assert values[0].shape == (3, 2) and values[2] == 0
    assert np.abs(values[3]).max() <= 0.2 and 0.07 < values[3].std() < 0.1  # truncated at two standard deviations
    assert tf.constant([1, 2, 3, 4], shape=[2, 2]).shape == (2, 2)
    assert tf.constant(7, dtype=tf.float64).dtype == "float64"
    with pytest.raises(wb.ShapeError, match=r"tf.constant: a value of shape \(3,\) cannot fill shape \(2, 2\)"):
        tf.constant([1, 2, 3], shape=[2, 2])


def test_random_constants_repeat_with_the_graph_seed():
    def draw():
        tf.reset_default_graph()
        tf.set_random_seed(5)
        return run([tf.random_normal([4]), tf.truncated_normal([4], seed=1), tf.random_uniform([3], maxval=2.0)])

    first, second = draw(), draw()
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], first[1])


def test_wb_variable_is_constructible_and_refuses_computed_initial_values():
    g = wb.Graph()
    with g.as_default():
        v = wb.Variable(np.ones((2, 2), "float32"), name="v")
        x = wb.placeholder("x", shape=(2,))
        with pytest.raises(
            wb.GraphError, match="Variable\\(\\): the initial value 'x' is a placeholder op, not a constant"
        ):
            wb.Variable(x)
    assert g.variables == [v] and v.shape == (2, 2)


def test_reductions_take_both_spellings():
    x = tf.constant(np.arange(6.0, dtype="float32").reshape(2, 3))
    out = run([
        tf.reduce_sum(x, reduction_indices=[1]), tf.reduce_mean(x, axis=0, keepdims=True), tf.reduce_max(x),
        tf.reduce_min(x, 1, keep_dims=True), tf.reduce_prod(x + 1.0, axis=[0, 1]), tf.argmax(x, dimension=1),
        tf.argmax(x), tf.argmin(x, 1), tf.reduce_any(tf.greater(x, 4.0)), tf.reduce_all(tf.greater(x, -1.0), axis=1),
    ])  # fmt: skip
    expected = [
        [3.0, 12.0],
        [[1.5, 2.5, 3.5]],
        5.0,
        [[0.0], [3.0]],
        720.0,
        [2, 2],
        [1, 1, 1],
        [0, 0],
        True,
        [True, True],
    ]
    for got, want in zip(out, expected):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(wb.ArgumentError, match="give axis or its old spelling reduction_indices, not both"):
        tf.reduce_sum(x, axis=1, reduction_indices=1)


def _nhwc_reference(x, w, stride, padding):
    """The convolution, computed directly in NHWC with an HWIO filter (float64)."""
    kh, kw = w.shape[:2]
    if padding == "SAME":
        oh, ow = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
        ph, pw = max((oh - 1) * stride + kh - x.shape[1], 0), max((ow - 1) * stride + kw - x.shape[2], 0)
        x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2), (0, 0)))
    else:
        oh, ow = (x.shape[1] - kh) // stride + 1, (x.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, w.shape[3]))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride : i * stride + kh, j * stride : j * stride + kw, :]
            out[:, i, j, :] = np.einsum("nhwc,hwco->no", patch, w)
    return out


@pytest.mark.parametrize("stride, padding", [(1, "SAME"), (2, "same"), (1, "VALID"), (2, "Valid")])
def test_conv2d_in_nhwc_with_hwio_filters_matches_the_definition(stride, padding):
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((2, 7, 6, 3)), rng.standard_normal((3, 3, 3, 4))
    x, w = tf.constant(xv), tf.constant(wv)
    y = tf.nn.conv2d(x, w, strides=[1, stride, stride, 1], padding=padding)
    nchw = tf.nn.conv2d(
        tf.transpose(x, [0, 3, 1, 2]), w, strides=[1, 1, stride, stride], padding=padding, data_format="NCHW"
    )
    got, got_nchw = run([y, nchw])
    want = _nhwc_reference(xv, wv, stride, padding.upper())
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_nchw, want.transpose(0, 3, 1, 2), rtol=1e-10, atol=1e-12)
    assert y.shape == want.shape


def test_pooling_in_nhwc():
    xv = np.random.default_rng(1).standard_normal((2, 4, 4, 3))
    x = tf.constant(xv)
    y = tf.nn.max_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME")
    a = tf.nn.avg_pool(x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")
    got_max, got_avg = run([y, a])
    np.testing.assert_array_equal(got_max, xv.reshape(2, 2, 2, 2, 2, 3).max(axis=(2, 4)))
    np.testing.assert_allclose(got_avg, xv.reshape(2, 2, 2, 2, 2, 3).mean(axis=(2, 4)), rtol=1e-12)


def test_a_conv2d_whose_shapes_fit_the_other_layout_says_so():
    x = tf.placeholder(tf.float32, [None, 1, 8, 8])  # NCHW data, with the NHWC default
    w = tf.Variable(tf.truncated_normal([5, 5, 1, 32], stddev=0.1))
    with pytest.raises(
        wb.ShapeError,
        match=r"tf.nn.conv2d: input \(None, 1, 8, 8\) has 8 channels on its last axis \(data_format='NHWC'\) but filter "
        r"\(5, 5, 1, 32\) \(\[height, width, in, out\]\) expects 1; the input fits data_format='NCHW': pass that",
    ):
        tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="SAME")


def test_wb_conv2d_on_tensorflow_layouts_names_them():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 8, 8, 1))
        w = wb.variable("w", shape=(5, 5, 1, 32))
        with pytest.raises(
            wb.ShapeError,
            match=r"x has 8 channels but w \(5, 5, 1, 32\) expects 5; conv2d takes x as \(N, C, H, W\) and w as "
            r"\(out, in, kh, kw\), and these shapes fit TensorFlow's layout \(x as \(N, H, W, C\) and w as \(kh, kw, in, out\)\)",
        ):
            wb.conv2d(x, w)
        with pytest.raises(
            wb.ShapeError,
            match=r"stride is an int or a pair \(height, width\), got \[1, 2, 2, 1\]; "
            r"\[1, 2, 2, 1\] is TensorFlow's per-axis form: here give \(2, 2\) for NHWC",
        ):
            wb.conv2d(
                wb.placeholder("x2", shape=(None, 1, 8, 8)), wb.variable("w2", shape=(4, 1, 3, 3)), stride=[1, 2, 2, 1]
            )
        assert wb.max_pool2d(wb.placeholder("x3", shape=(1, 2, 5, 5)), 2, padding="SAME").shape == (1, 2, 3, 3)


def test_strides_and_padding_are_checked():
    x = tf.placeholder(tf.float32, [None, 8, 8, 1])
    w = tf.Variable(tf.zeros([3, 3, 1, 2]))
    with pytest.raises(
        wb.ArgumentError, match=r"strides=\[2, 1, 1, 1\] must be 1 on the batch and channel axes \(NHWC\)"
    ):
        tf.nn.conv2d(x, w, strides=[2, 1, 1, 1], padding="SAME")
    with pytest.raises(wb.ArgumentError, match="padding must be 'SAME' or 'VALID', got 'FULL'"):
        tf.nn.conv2d(x, w, strides=[1, 1, 1, 1], padding="FULL")
    with pytest.raises(wb.ArgumentError, match="data_format must be 'NHWC' or 'NCHW', got 'NDHWC'"):
        tf.nn.max_pool(x, [1, 2, 2, 1], [1, 2, 2, 1], "VALID", data_format="NDHWC")


def test_cross_entropies_match_their_definitions():
    logits_v = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]])
    labels_v = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    logits, labels = tf.constant(logits_v), tf.constant(labels_v)
    dense = tf.nn.softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    sparse = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.argmax(labels, 1), logits=logits)
    sig = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    want = -np.sum(labels_v * (logits_v - np.log(np.exp(logits_v).sum(1, keepdims=True))), axis=1)
    got_dense, got_sparse, got_sig = run([dense, sparse, sig])
    np.testing.assert_allclose(got_dense, want, rtol=1e-12)
    np.testing.assert_allclose(got_sparse, want, rtol=1e-12)
    p = 1 / (1 + np.exp(-logits_v))
    np.testing.assert_allclose(got_sig, -(labels_v * np.log(p) + (1 - labels_v) * np.log(1 - p)), rtol=1e-10)
    with pytest.raises(wb.ArgumentError, match="give labels= and logits= by keyword"):
        tf.nn.softmax_cross_entropy_with_logits(logits, labels)


def test_dropout_keep_prob_placeholder_switches_it_off():
    x = tf.constant(np.ones((200, 50), "float32"))
    keep_prob = tf.placeholder(tf.float32)
    y = tf.nn.dropout(x, keep_prob)
    sess = tf.Session()
    kept = sess.run(y, feed_dict={keep_prob: 0.5})
    assert set(np.unique(kept)) == {0.0, 2.0} and 0.45 < (kept > 0).mean() < 0.55
    np.testing.assert_array_equal(sess.run(y, feed_dict={keep_prob: 1.0}), np.ones((200, 50)))
    assert tf.nn.dropout(x, 1.0) is x


def test_optimizers_minimize_with_a_global_step():
    w = tf.Variable(tf.constant([1.0, -2.0]))
    step = tf.Variable(0, trainable=False, name="global_step")
    loss = tf.reduce_sum(w * w)
    train = tf.train.GradientDescentOptimizer(0.25).minimize(loss, global_step=step)
    momentum = tf.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True)
    assert isinstance(momentum, wb.optimizers.Momentum) and momentum.nesterov
    sess = tf.Session()
    sess.run(train)
    sess.run(train)
    np.testing.assert_allclose(sess.run(w), [0.25, -0.5])
    assert sess.run(step) == 2
    adam = tf.train.AdamOptimizer(1e-4)
    assert (adam.beta1, adam.beta2, adam.epsilon) == (0.9, 0.999, 1e-8)


def test_global_variables_initializer_resets_variables():
    w = tf.Variable(tf.constant([1.0]))
    bump = tf.assign_add(w, tf.constant([1.0]))
    init = tf.global_variables_initializer()
    assert isinstance(init, wb.Operation)
    with tf.Session() as sess:
        assert tf.get_default_session() is sess
        sess.run(init)
        bump.eval()
        assert w.eval() == 2.0
        assert sess.run([init, w])[1] == 1.0  # the initializer runs first
        init.run()
        assert w.eval() == 1.0
    assert tf.get_default_session() is None


def test_eval_without_a_session_says_how_to_get_one():
    y = tf.constant(1.0) + 1.0
    with pytest.raises(
        wb.GraphError, match=r"tensor 'add'.eval\(\) needs a session: run it inside 'with sess.as_default\(\):'"
    ):
        y.eval()
    sess = tf.InteractiveSession()
    assert y.eval() == 2.0
    sess.close()
    assert tf.get_default_session() is None


def test_sync_replicas_optimizer_means_fit_replicas_and_backups():
    w = tf.Variable(tf.zeros([2]))
    opt = tf.train.SyncReplicasOptimizer(
        tf.train.GradientDescentOptimizer(0.1), replicas_to_aggregate=2, total_num_replicas=3
    )
    train = opt.minimize(tf.reduce_sum(w * w))
    assert opt.fit_options == {"replicas": 2, "backup_replicas": 1}
    assert tf.train.fit_options(train) == {"replicas": 2, "backup_replicas": 1}
    with pytest.raises(wb.ArgumentError, match=r"need 1 <= replicas_to_aggregate \(3\) <= total_num_replicas \(2\)"):
        tf.train.SyncReplicasOptimizer(opt.optimizer, 3, 2)
    with pytest.raises(UnsupportedError, match="sess.fit"):
        opt.make_session_run_hook(True)


@pytest.mark.parametrize(
    "call, says",
    [
        (
            lambda: tf.device("/gpu:0"),
            r"tf.device has no workbench equivalent: placement is the session's: wb.Session\(graph, device='gpu'\)",
        ),
        (
            lambda: tf.train.replica_device_setter(ps_tasks=1),
            r"tf.train.replica_device_setter has no workbench equivalent: create tf.Session\(cluster=",
        ),
        (
            lambda: tf.train.ClusterSpec({"ps": ["a:1"]}),
            r"tf.train.ClusterSpec has no workbench equivalent: .*replicas=N, backup_replicas=B",
        ),
        (lambda: tf.FIFOQueue(10, tf.float32), r"tf.FIFOQueue has no workbench equivalent: feed NumPy arrays"),
        (
            lambda: tf.train.start_queue_runners(),
            r"tf.train.start_queue_runners has no workbench equivalent: feed NumPy",
        ),
        (lambda: tf.summary.scalar("loss", 1.0), r"tf.summary.scalar has no workbench equivalent: fit\(\) records"),
        (
            lambda: tf.Session("grpc://host:2222"),
            r"TensorFlow servers have no equivalent; give a Dask scheduler address",
        ),
    ],
)
def test_what_has_no_equivalent_says_what_to_use(call, says):
    with pytest.raises(UnsupportedError, match=says) as info:
        call()
    assert isinstance(info.value, wb.WorkbenchError) and isinstance(info.value, NotImplementedError)


def test_an_unknown_name_says_where_to_look():
    with pytest.raises(AttributeError, match="module 'workbench.tf1' has no attribute 'contrib': it maps"):
        tf.contrib  # noqa: B018


def test_saver_writes_and_restores(tmp_path):
    w = tf.Variable(tf.constant([1.0, 2.0]))
    sess = tf.Session()
    saver = tf.train.Saver()
    path = saver.save(sess, str(tmp_path / "model.ckpt"))
    sess.run(tf.assign(w, tf.constant([5.0, 5.0])))
    saver.restore(sess, str(tmp_path / "model.ckpt"))
    np.testing.assert_array_equal(sess.run(w), [1.0, 2.0])
    assert path.endswith("model.ckpt.npz")
