"""Training: the batch order, the history, and models that learn scikit-learn's digits."""

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import workbench as wb
from workbench.training import History, batch_indices


@pytest.fixture(scope="module")
def digits():
    X, Y = load_digits(return_X_y=True)
    X = (X / 16.0).astype(np.float32)
    return train_test_split(X, Y, test_size=0.25, random_state=0, stratify=Y)


def accuracy(sess, logits, x, X, Y):
    return float(np.mean(np.argmax(sess.run(logits, {x: X}), axis=1) == Y))


@pytest.mark.slow
def test_mlp_reaches_95_percent_on_digits(digits):
    X_train, X_test, Y_train, Y_test = digits
    g = wb.Graph(name="mlp")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.relu(x @ wb.variable("w1", shape=(64, 64)) + wb.variable("b1", shape=(64,), init="zeros"))
        logits = h @ wb.variable("w2", shape=(64, 10)) + wb.variable("b2", shape=(10,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, {x: X_train, y: Y_train}, batch_size=64, epochs=15, fetches=[loss])
    losses = hist[loss.name]
    assert losses[-10:].mean() < 0.2 * losses[:10].mean()
    assert accuracy(sess, logits, x, X_test, Y_test) >= 0.95


@pytest.mark.slow
def test_cnn_trains_on_digits(digits):
    X_train, X_test, Y_train, Y_test = digits
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        images = wb.reshape(x, (-1, 1, 8, 8))
        k = wb.variable("k", shape=(8, 1, 3, 3), init="he_normal")
        c = wb.variable("c", shape=(8, 1, 1), init="zeros")
        h = wb.max_pool2d(wb.relu(wb.conv2d(images, k, padding="same") + c), 2)  # (n, 8, 4, 4)
        flat = wb.reshape(h, (-1, 8 * 4 * 4))
        logits = flat @ wb.variable("w", shape=(128, 10)) + wb.variable("b", shape=(10,), init="zeros")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, {x: X_train, y: Y_train}, batch_size=64, epochs=6, fetches=[loss])
    losses = hist[loss.name]
    assert losses[-10:].mean() < 0.25 * losses[:10].mean()
    assert accuracy(sess, logits, x, X_test, Y_test) >= 0.90


# -- the batch order -------------------------------------------------------------------


def test_batch_indices_are_deterministic_epochs():
    batches = list(batch_indices(10, 3, 7, seed=(0, 1)))
    again = list(batch_indices(10, 3, 7, seed=(0, 1)))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again))
    assert [len(b) for b in batches] == [3] * 7
    first_epoch = np.concatenate(batches[:3])
    assert len(set(first_epoch)) == 9  # an epoch never repeats an example; the rest is dropped
    assert all(np.all(np.diff(b) > 0) for b in batches)
    other = list(batch_indices(10, 3, 7, seed=(1, 1)))
    assert any(not np.array_equal(a, b) for a, b in zip(batches, other))


def test_batch_indices_bad_sizes():
    with pytest.raises(wb.FeedError, match="batch_size must be positive, got 0"):
        next(batch_indices(10, 0, 1, seed=0))
    with pytest.raises(wb.FeedError, match="batch_size 11 is larger than the data"):
        next(batch_indices(10, 11, 1, seed=0))


def test_history():
    hist = History()
    assert repr(hist) == "<History: no steps>" and len(hist) == 0
    hist.append({"step": 1, "time": 0.1, "loss": 2.0})
    hist.append({"step": 2, "time": 0.1, "loss": 1.5})
    np.testing.assert_array_equal(hist["loss"], [2.0, 1.5])
    assert "2 steps" in repr(hist) and "loss=1.5" in repr(hist)
    with pytest.raises(KeyError, match="no field 'acc'"):
        hist["acc"]


@pytest.mark.parametrize(
    "arguments, named",
    [
        (dict(steps=-3), "steps must be a positive integer, got -3"),
        (dict(steps=0), "steps must be a positive integer, got 0"),
        (dict(steps=1.5), r"steps must be a positive integer, got 1.5 \(float\)"),
        (dict(steps=True), "steps must be a positive integer, got True"),
        (dict(epochs=-1), "epochs must be a positive integer, got -1"),
        (dict(epochs=0), "epochs must be a positive integer, got 0"),
        (dict(batch_size=2.5), r"batch_size must be a positive integer, got 2.5 \(float\)"),
        (dict(batch_size=0), "batch_size must be a positive integer, got 0"),
        (dict(batch_size="8"), r"batch_size must be a positive integer, got '8' \(str\)"),
        (dict(checkpoint_every=0), "checkpoint_every must be a positive integer, got 0"),
        (dict(checkpoint_every=-2), "checkpoint_every must be a positive integer, got -2"),
        (dict(replicas=0), "replicas must be a positive integer, got 0"),
    ],
)
def test_fit_refuses_counts_that_are_not_positive_integers(arguments, named, tmp_path):
    """Fixes: fit(steps=-3), epochs=-1, batch_size=2.5 ... ran nothing or raised a bare TypeError."""
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None,))
        v = wb.variable("v", shape=(1,), init=1.0)
        train = wb.optimizers.SGD(0.1).minimize(wb.mean((x * v) ** 2))
    sess = wb.Session(g)
    before = sess.variables["v"].copy()
    call = dict(batch_size=4, steps=2, checkpoint_dir=tmp_path)
    call.update(arguments)
    with pytest.raises(wb.ArgumentError, match=named) as info:
        sess.fit(train, {"x": np.ones(8, np.float32)}, **call)
    assert isinstance(info.value, ValueError)
    assert sess.variables["v"] == before and not any(tmp_path.iterdir())


def test_fit_accepts_numpy_integers():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", shape=(None,))
        v = wb.variable("v", shape=(1,), init=1.0)
        train = wb.optimizers.SGD(0.1).minimize(wb.mean((x * v) ** 2))
    history = wb.Session(g).fit(train, {"x": np.ones(8, np.float32)}, batch_size=np.int64(4), steps=np.int32(3))
    assert len(history) == 3


def small_history():
    hist = History()
    for step in range(1, 6):
        record = {"step": step, "time": 0.01, "samples_per_s": 100.0 * step, "loss": np.float32(1.0 / step)}
        if step % 2 == 0:
            record["val_loss"] = 2.0 / step  # a metric recorded every other step only
        hist.append(record)
    return hist


def test_history_as_a_dataframe_indexed_by_step():
    pd = pytest.importorskip("pandas")
    frame = small_history().to_pandas()
    assert isinstance(frame, pd.DataFrame) and frame.index.name == "step"
    assert list(frame.index) == [1, 2, 3, 4, 5]
    assert list(frame.columns) == ["time", "samples_per_s", "loss", "val_loss"]
    np.testing.assert_allclose(frame["loss"], [1.0, 0.5, 1 / 3, 0.25, 0.2], rtol=1e-6)
    assert frame["val_loss"].isna().tolist() == [True, False, True, False, True]
    assert frame.loc[4, "val_loss"] == 0.5


@pytest.mark.slow
def test_history_plot_draws_each_metric_against_the_step():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    ax = small_history().plot(logy=True)
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert sorted(lines) == ["loss", "val_loss"]  # not time or samples/s
    assert list(lines["val_loss"].get_xdata()) == [2, 4]
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "step"
    assert [line.get_label() for line in small_history().plot("loss").get_lines()] == ["loss"]
    with pytest.raises(KeyError, match="no field 'acc'"):
        small_history().plot(["acc"])


@pytest.mark.parametrize("module, method", [("pandas", "to_pandas"), ("matplotlib.pyplot", "plot")])
def test_history_without_pandas_or_matplotlib_says_what_to_install(monkeypatch, module, method):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ImportError, match=rf"History.{method}\(\) needs {module.split('.')[0]}: pip install"):
        getattr(small_history(), method)()


def test_accuracy_helper_matches_numpy_on_a_trained_model(digits):
    X_train, X_test, Y_train, Y_test = digits
    g = wb.Graph(name="softmax")
    with g.as_default():
        w, b = wb.variable("w", shape=(64, 10)), wb.variable("b", shape=(10,), init="zeros")
        x, y = wb.placeholder("x", shape=(None, 64)), wb.placeholder("y", shape=(None,), dtype="int64")
        logits = x @ w + b
        acc = wb.metrics.accuracy(logits, y)
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.Adam(0.01).minimize(loss)
    assert acc.name == "accuracy" and acc.dtype == "float32" and acc.shape == ()
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, {x: X_train, y: Y_train}, batch_size=64, steps=100, fetches=[loss, acc])
    assert hist["accuracy"][-10:].mean() > hist["accuracy"][:5].mean()
    got = float(sess.run(acc, {x: X_test, y: Y_test}))
    assert got == pytest.approx(accuracy(sess, logits, x, X_test, Y_test), abs=1e-6) and got > 0.9


def test_accuracy_helper_refuses_float_labels_and_unbatched_logits():
    g = wb.Graph()
    with g.as_default():
        logits = wb.placeholder("logits", shape=(None, 3))
        with pytest.raises(wb.DTypeError, match="accuracy needs integer class labels, got float32"):
            wb.accuracy(logits, wb.placeholder("p", shape=(None,)))
        with pytest.raises(wb.ShapeError, match=r"accuracy needs logits of shape \(batch, classes\), got \(3,\)"):
            wb.accuracy(wb.constant([1.0, 2.0, 3.0]), wb.constant([0]))
        assert wb.accuracy(logits, wb.placeholder("y32", shape=(None,), dtype="int32")).shape == ()
