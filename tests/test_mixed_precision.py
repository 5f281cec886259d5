"""Mixed precision: float16 compute from float32 master weights, and loss scaling, all as graph."""

import contextlib

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import workbench as wb
from workbench.cluster.program import TrainingProgram


@pytest.fixture(scope="module")
def digits():
    X, Y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    return train_test_split(X, Y, test_size=0.25, random_state=0, stratify=Y)


def mlp(mixed=True, loss_scale="dynamic", optimizer=None, hidden=64):
    """The digits MLP; with ``mixed`` built in float16 and trained with ``loss_scale``."""
    g = wb.Graph(name="mlp")
    policy = wb.mixed_precision("float16") if mixed else contextlib.nullcontext()
    with g.as_default(), policy:
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(x @ wb.variable("w1", shape=(64, hidden)) + wb.variable("b1", shape=(hidden,), init="zeros"))
        logits = h @ wb.variable("w2", shape=(hidden, 10)) + wb.variable("b2", shape=(10,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = (optimizer or wb.optimizers.Adam(0.01)).minimize(loss, loss_scale=loss_scale if mixed else None)
    return {"graph": g, "x": x, "y": y, "logits": logits, "loss": loss, "train": train}


def accuracy(sess, m, X, Y):
    return float(np.mean(np.argmax(sess.run(m["logits"], {m["x"]: X}), axis=1) == Y))


def fit(m, X, Y, steps, seed=0):
    sess = wb.Session(m["graph"], seed=seed)
    hist = sess.fit(m["train"], {m["x"]: X, m["y"]: Y}, batch_size=64, steps=steps, fetches=[m["loss"]])
    return sess, hist[m["loss"].name]


# -- the graph ---------------------------------------------------------------------------


def test_masters_are_float32_and_the_forward_matmuls_run_in_float16():
    m = mlp()
    g = m["graph"]
    assert {v.name: v.dtype for v in g.trainable_variables} == dict.fromkeys(["w1", "b1", "w2", "b2"], "float32")
    forward = [op for op in g.operations if not op.name.startswith(("gradients/", "Adam/", "loss_scale/"))]
    kinds = {(op.type, op.outputs[0].dtype) for op in forward if op.outputs}
    assert ("matmul", "float16") in kinds and ("matmul", "float32") not in kinds
    assert ("relu", "float16") in kinds
    sce = next(op for op in forward if op.type == "softmax_cross_entropy")
    assert sce.inputs[0].dtype == "float32" and m["loss"].dtype == "float32"  # the loss in float32
    casts = [op for op in forward if op.type == "cast" and op.inputs[0].op.type == "variable"]
    assert sorted(op.inputs[0].name for op in casts) == ["b1", "b2", "w1", "w2"]  # each master read through one cast
    backward = [op for op in g.operations if op.name.startswith("gradients/") and op.type == "matmul"]
    assert backward and all(op.outputs[0].dtype == "float16" for op in backward)


def test_recorded_gradients_are_the_unscaled_float32_ones_and_the_scale_updates_with_the_optimizer():
    m = mlp()
    g = m["graph"]
    record = g.training[m["train"].name]
    assert record.loss == m["loss"].name and record.update == m["train"].name
    for grad, var in record.gradients:
        assert g.get(grad).dtype == "float32" and g.get(grad).op.type == "divide", (grad, var)
    program = TrainingProgram.from_graph(g, m["train"], fetches=[m["loss"].name])
    assert "loss_scale/scale" in program.replica_variables  # replicas scale the loss and unscale
    assert program.loss_scale == record.loss_scale == "loss_scale/scale"  # times their share of the batch
    assert {"loss_scale/scale", "loss_scale/good_steps"} <= set(program.state_variables)
    update = {op.inputs[0].name for op in g.operations if op.type == "assign" and op.name.startswith("Adam/")}
    assert {"loss_scale/scale", "loss_scale/good_steps"} <= update


def test_rules_of_the_policy():
    g = wb.Graph()
    with g.as_default(), wb.mixed_precision("float16"):
        x = wb.placeholder("x", shape=(None, 3))
        w = wb.variable("w", shape=(3, 3))
        a, b = wb.matmul(x, w), wb.matmul(x, w)
        assert sum(op.type == "cast" and op.inputs[0] is w for op in g.operations) == 1  # cast once per block
        assert (a + x).dtype == "float16"  # float dtypes meet: the compute dtype wins
        assert (x * 2.0).dtype == "float32"  # one float dtype: nothing to cast
        assert wb.sum(a).dtype == "float32" and wb.softmax(b).dtype == "float32"
        with wb.mixed_precision("float32"):
            assert wb.matmul(x, w).dtype == "float32"
        assert wb.assign(w, w * 2.0).dtype == "float32"  # updates are left alone
    with pytest.raises(wb.DTypeError, match="mixed precision computes in float16 .* got 'float64'"):
        with wb.mixed_precision("float64"):
            pass


def test_loss_scale_arguments_are_checked():
    assert repr(wb.optimizers.LossScale.of("dynamic")) == "LossScale(32768, dynamic, growth_interval=2000)"
    assert repr(wb.optimizers.LossScale.of(128)) == "LossScale(128, fixed)"
    with pytest.raises(
        wb.GraphError, match="loss_scale must be None, 'dynamic', a positive number or a LossScale, got 'auto'"
    ):
        wb.optimizers.LossScale.of("auto")
    with pytest.raises(wb.GraphError, match="factor > 1"):
        wb.optimizers.LossScale(factor=1.0)


# -- training ------------------------------------------------------------------------------


@pytest.mark.slow
def test_mixed_precision_mlp_learns_digits_like_float32(digits):
    X_train, X_test, Y_train, Y_test = digits
    ref = mlp(mixed=False)
    ref_sess, ref_losses = fit(ref, X_train, Y_train, steps=150)
    m = mlp()
    sess, losses = fit(m, X_train, Y_train, steps=150)
    assert all(v.dtype == np.float32 for k, v in sess.variables.items() if k != "loss_scale/good_steps")
    assert float(sess.variables["loss_scale/scale"]) >= 1.0
    assert losses[-10:].mean() < 0.2 * losses[:10].mean()
    mixed_acc, ref_acc = accuracy(sess, m, X_test, Y_test), accuracy(ref_sess, ref, X_test, Y_test)
    assert mixed_acc >= 0.93 and mixed_acc >= ref_acc - 0.02, (mixed_acc, ref_acc)
    np.testing.assert_allclose(losses[:5], ref_losses[:5], rtol=2e-2)  # the same run, to float16 accuracy


def test_a_fixed_scale_gives_the_unscaled_update():
    a, b = (
        mlp(loss_scale=1.0, optimizer=wb.optimizers.SGD(0.1)),
        mlp(loss_scale=1024.0, optimizer=wb.optimizers.SGD(0.1)),
    )
    rng = np.random.default_rng(0)
    X, Y = rng.random((64, 64)).astype(np.float32), rng.integers(0, 10, 64)
    results = []
    for m in (a, b):
        sess = wb.Session(m["graph"], seed=0)
        sess.run(m["train"], {m["x"]: X, m["y"]: Y})
        results.append(sess.variables)
    assert "loss_scale/scale" not in results[1]  # a fixed scale is a constant
    for name in ("w1", "b1", "w2", "b2"):
        np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-3, atol=1e-5, err_msg=name)


def test_dynamic_scale_skips_overflowing_steps_halves_and_grows():
    scale = wb.optimizers.LossScale(initial=2.0**40, growth_interval=3)  # float16 gradients overflow at once
    m = mlp(loss_scale=scale, hidden=16)
    rng = np.random.default_rng(0)
    X, Y = rng.random((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
    sess = wb.Session(m["graph"], seed=0)
    before = dict(sess.variables)
    feed = {m["x"]: X, m["y"]: Y}
    with np.errstate(over="ignore", invalid="ignore"):
        sess.run(m["train"], feed)
    after = sess.variables
    for name, value in before.items():  # a skipped step: weights, Adam's moments and step count unchanged
        if not name.startswith("loss_scale/"):
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert float(after["loss_scale/scale"]) == 2.0**39 and int(after["loss_scale/good_steps"]) == 0
    scales, skipped = [], 1
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(40):
            w_before = sess.variables["w1"].copy()
            sess.run(m["train"], feed)
            skipped += int(np.array_equal(sess.variables["w1"], w_before))
            scales.append(float(sess.variables["loss_scale/scale"]))
    first_good = next(i for i in range(1, len(scales)) if scales[i] >= scales[i - 1])
    assert all(s == 2.0 ** (38 - i) for i, s in enumerate(scales[:first_good]))  # halved on every bad step
    assert float(sess.variables["Adam/step"]) == 41 - skipped
    assert 2.0**10 <= scales[first_good] <= 2.0**20  # (p - y) / 32 * scale fits float16 from about 2**21 down
    grown = [i for i in range(first_good + 1, len(scales)) if scales[i] == 2 * scales[i - 1]]
    assert grown and grown[0] == first_good + 2  # doubled on the third good step in a row
    assert scales[first_good + 3] == scales[first_good]  # too large again: halved, and growing starts over
    assert grown[1] == first_good + 6


@pytest.mark.slow
def test_json_round_trip_trains_the_same(digits):
    X_train, _, Y_train, _ = digits
    m = mlp()
    copy = wb.Graph.from_json(m["graph"].to_json())
    assert copy.training == m["graph"].training
    assert [(op.type, [t.dtype for t in op.outputs]) for op in copy.operations] == [
        (op.type, [t.dtype for t in op.outputs]) for op in m["graph"].operations
    ]
    results = []
    for g in (m["graph"], copy):
        sess = wb.Session(g, seed=0)
        sess.fit(m["train"].name, {"x": X_train, "y": Y_train}, batch_size=64, steps=20)
        results.append(sess.variables)
    assert sorted(results[0]) == sorted(results[1])
    for name in results[0]:
        np.testing.assert_array_equal(results[1][name], results[0][name], err_msg=name)
