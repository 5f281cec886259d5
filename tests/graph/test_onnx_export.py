"""ONNX export, checked by onnx.checker and run by ONNX Runtime against sess.run."""

import subprocess
import sys

import numpy as np
import pytest

import workbench as wb
from workbench.graph import onnx_export
from workbench.ops.registry import REGISTRY

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def run_onnx(path, feeds: dict) -> list:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_close(got, expected, rtol=1e-5):
    """float32 within ``rtol`` of the values' scale; other dtypes exactly."""
    expected = np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got.dtype, got.shape, expected.shape)
    if expected.dtype.kind == "f":
        scale = float(np.max(np.abs(expected))) if expected.size else 1.0
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * scale)
    else:
        np.testing.assert_array_equal(got, expected)


def mlp(dropout=0.0):
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(x @ wb.variable("w0", shape=(8, 32)) + wb.variable("b0", shape=(32,), init=0.1))
        kept = wb.dropout(h, dropout) if dropout else h
        logits = kept @ wb.variable("w1", shape=(32, 4)) + wb.variable("b1", shape=(4,), init="zeros")
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.Adam(0.01).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, h, logits, probs, train


def cnn():
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 11, 10))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(wb.conv2d(x, wb.variable("k0", shape=(8, 3, 3, 3), init="he_normal"), stride=2, padding="same"))
        h = wb.max_pool2d(h, 3, stride=2, padding="same")  # odd sizes: the extra pad goes at the end
        h = wb.relu(wb.conv2d(h, wb.variable("k1", shape=(8, 8, 2, 2), init="he_normal"), stride=1, padding="same"))
        h = wb.max_pool2d(h, 2, padding="valid")
        flat = wb.reshape(h, (-1, 8))
        logits = flat @ wb.variable("w", shape=(8, 5))
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.SGD(0.05).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, probs, train


def trained(model, shape, steps=10):
    g, x, y, *rest = model
    train = rest[-1]
    rng = np.random.default_rng(0)
    X = rng.normal(size=shape).astype("float32")
    Y = (X.reshape(len(X), -1)[:, 0] > 0).astype("int64")
    sess = wb.Session(g, seed=3)
    sess.fit(train, {x: X, y: Y}, batch_size=16, steps=steps)
    return sess


def test_the_mlp_in_onnx_runtime_equals_sess_run_at_two_batch_sizes(tmp_path):
    model = mlp()
    g, x, y, h, logits, probs, train = model
    sess = trained(model, (64, 8))
    path = wb.export_onnx(sess, tmp_path / "mlp.onnx", inputs={"x": x}, outputs={"probs": probs, "logits": logits})
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    assert [d.dim_param or d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim] == ["batch", 8]
    assert [o.name for o in proto.graph.output] == ["probs", "logits"]
    assert not {n.op_type for n in proto.graph.node} & {"Dropout", "RandomUniform", "RandomUniformLike"}
    rng = np.random.default_rng(7)
    for n in (1, 50):
        X = rng.normal(size=(n, 8)).astype("float32")
        got = run_onnx(path, {"x": X})
        for a, b in zip(got, sess.run([probs, logits], {x: X}), strict=True):
            assert_close(a, b)


def test_dropout_is_left_out_of_the_onnx_model(tmp_path):
    model = mlp(dropout=0.5)
    g, x, y, h, logits, probs, train = model
    sess = trained(model, (64, 8))
    path = wb.export_onnx(sess, tmp_path / "mlp.onnx", inputs={"x": x}, outputs={"logits": logits})
    assert not {n.op_type for n in onnx.load(path).graph.node} & {"Dropout", "RandomUniform", "RandomUniformLike"}
    X = np.random.default_rng(2).normal(size=(20, 8)).astype("float32")
    v = sess.variables
    assert_close(run_onnx(path, {"x": X})[0], sess.run(h, {x: X}) @ v["w1"] + v["b1"])


def test_the_cnn_in_onnx_runtime_equals_sess_run_at_two_batch_sizes(tmp_path):
    model = cnn()
    g, x, y, probs, train = model
    sess = trained(model, (48, 3, 11, 10), steps=3)
    path = wb.export_onnx(sess, tmp_path / "cnn.onnx", inputs={"x": x}, outputs={"probs": probs})
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][0]
    pads = [list(a.ints) for a in conv.attribute if a.name == "pads"]
    assert pads == [
        [1, 0, 1, 1]
    ]  # 11x10, k3, s2: TensorFlow pads rows (1, 1) and columns (0, 1); ONNX lists begins, then ends
    rng = np.random.default_rng(1)
    for n in (2, 33):
        X = rng.normal(size=(n, 3, 11, 10)).astype("float32")
        (got,) = run_onnx(path, {"x": X})
        assert_close(got, sess.run(probs, {x: X}))


def test_a_loaded_model_exports_the_same_onnx(tmp_path):
    model = cnn()
    g, x, y, probs, train = model
    sess = trained(model, (32, 3, 11, 10), steps=2)
    loaded = wb.load_model(sess.export(tmp_path / "cnn.wbmodel", {"x": x}, {"probs": probs}))
    path = wb.export_onnx(loaded, tmp_path / "cnn.onnx")
    X = np.random.default_rng(4).normal(size=(9, 3, 11, 10)).astype("float32")
    assert_close(run_onnx(path, {"x": X})[0], loaded.predict(X)["probs"])


def test_every_registered_op_is_converted_or_has_a_reason_not_to_be():
    accounted = set(onnx_export.CONVERTERS) | set(onnx_export.SOURCES) | set(onnx_export.NOT_EXPORTED)
    assert sorted(set(REGISTRY) - accounted) == []
    assert not set(onnx_export.CONVERTERS) & set(onnx_export.NOT_EXPORTED)


def test_an_op_without_an_onnx_form_is_named_with_its_line(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", shape=(3, 2))
        loss = wb.sum(wb.relu(x @ w))
        (grad,) = wb.gradients(loss, [x])
    with pytest.raises(
        wb.GraphError,
        match=r"op 'gradients/\w+' \(\w+\) has no ONNX form: a gradient op.*\n.*test_onnx_export.py.*wb.gradients",
    ):
        wb.export_onnx(wb.Session(g), tmp_path / "g.onnx", inputs={"x": x}, outputs={"grad": grad})
    assert not (tmp_path / "g.onnx").exists()


def test_bad_arguments(tmp_path):
    g, x, y, h, logits, probs, train = mlp()
    sess = wb.Session(g)
    with pytest.raises(wb.GraphError, match=r"opset must be an int from 13 to \d+"):
        wb.export_onnx(sess, tmp_path / "m.onnx", {"x": x}, {"p": probs}, opset=9)
    with pytest.raises(wb.GraphError, match=r"needs inputs= and outputs="):
        wb.export_onnx(sess, tmp_path / "m.onnx")
    with pytest.raises(wb.GraphError, match=r"takes a Session or a Model, got Graph"):
        wb.export_onnx(g, tmp_path / "m.onnx", {"x": x}, {"p": probs})


@pytest.mark.slow
def test_onnx_is_imported_only_when_exporting():
    code = "import sys, workbench; assert 'onnx' not in sys.modules and 'onnxruntime' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- op by op ------------------------------------------------------------------------------------------------


def _f(shape, seed=0, dtype="float32"):
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


CASES = {
    "arithmetic": lambda x: ((x + 1.5) * x - x / (wb.abs(x) + 1.0)) ** 2.0,
    "max_min": lambda x: wb.maximum(x, 0.3) - wb.minimum(x, -0.2),
    "unary": lambda x: wb.exp(-wb.abs(x)) + wb.log(wb.abs(x) + 1.0) + wb.sqrt(wb.abs(x)) + wb.tanh(x) + wb.sigmoid(x),
    "sign_negative": lambda x: wb.sign(x) * wb.negative(x) + wb.stop_gradient(x),
    "compare_where": lambda x: (
        wb.where(wb.less(x, 0.0), x, wb.zeros_like(x))
        + wb.cast(wb.greater_equal(x, 0.5), "float32")
        + wb.cast(wb.not_equal(x, x), "float32")
        + wb.cast(wb.less_equal(x, 0.1), "float32") * wb.cast(wb.equal(x, x), "float32")
    ),
    "greater": lambda x: wb.cast(wb.greater(x, 0.0), "int32"),
    "isfinite_all": lambda x: wb.all(wb.isfinite(x / x), axis=1, keepdims=True),
    "like": lambda x: wb.ones_like(x) * 2.0 + wb.zeros_like(x),
    "sum": lambda x: wb.sum(x, axis=1) + wb.sum(x) + wb.sum(x, axis=(0, 1), keepdims=True)[0],
    "mean": lambda x: wb.mean(x, axis=-1, keepdims=True) * wb.mean(x),
    "max": lambda x: wb.max(x, axis=0, keepdims=True) + wb.max(x, axis=1, keepdims=True),
    "min_prod": lambda x: wb.min(x, axis=0, keepdims=True) + wb.prod(wb.sigmoid(x), axis=1, keepdims=True),
    "argmax": lambda x: wb.argmax(x, axis=1),
    "argmax_flat": lambda x: wb.argmax(x, axis=None, keepdims=True),
    "matmul_transposes": lambda x: wb.matmul(x, x, transpose_b=True) + wb.matmul(x, x, transpose_a=True)[0, 0],
    "reshape_transpose": lambda x: wb.transpose(wb.reshape(x, (-1, 2, 3)), (0, 2, 1)),
    "transpose_default": lambda x: wb.transpose(x),
    "expand_concat_stack": lambda x: wb.concat([wb.expand_dims(x, 1), wb.stack([x, x * 2.0], axis=1)], axis=1),
    "getitem": lambda x: x[:, 1:5:2] + x[::-1, -1:][:, 0:1] + x[1, None][:, :1] * x[-1, ::-3][:1],
    "getitem_newaxis": lambda x: x[None, ..., 2][0] + x[..., None][:, 0, 0],
    "softmax_family": lambda x: wb.softmax(x, axis=0) + wb.log_softmax(x),
    "cast": lambda x: wb.cast(wb.cast(x * 10.0, "int64"), "float64"),
    "reshape_like": lambda x: wb.ops.reshape_like(wb.reshape(x, (-1,)), x),
}


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_op_in_onnx_runtime_equals_sess_run(tmp_path, case, opset):
    g = wb.Graph(name=case)
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        out = CASES[case](x)
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "op.onnx", inputs={"x": x}, outputs={"out": out}, opset=opset)
    for n in (3, 8):
        X = _f((n, 6), seed=n)
        (got,) = run_onnx(path, {"x": X})
        assert_close(got, sess.run(out, {x: X}))


def test_gather_one_hot_and_cross_entropy_take_integer_inputs(tmp_path):
    g = wb.Graph()
    with g.as_default():
        ids = wb.placeholder("ids", shape=(None, 3), dtype="int32")
        labels = wb.placeholder("labels", shape=(None,), dtype="int64")
        table = wb.variable("table", shape=(10, 4))
        embedded = wb.gather(table, ids)  # (N, 3, 4)
        logits = wb.sum(embedded, axis=1) + wb.one_hot(labels, 4)
        loss = wb.softmax_cross_entropy(logits, labels)
        picked = wb.gather(embedded, wb.constant([2, 0], dtype="int8"), axis=2)
    sess = wb.Session(g)
    outputs = {"loss": loss, "picked": picked, "hot": wb.one_hot(labels, 5, dtype="int32")}
    path = wb.export_onnx(sess, tmp_path / "ids.onnx", inputs={"ids": ids, "labels": labels}, outputs=outputs)
    rng = np.random.default_rng(0)
    for n in (1, 6):
        feeds = {"ids": rng.integers(0, 10, (n, 3)).astype("int32"), "labels": rng.integers(0, 4, n)}
        got = run_onnx(path, feeds)
        expected = sess.run(list(outputs.values()), {ids: feeds["ids"], labels: feeds["labels"]})
        for a, b in zip(got, expected, strict=True):
            assert_close(a, b)


def test_valid_and_same_pooling_and_convolution_geometries(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2, 7, 8))
        outs = {}
        for i, (k, s, pad) in enumerate(
            [(3, 1, "same"), (3, 2, "same"), (4, 3, "same"), (2, 2, "valid"), (3, 2, "valid")]
        ):
            w = wb.variable(f"w{i}", shape=(3, 2, k, k))
            outs[f"conv{i}"] = wb.conv2d(x, w, stride=s, padding=pad)
            outs[f"pool{i}"] = wb.max_pool2d(x, k, stride=s, padding=pad)
        outs["rect"] = wb.conv2d(x, wb.variable("wr", shape=(1, 2, 2, 3)), stride=(2, 3), padding="same")
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "conv.onnx", inputs={"x": x}, outputs=outs)
    X = _f((4, 2, 7, 8)) - 3.0  # negative values: padding must never win a max
    got = run_onnx(path, {"x": X})
    for name, a, b in zip(outs, got, sess.run(list(outs.values()), {x: X}), strict=True):
        assert a.shape == b.shape, name
        assert_close(a, b)


# -- the models' ops ---------------------------------------------------------------------------------------------


def _layer_norm_trailing(x):
    scale = wb.variable("scale", init=np.linspace(0.5, 1.5, 6).astype("float32"))
    return wb.layer_norm(x, scale, wb.variable("offset", init=np.full(6, 0.1, "float32")))


def _layer_norm_stats(x):
    y, mean, rstd = wb.ops.registry.apply(
        "layer_norm",
        x,
        wb.constant(np.ones(6, "float32")),
        wb.constant(np.zeros(6, "float32")),
        axis=(1,),
        epsilon=1e-3,
    )
    return y + mean * rstd


def _top_k(x):
    values, indices = wb.top_k(x, 3)
    return values + wb.cast(indices, "float32")


MODEL_CASES = {
    "rsqrt_square_erf": lambda x: wb.rsqrt(wb.abs(x) + 1.0) + wb.square(x) + wb.erf(x),
    "clip": lambda x: wb.clip(x, -0.5, wb.constant(np.linspace(0.1, 1.0, 6).astype("float32"))),
    "gelu": lambda x: wb.gelu(x),
    "gelu_tanh": lambda x: wb.gelu(x, approximate="tanh"),
    "layer_norm": _layer_norm_trailing,
    "layer_norm_middle_axis": lambda x: wb.layer_norm(
        wb.reshape(x, (-1, 2, 3)), wb.constant(np.ones((2,), "float32")), wb.constant(np.zeros((2,), "float32")), axis=1
    ),
    "layer_norm_stats": _layer_norm_stats,
    "moments": lambda x: wb.moments(x, axes=[1])[1] + wb.moments(x, axes=[1], keepdims=True)[0][:, 0],
    "cumsum": lambda x: wb.cumsum(x, axis=1) + wb.cumsum(x, axis=1, exclusive=True, reverse=True),
    "top_k": _top_k,
    "pad": lambda x: wb.pad(x, [(0, 0), (2, 1)], value=1.5) + wb.pad(x, [(0, 0), (1, 2)], mode="reflect"),
}


@pytest.mark.parametrize("opset", [13, 17, 20])
@pytest.mark.parametrize("case", sorted(MODEL_CASES))
def test_each_new_op_in_onnx_runtime_equals_sess_run(tmp_path, case, opset):
    g = wb.Graph(name=case)
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 6))
        out = MODEL_CASES[case](x)
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "op.onnx", inputs={"x": x}, outputs={"out": out}, opset=opset)
    types = {n.op_type for n in onnx.load(path).graph.node}
    if case == "layer_norm":
        assert ("LayerNormalization" in types) == (opset >= 17)
    if case.startswith("gelu"):
        assert ("Gelu" in types) == (opset >= 20)
    for n in (3, 8):
        X = _f((n, 6), seed=n)
        (got,) = run_onnx(path, {"x": X})
        assert_close(got, sess.run(out, {x: X}))


def test_scatter_add_needs_opset_16(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 4))
        ids = wb.placeholder("ids", shape=(None,), dtype="int32")
        out = wb.scatter_add(wb.variable("base", shape=(5, 4)), ids, x)
    sess = wb.Session(g)
    with pytest.raises(wb.GraphError, match=r"\(scatter_add\) needs opset 16 or newer.*\n.*test_onnx_export"):
        wb.export_onnx(sess, tmp_path / "s.onnx", {"x": x, "ids": ids}, {"out": out}, opset=15)
    path = wb.export_onnx(sess, tmp_path / "s.onnx", {"x": x, "ids": ids}, {"out": out}, opset=16)
    feeds = {"x": _f((7, 4)), "ids": np.array([0, 4, 4, 1, 0, 0, 2], "int32")}  # repeats add up
    assert_close(run_onnx(path, feeds)[0], sess.run(out, {x: feeds["x"], ids: feeds["ids"]}))


@pytest.mark.parametrize("length", [5, None])
def test_attention_from_primitives_equals_sess_run(tmp_path, length):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2, length, 4))
        mask = wb.placeholder("mask", shape=(None, 1, 1, length), dtype="bool")
        wq = wb.variable("wq", shape=(4, 4))
        q, k = x @ wq, x * 0.5
        outs = {
            "plain": wb.scaled_dot_product_attention(q, k, x),
            "causal": wb.scaled_dot_product_attention(q, k, x, causal=True, scale=0.3),
            "masked": wb.scaled_dot_product_attention(q, k, x, mask=mask, causal=True),
        }
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "att.onnx", {"x": x, "mask": mask}, outs)
    rng = np.random.default_rng(0)
    for n in (1, 3):
        X = _f((n, 2, 5, 4), seed=n)
        M = rng.random((n, 1, 1, 5)) > 0.3
        M[..., 0] = True  # every query keeps a key it may see
        got = run_onnx(path, {"x": X, "mask": M})
        for a, b in zip(got, sess.run(list(outs.values()), {x: X, mask: M}), strict=True):
            assert_close(a, b)


def test_average_pooling_counts_only_real_pixels(tmp_path):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 2, 7, 8))
        outs = {
            f"avg{k}{s}{p}": wb.avg_pool2d(x, k, stride=s, padding=p)
            for k, s, p in [(3, 2, "same"), (2, 3, "same"), (3, 1, "same"), (2, 2, "valid")]
        }
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "avg.onnx", {"x": x}, outs)
    X = _f((3, 2, 7, 8)) + 5.0  # padding that counted would pull the means down
    for a, b in zip(run_onnx(path, {"x": X}), sess.run(list(outs.values()), {x: X}), strict=True):
        assert_close(a, b)


def transformer():
    """Token embeddings, one causal self-attention block with layer norms and a GELU MLP, a classifier."""
    g = wb.Graph(name="transformer")
    with g.as_default():
        ids = wb.placeholder("ids", shape=(None, 6), dtype="int64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.gather(wb.variable("embed", shape=(11, 8), init="normal"), ids)  # (N, 6, 8)
        heads = wb.transpose(wb.reshape(h, (-1, 6, 2, 4)), (0, 2, 1, 3))  # (N, 2, 6, 4)
        q, k, v = (heads @ wb.variable(f"w{n}", shape=(4, 4)) for n in "qkv")
        att = wb.reshape(wb.transpose(wb.scaled_dot_product_attention(q, k, v, causal=True), (0, 2, 1, 3)), (-1, 6, 8))
        h = wb.layer_norm(
            h + att,
            wb.variable("ln1_scale", shape=(8,), init="ones"),
            wb.variable("ln1_offset", shape=(8,), init="zeros"),
        )
        mlp = wb.gelu(h @ wb.variable("up", shape=(8, 16))) @ wb.variable("down", shape=(16, 8))
        h = wb.layer_norm(
            h + mlp,
            wb.variable("ln2_scale", shape=(8,), init="ones"),
            wb.variable("ln2_offset", shape=(8,), init="zeros"),
        )
        logits = wb.mean(h, axis=1) @ wb.variable("head", shape=(8, 3))
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.Adam(0.01).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, ids, y, probs, train


def residual_cnn():
    g = wb.Graph(name="resnet")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 8, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        stem = wb.relu(wb.conv2d(x, wb.variable("stem", shape=(4, 3, 3, 3), init="he_normal"), padding="same"))
        branch = wb.relu(wb.conv2d(stem, wb.variable("c1", shape=(4, 4, 3, 3), init="he_normal"), padding="same"))
        branch = wb.conv2d(branch, wb.variable("c2", shape=(4, 4, 3, 3), init="he_normal"), padding="same")
        h = wb.relu(stem + branch)  # the residual connection
        h = wb.avg_pool2d(
            wb.conv2d(h, wb.variable("down", shape=(8, 4, 3, 3), init="he_normal"), stride=2, padding="same"),
            3,
            stride=2,
            padding="same",
        )
        logits = wb.mean(h, axis=(2, 3)) @ wb.variable("head", shape=(8, 3))
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.Momentum(0.05, 0.9).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, probs, train


@pytest.mark.parametrize("build", [transformer, residual_cnn])
def test_a_transformer_and_a_residual_cnn_in_onnx_runtime_and_load_model(tmp_path, build):
    g, x, y, probs, train = build()
    rng = np.random.default_rng(0)
    if x.dtype == "int64":
        make = lambda n: rng.integers(0, 11, (n, 6))  # noqa: E731
    else:
        make = lambda n: rng.normal(size=(n, 3, 8, 8)).astype("float32")  # noqa: E731
    X = make(64)
    Y = (X.reshape(64, -1)[:, 0] % 3).astype("int64") if x.dtype == "int64" else (X[:, 0, 0, 0] > 0).astype("int64")
    sess = wb.Session(g, seed=1)
    sess.fit(train, {x: X, y: Y}, batch_size=16, steps=4)
    onnx_path = wb.export_onnx(sess, tmp_path / "m.onnx", inputs={"x": x}, outputs={"probs": probs})
    onnx.checker.check_model(onnx.load(onnx_path), full_check=True)
    model = wb.load_model(sess.export(tmp_path / "m.wbmodel", inputs={"x": x}, outputs={"probs": probs}))
    for n in (2, 13):
        batch = make(n)
        expected = sess.run(probs, {x: batch})
        np.testing.assert_array_equal(model.predict({"x": batch})["probs"], expected)
        assert_close(run_onnx(onnx_path, {"x": batch})[0], expected)


# -- control flow ------------------------------------------------------------------------------------------------


def rnn(reverse=False):
    """A tanh RNN over the time axis of x (N, T, D) as a scan, with a cond on the batch's mean."""
    g = wb.Graph(name="rnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 5, 3))
        wx, wh = wb.variable("wx", shape=(3, 4)), wb.variable("wh", shape=(4, 4))
        xs = wb.transpose(x, (1, 0, 2))  # (T, N, D)
        h0 = wb.zeros_like(xs[0] @ wx)
        last, hs = wb.scan(lambda h, xt: (wb.tanh(xt @ wx + h @ wh), h * 2.0), xs, h0, reverse=reverse)
        flipped = wb.cond(wb.mean(x) > 0.0, lambda: last * 2.0, lambda: last - hs[0])
        halves, _ = wb.scan(lambda c, _: (c * 0.5, None), None, last, length=3)
    return g, x, {"last": last, "hs": hs, "flipped": flipped, "halves": halves}


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_and_cond_become_loop_and_if(tmp_path, reverse):
    g, x, outs = rnn(reverse)
    sess = wb.Session(g)
    path = wb.export_onnx(sess, tmp_path / "rnn.onnx", inputs={"x": x}, outputs=outs)
    types = {n.op_type for n in onnx.load(path).graph.node}
    assert {"Loop", "If"} <= types
    for n, shift in ((2, 1.0), (7, -1.0)):  # both branches of the cond
        X = _f((n, 5, 3), seed=n) + shift
        got = run_onnx(path, {"x": X})
        for name, a, b in zip(outs, got, sess.run(list(outs.values()), {x: X}), strict=True):
            assert a.shape == b.shape, name
            assert_close(a, b)
    model = wb.load_model(sess.export(tmp_path / "rnn.wbmodel", {"x": x}, outs))
    X = _f((4, 5, 3))
    for name, value in model.predict(X).items():
        np.testing.assert_array_equal(value, sess.run(outs[name], {x: X}))


# -- models built with wb.layers: batch norm and dropout in inference mode ------------------------------------------


def layers_resnet():
    g = wb.Graph(name="resnet")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 8, 8))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        training = wb.placeholder("training", shape=(), dtype="bool", default=False)
        h = wb.relu(wb.layers.batch_norm(wb.layers.conv2d(x, 8, 3, use_bias=False, name="stem"), training, name="bn0"))
        branch = wb.relu(
            wb.layers.batch_norm(wb.layers.conv2d(h, 8, 3, use_bias=False, name="c1"), training, name="bn1")
        )
        branch = wb.layers.batch_norm(wb.layers.conv2d(branch, 8, 3, use_bias=False, name="c2"), training, name="bn2")
        h = wb.max_pool2d(wb.relu(h + branch), 2, padding="same")
        h = wb.layers.dropout(wb.mean(h, axis=(2, 3)), 0.3, training)
        logits = wb.layers.dense(h, 3, name="head")
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.Adam(0.01).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, x, y, probs, train


def layers_transformer():
    g = wb.Graph(name="transformer")
    with g.as_default():
        ids = wb.placeholder("ids", shape=(None, 6), dtype="int64")
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        training = wb.placeholder("training", shape=(), dtype="bool", default=False)
        h = wb.layers.embedding(ids, 11, 8)
        h = wb.layers.layer_norm(h + wb.layers.multi_head_attention(h, heads=2, causal=True), name="ln1")
        mlp = wb.layers.dense(wb.layers.dense(h, 16, activation=wb.gelu, name="up"), 8, name="down")
        h = wb.layers.layer_norm(h + wb.layers.dropout(mlp, 0.2, training), name="ln2")
        logits = wb.layers.dense(wb.mean(h, axis=1), 3, name="head")
        probs = wb.softmax(logits, name="probs")
        train = wb.optimizers.Adam(0.01).minimize(wb.mean(wb.softmax_cross_entropy(logits, y)))
    return g, ids, y, probs, train


@pytest.mark.slow
@pytest.mark.parametrize("build", [layers_resnet, layers_transformer])
def test_wb_layers_models_export_in_inference_mode(tmp_path, build):
    g, x, y, probs, train = build()
    rng = np.random.default_rng(3)
    if x.dtype == "int64":
        make = lambda n: rng.integers(0, 11, (n, 6))  # noqa: E731
    else:
        make = lambda n: rng.normal(size=(n, 3, 8, 8)).astype("float32")  # noqa: E731
    X = make(48)
    Y = (X.reshape(48, -1)[:, 0] % 3).astype("int64") if x.dtype == "int64" else (X[:, 0, 0, 0] > 0).astype("int64")
    sess = wb.Session(g, seed=2)
    sess.fit(train, {x: X, y: Y}, batch_size=16, steps=4, feed_dict={"training": True})
    model = wb.load_model(sess.export(tmp_path / "m.wbmodel", inputs={"x": x}, outputs={"probs": probs}))
    types = {op.type for op in model.graph.operations}
    assert not types & {"assign", "moments", "dropout", "where"}, types  # moving statistics, no updates
    if build is layers_resnet:
        assert not np.allclose(sess.variables["bn0/moving_mean"], 0)  # training moved them
        np.testing.assert_array_equal(model.variables["bn0/moving_mean"], sess.variables["bn0/moving_mean"])
    onnx_path = wb.export_onnx(model, tmp_path / "m.onnx")
    assert not {n.op_type for n in onnx.load(onnx_path).graph.node} & {"Dropout", "BatchNormalization"}
    for n in (1, 9):
        batch = make(n)
        expected = sess.run(probs, {x: batch})  # training defaults to False
        np.testing.assert_array_equal(model.predict({"x": batch})["probs"], expected)
        assert_close(run_onnx(onnx_path, {"x": batch})[0], expected)
