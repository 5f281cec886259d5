"""wb.layers: variables under each layer's scope, values against PyTorch, batch norm's moving statistics."""

import numpy as np
import pytest

import workbench as wb

torch = pytest.importorskip("torch")
F = torch.nn.functional

RNG = np.random.default_rng(0)


def normal(*shape, dtype="float64"):
    return RNG.normal(size=shape).astype(dtype)


def test_dense_acts_on_the_last_axis_of_any_rank():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 5, 3), dtype="float64")
        y = wb.layers.dense(x, 4, activation=wb.tanh)
        z = wb.layers.dense(y, 2, use_bias=False)
    assert y.shape == (None, 5, 4) and z.shape == (None, 5, 2)
    assert [v.name for v in g.variables] == ["dense/kernel", "dense/bias", "dense_1/kernel"]
    sess = wb.Session(g)
    x0 = normal(2, 5, 3)
    v = sess.variables
    np.testing.assert_allclose(sess.run(y, {x: x0}), np.tanh(x0 @ v["dense/kernel"] + v["dense/bias"]), rtol=1e-12)


def test_a_named_layer_uses_its_name_as_scope():
    g = wb.Graph()
    with g.as_default(), wb.name_scope("encoder"):
        x = wb.placeholder("x", shape=(None, 3))
        wb.layers.dense(x, 2, name="proj")
        wb.layers.dense(x, 2)
        wb.layers.dense(x, 2)
    assert [v.name for v in g.variables] == [
        "encoder/proj/kernel", "encoder/proj/bias", "encoder/dense/kernel", "encoder/dense/bias",
        "encoder/dense_1/kernel", "encoder/dense_1/bias",
    ]  # fmt: skip


def test_conv2d_matches_pytorch():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3, 7, 7), dtype="float64")
        y = wb.layers.conv2d(x, 5, 3, stride=2, padding="SAME", activation=wb.relu)
    sess = wb.Session(g)
    x0, v = normal(2, 3, 7, 7), sess.variables
    expected = F.relu(F.conv2d(torch.tensor(x0), torch.tensor(v["conv2d/kernel"]), torch.tensor(v["conv2d/bias"]),
                               stride=2, padding=1))  # fmt: skip
    np.testing.assert_allclose(sess.run(y, {x: x0}), expected.numpy(), rtol=1e-10, atol=1e-12)


def _bn_model(dtype, momentum=0.9):
    g = wb.Graph(name="bn")
    with g.as_default():
        training = wb.placeholder("training", shape=(), dtype="bool", default=False)
        x = wb.placeholder("x", shape=(None, 4, 5, 5), dtype=dtype)
        y = wb.layers.batch_norm(x, training, momentum=momentum, epsilon=1e-3)
        loss = wb.mean(y * wb.constant(np.arange(4.0).reshape(4, 1, 1).astype(dtype)))
        train = wb.optimizers.SGD(0.5).minimize(loss)
    return g, x, y, train


@pytest.mark.parametrize("dtype, rtol", [pytest.param("float64", 1e-10, marks=pytest.mark.slow), ("float32", 1e-5)])
def test_batch_norm_trains_and_evaluates_as_pytorch(dtype, rtol):
    g, x, y, train = _bn_model(dtype)
    sess = wb.Session(g)
    ref = torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.1).to(getattr(torch, dtype))
    opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    weights = torch.arange(4.0, dtype=getattr(torch, dtype)).reshape(4, 1, 1)
    for step in range(4):
        x0 = normal(6, 4, 5, 5, dtype=dtype) * 3 + step
        ref.train()
        out = ref(torch.tensor(x0))
        np.testing.assert_allclose(sess.run(y, {x: x0, "training": True}), out.detach().numpy(), rtol=rtol, atol=rtol)
        opt.zero_grad()
        (out * weights).mean().backward()
        opt.step()
        sess.run(train, {x: x0, "training": True})
    v = sess.variables
    np.testing.assert_allclose(v["batch_norm/moving_mean"], ref.running_mean.numpy(), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(v["batch_norm/moving_variance"], ref.running_var.numpy(), rtol=rtol)
    np.testing.assert_allclose(v["batch_norm/gamma"], ref.weight.detach().numpy(), rtol=rtol)
    ref.eval()
    x1 = normal(3, 4, 5, 5, dtype=dtype)
    np.testing.assert_allclose(sess.run(y, {x: x1}), ref(torch.tensor(x1)).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_batch_norm_statistics_move_only_with_the_training_op_and_are_checkpointed(tmp_path):
    g, x, y, train = _bn_model("float64")
    sess = wb.Session(g)
    x0 = normal(6, 4, 5, 5) + 2.0
    sess.run([y], {x: x0, "training": True})  # a forward pass alone updates nothing
    sess.run(train, {x: x0})  # nor does training with the switch at inference
    assert sess.variables["batch_norm/moving_mean"].tolist() == [0.0] * 4
    sess.run(train, {x: x0, "training": True})
    moved = sess.variables["batch_norm/moving_mean"]
    np.testing.assert_allclose(moved, 0.1 * x0.mean(axis=(0, 2, 3)), rtol=1e-12)
    sess.save(tmp_path / "bn.npz")
    again = wb.Session(wb.Graph.from_json(g.to_json()))
    again.restore(tmp_path / "bn.npz")
    np.testing.assert_array_equal(again.variables["batch_norm/moving_mean"], moved)
    np.testing.assert_allclose(again.run(y.name, {"x": x0}), sess.run(y, {x: x0}), rtol=1e-12)
    assert again.graph.updates == g.updates


def test_batch_norm_with_python_bools_and_on_features():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        on = wb.layers.batch_norm(x, True)
        off = wb.layers.batch_norm(x, False)
    assert list(g.updates) == ["batch_norm/update_moving_mean", "batch_norm/update_moving_variance"]
    sess = wb.Session(g)
    x0 = normal(8, 3)
    expected = (x0 - x0.mean(0)) / np.sqrt(x0.var(0) + 1e-3)
    np.testing.assert_allclose(sess.run(on, {x: x0}), expected, rtol=1e-10)
    np.testing.assert_allclose(sess.run(off, {x: x0}), x0 / np.sqrt(1 + 1e-3), rtol=1e-12)


def test_layer_norm_embedding_and_dropout_layers():
    g = wb.Graph()
    with g.as_default():
        ids = wb.placeholder("ids", shape=(None, 4), dtype="int64")
        e = wb.layers.embedding(ids, 10, 6, dtype="float64")
        n = wb.layers.layer_norm(e)
        d = wb.layers.dropout(n, 0.5, training=False)
    assert e.shape == (None, 4, 6) and d is n
    sess = wb.Session(g)
    i0 = RNG.integers(0, 10, (2, 4))
    table = sess.variables["embedding/embeddings"]
    np.testing.assert_array_equal(sess.run(e, {ids: i0}), table[i0])
    expected = F.layer_norm(torch.tensor(table[i0]), (6,), eps=1e-5).numpy()
    np.testing.assert_allclose(sess.run(n, {ids: i0}), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention_matches_pytorch(causal):
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 5, 8), dtype="float64")
        y = wb.layers.multi_head_attention(x, heads=2, causal=causal)
    assert y.shape == (None, 5, 8)
    sess = wb.Session(g)
    v = sess.variables
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.tensor(v["multi_head_attention/qkv/kernel"].T))
        ref.in_proj_bias.copy_(torch.tensor(v["multi_head_attention/qkv/bias"]))
        ref.out_proj.weight.copy_(torch.tensor(v["multi_head_attention/out/kernel"].T))
        ref.out_proj.bias.copy_(torch.tensor(v["multi_head_attention/out/bias"]))
    x0 = normal(3, 5, 8)
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1) if causal else None
    expected, _ = ref(*(torch.tensor(x0),) * 3, attn_mask=mask, need_weights=False)
    np.testing.assert_allclose(sess.run(y, {x: x0}), expected.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda x: wb.layers.multi_head_attention(x, heads=3), wb.ShapeError, "d=8 does not divide into 3 heads"),
        (lambda x: wb.layers.conv2d(x, 4, 3), wb.ShapeError, r"conv2d needs an input of shape \(N, C, H, W\)"),
        (lambda x: wb.layers.batch_norm(x, True, momentum=1.5), wb.ArgumentError, "momentum must be in"),
    ],
)  # fmt: skip
def test_layer_arguments_that_do_not_fit(make, error, message):
    with wb.Graph().as_default():
        x = wb.placeholder("x", shape=(None, 5, 8))
        with pytest.raises(error, match=message):
            make(x)
