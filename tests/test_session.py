"""Session: plans, fetches, feeds, numerics, variables, fit and checkpoints."""

import os

import numpy as np
import pytest

import workbench as wb
from workbench.events import PlanCompiled, RunFailed, RunFinished, RunStarted


@pytest.fixture
def model():
    """A small float64 regression model with a training op."""
    g = wb.Graph(name="model")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3), dtype="float64")
        y = wb.placeholder("y", shape=(None,), dtype="float64")
        w = wb.variable("w", shape=(3, 1), init="glorot_uniform", dtype="float64")
        b = wb.variable("b", shape=(1,), init=0.0, dtype="float64")
        pred = wb.reshape(x @ w + b, (-1,))
        loss = wb.mean((pred - y) ** 2)
        train = wb.optimizers.SGD(0.1).minimize(loss)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    Y = X @ np.array([1.0, -2.0, 0.5]) + 0.3
    return dict(g=g, x=x, y=y, w=w, b=b, pred=pred, loss=loss, train=train, X=X, Y=Y)


def compiled(sess):
    events = []
    sess.events.subscribe(lambda e: events.append(e) if isinstance(e, PlanCompiled) else None)
    return events


# -- plans -------------------------------------------------------------------------------


def test_plan_compiled_once_per_fetches_and_feed_signature(model):
    sess = wb.Session(model["g"])
    events = compiled(sess)
    x, y, X, Y, loss, pred = (model[k] for k in ("x", "y", "X", "Y", "loss", "pred"))
    for _ in range(3):
        sess.run(loss, {x: X, y: Y})
    sess.run(loss, {"x": X[:5], "y": Y[:5]})  # names and other batch sizes: same plan
    assert len(events) == 1
    assert events[0].fetches == (loss.name,) and events[0].session == sess.token and events[0].graph == model["g"].token
    sess.run(pred, {x: X})
    sess.run(pred, {x: X})
    assert len(events) == 2
    sess.run([pred, loss], {x: X, y: Y})
    assert len(events) == 3
    sess.run(pred, {x: X, y: Y})  # another set of feeds
    assert len(events) == 4
    sess.fit(model["train"], {x: X, y: Y}, batch_size=8, steps=10, fetches=[loss])
    assert len(events) == 5


def test_plans_see_ops_added_later(model):
    sess = wb.Session(model["g"])
    x, X = model["x"], model["X"]
    first = sess.run(model["pred"], {x: X})
    with model["g"].as_default():
        doubled = model["pred"] * 2.0
    np.testing.assert_allclose(sess.run(doubled, {x: X}), 2 * first)


# -- fetches -----------------------------------------------------------------------------


def test_fetch_structures(model):
    sess = wb.Session(model["g"])
    x, y, X, Y, loss, pred, train = (model[k] for k in ("x", "y", "X", "Y", "loss", "pred", "train"))
    feed = {x: X, y: Y}
    value = sess.run(loss, feed)
    assert np.shape(value) == ()
    assert sess.run(loss.name, feed) == value
    out = sess.run({"a": [loss, (pred, "w")], "b": {"c": loss}, "t": train}, feed)
    assert set(out) == {"a", "b", "t"}
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert out["a"][0] == value and out["b"]["c"] == value
    assert out["a"][1][0].shape == (40,) and out["a"][1][1].shape == (3, 1)
    assert out["t"] is None
    assert sess.run([], feed) == [] and sess.run((), feed) == ()


def test_fetching_an_operation_gives_none(model):
    g = wb.Graph()
    with g.as_default():
        v = wb.variable("v", shape=(), init=0.0, dtype="float64")
        inc = wb.assign_add(v, 1.0)
    sess = wb.Session(g)
    assert sess.run(inc.op) is None  # an op with outputs, run for effect
    assert sess.run(inc) == 2.0  # its tensor gives the value
    assert sess.run([inc.op, v]) == [None, 2.0]  # reads see the value at the start of the run
    assert sess.variables["v"] == 3.0


def test_bad_fetches(model):
    sess = wb.Session(model["g"])
    with pytest.raises(wb.GraphError, match="no tensor or operation named 'nope'"):
        sess.run("nope")
    with pytest.raises(wb.GraphError, match="cannot fetch 3"):
        sess.run(3)


# -- feeds -------------------------------------------------------------------------------


def test_feed_wrong_shape_names_the_placeholder(model):
    sess = wb.Session(model["g"])
    with pytest.raises(wb.FeedError, match=r"placeholder 'x' expects shape \(None, 3\), got shape \(4, 2\)"):
        sess.run(model["pred"], {"x": np.ones((4, 2))})
    with pytest.raises(wb.FeedError, match=r"placeholder 'x' expects shape \(None, 3\), got shape \(3,\)"):
        sess.run(model["pred"], {"x": np.ones(3)})


def test_feed_wrong_dtype_names_the_placeholder(graph):
    labels = wb.placeholder("labels", shape=(None,), dtype="int64")
    out = labels + 1
    sess = wb.Session(graph)
    with pytest.raises(wb.FeedError, match="placeholder 'labels' expects int64 values, got float64"):
        sess.run(out, {labels: np.array([1.0, 2.5])})
    with pytest.raises(wb.FeedError, match="placeholder 'labels' expects int64 values, got"):
        sess.run(out, {labels: ["a", "b"]})
    np.testing.assert_array_equal(sess.run(out, {labels: np.array([1, 2], np.int32)}), [2, 3])


def test_feed_unknown_name_or_non_placeholder(model):
    sess = wb.Session(model["g"])
    X = model["X"]
    with pytest.raises(wb.FeedError, match="no placeholder named 'nope'"):
        sess.run(model["pred"], {"x": X, "nope": 1.0})
    with pytest.raises(wb.FeedError, match="only placeholders can be fed; 'w' is a variable op"):
        sess.run(model["pred"], {"x": X, "w": np.zeros((3, 1))})
    with pytest.raises(wb.FeedError, match="only placeholders can be fed; 'w' is a variable op"):
        sess.run(model["pred"], {"x": X, model["w"]: np.zeros((3, 1))})
    with pytest.raises(wb.FeedError, match="feed keys are placeholders or their names"):
        sess.run(model["pred"], {0: X})


def test_missing_feed_names_the_placeholder(model):
    sess = wb.Session(model["g"])
    with pytest.raises(wb.FeedError, match=r"placeholder 'y' \(shape \(None,\), float64\) must be fed"):
        sess.run(model["loss"], {"x": model["X"]})
    with pytest.raises(wb.FeedError, match=r"placeholder 'x' .* must be fed"):
        sess.run(model["pred"])


def test_feed_from_another_graph(model):
    other = wb.Graph(name="other")
    with other.as_default():
        x2 = wb.placeholder("x", shape=(None, 3), dtype="float64")
    with pytest.raises(wb.FeedError, match="belongs to graph 'other'"):
        wb.Session(model["g"]).run(model["pred"], {x2: model["X"]})


def test_unneeded_feeds_are_checked_but_ignored(model):
    sess = wb.Session(model["g"])
    sess.run(model["pred"], {"x": model["X"], "y": model["Y"][:3]})
    with pytest.raises(wb.FeedError, match="placeholder 'y'"):
        sess.run(model["pred"], {"x": model["X"], "y": np.ones((3, 3))})


# -- numerics ----------------------------------------------------------------------------


def test_check_numerics_names_the_first_bad_op_and_line(graph):
    x = wb.placeholder("x", shape=(None,), dtype="float64")
    y = wb.log(x)  # NaN for negative x
    z = wb.sqrt(y) * 2.0
    sess = wb.Session(graph)
    with np.errstate(all="ignore"):
        assert np.isnan(sess.run(z, {x: [-1.0]})).all()  # off by default
        with pytest.raises(
            wb.NumericsError, match=r"(?s)log 'log' produced NaN.*y = wb.log\(x\)  # NaN for negative x"
        ):
            sess.run(z, {x: [-1.0, 2.0]}, check_numerics=True)
        with pytest.raises(wb.NumericsError, match="log 'log' produced Inf"):
            sess.run(z, {x: [0.0]}, check_numerics=True)
    np.testing.assert_allclose(sess.run(z, {x: [np.e]}, check_numerics=True), [2.0])


def test_check_numerics_in_fit(graph):
    x = wb.placeholder("x", shape=(None, 1), dtype="float64")
    w = wb.variable("w", shape=(1, 1), init=1.0, dtype="float64")
    loss = wb.mean(wb.log(x @ w))  # the bad line
    train = wb.optimizers.SGD(0.1).minimize(loss)
    sess = wb.Session(graph)
    data = np.array([[1.0], [2.0], [-3.0], [4.0]])
    with np.errstate(all="ignore"):
        with pytest.raises(
            wb.NumericsError, match=r"(?s)log 'log' produced NaN.*loss = wb.mean\(wb.log\(x @ w\)\)  # the bad line"
        ):
            sess.fit(train, {x: data}, batch_size=4, steps=3, check_numerics=True)
    assert sess.variables["w"] == 1.0  # stopped before the update


# -- variables and updates ----------------------------------------------------------------


def test_variables_persist_between_runs(model):
    sess = wb.Session(model["g"], seed=0)
    before = sess.variables["w"]
    feed = {"x": model["X"], "y": model["Y"]}
    losses = []
    for _ in range(5):
        sess.run(model["train"], feed)
        losses.append(sess.run(model["loss"], feed))
    assert np.all(np.diff(losses) < 0)
    assert not np.array_equal(sess.variables["w"], before)
    # sess.variables hands out copies
    sess.variables["w"][:] = 0
    assert np.any(sess.variables["w"] != 0)


def test_fetched_values_do_not_alias_variables(graph):
    v = wb.variable("v", shape=(3,), init=1.0, dtype="float64")
    flat = wb.reshape(v, (3, 1))
    sess = wb.Session(graph)
    for fetched in (sess.run(v), sess.run(flat), sess.run("v")):
        fetched[...] = 7.0  # the caller owns what it fetched
    np.testing.assert_array_equal(sess.variables["v"], [1.0, 1.0, 1.0])


def test_assign_copies_the_fed_value(graph):
    p = wb.placeholder("p", shape=(2,), dtype="float64")
    v = wb.variable("v", shape=(2,), init=0.0, dtype="float64")
    load = wb.assign(v, p)
    sess = wb.Session(graph)
    data = np.array([1.0, 2.0])
    sess.run(load, {p: data})
    data[0] = 99.0
    np.testing.assert_array_equal(sess.variables["v"], [1.0, 2.0])


def test_assign_semantics(graph):
    v = wb.variable("v", shape=(2,), init=np.array([1.0, 2.0]), dtype="float64")
    read = v * 1.0
    inc = wb.assign_add(v, 10.0)
    dec = wb.assign_sub(v, np.array([1.0, 2.0]))
    late_read = v + 0.0  # created after the updates: still the value at the start of the run
    sess = wb.Session(graph)
    r, i, d, late = sess.run([read, inc, dec, late_read])
    np.testing.assert_array_equal(r, [1.0, 2.0])
    np.testing.assert_array_equal(i, [11.0, 12.0])  # updates apply in order
    np.testing.assert_array_equal(d, [10.0, 10.0])
    np.testing.assert_array_equal(late, [1.0, 2.0])
    np.testing.assert_array_equal(sess.variables["v"], [10.0, 10.0])
    np.testing.assert_array_equal(sess.run(read), [10.0, 10.0])
    with graph.as_default():
        setter = wb.assign(v, 5.0)  # a scalar broadcast to the variable's shape
    np.testing.assert_array_equal(sess.run(setter), [5.0, 5.0])
    np.testing.assert_array_equal(sess.variables["v"], [5.0, 5.0])


def test_assign_shape_and_dtype_checked_when_built(graph):
    v = wb.variable("v", shape=(2,), init=0.0, dtype="float64")
    with pytest.raises(wb.ShapeError, match=r"assign 'assign': shapes \(2,\), \(3,\) do not broadcast"):
        wb.assign(v, wb.constant(np.ones(3)))
    with pytest.raises(wb.DTypeError):
        wb.assign(v, wb.constant(np.ones(2, np.float32)))


def test_initialize_and_seeds(model):
    a, b, c = wb.Session(model["g"], seed=0), wb.Session(model["g"], seed=0), wb.Session(model["g"], seed=1)
    np.testing.assert_array_equal(a.variables["w"], b.variables["w"])
    assert not np.array_equal(a.variables["w"], c.variables["w"])
    np.testing.assert_array_equal(a.variables["b"], [0.0])
    start = a.variables["w"]
    a.run(model["train"], {"x": model["X"], "y": model["Y"]})
    a.initialize()
    np.testing.assert_array_equal(a.variables["w"], start)


# -- fit ---------------------------------------------------------------------------------


def test_fit_records_and_lengths(model):
    sess = wb.Session(model["g"], seed=0)
    data = {"x": model["X"], "y": model["Y"]}
    hist = sess.fit(model["train"], data, batch_size=8, steps=7, fetches=[model["loss"]])
    assert len(hist) == 7 and [r["step"] for r in hist.records] == list(range(1, 8))
    assert all(r["samples_per_s"] > 0 and r["time"] >= 0 for r in hist.records)
    assert hist[model["loss"].name].shape == (7,)
    assert len(sess.fit(model["train"], data, batch_size=8, epochs=2)) == 2 * (40 // 8)
    assert len(sess.fit(model["train"], data, batch_size=16)) == 40 // 16  # one epoch
    named = sess.fit(model["train"], data, batch_size=8, steps=2, fetches={"mse": model["loss"], "p": "w"})
    assert set(named.records[0]) >= {"mse", "p"}
    with pytest.raises(wb.FeedError, match="batch_size 50 is larger than the data"):
        sess.fit(model["train"], data, batch_size=50, steps=1)
    with pytest.raises(wb.FeedError, match="differ in length"):
        sess.fit(model["train"], {"x": model["X"], "y": model["Y"][:10]}, batch_size=5, steps=1)
    with pytest.raises(wb.FeedError, match=r"placeholder 'x' expects shape \(None, 3\), got data of shape"):
        sess.fit(model["train"], {"x": model["X"][:, :2], "y": model["Y"]}, batch_size=5, steps=1)


def test_fit_is_deterministic(model):
    def train(seed):
        sess = wb.Session(model["g"], seed=seed)
        hist = sess.fit(
            model["train"], {"x": model["X"], "y": model["Y"]}, batch_size=8, steps=20, fetches=[model["loss"]]
        )
        return hist[model["loss"].name], sess.variables

    l0, v0 = train(0)
    l0b, v0b = train(0)
    l1, v1 = train(1)
    np.testing.assert_array_equal(l0, l0b)
    for name in v0:
        np.testing.assert_array_equal(v0[name], v0b[name])
    assert not np.array_equal(l0, l1)
    assert l0[-5:].mean() < l0[:5].mean()


def test_batch_order_comes_from_the_session_seed(graph):
    x = wb.placeholder("x", shape=(None,), dtype="float64")
    total = wb.sum(x)
    seen = wb.variable("seen", shape=(), init=0.0, dtype="float64")
    step = wb.assign_add(seen, total)
    data = np.arange(20.0)

    def batches(seed):
        sess = wb.Session(graph, seed=seed)
        return sess.fit(step, {x: data}, batch_size=5, steps=8, fetches=[total])[total.name]

    a, b, c = batches(0), batches(0), batches(3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # each epoch (4 steps) covers the data exactly once
    assert a[:4].sum() == data.sum() and a[4:].sum() == data.sum()
    assert not np.array_equal(a[:4], a[4:])  # epochs are reshuffled


def test_dropout_is_repeatable_with_the_same_seed(graph):
    x = wb.placeholder("x", shape=(4, 50), dtype="float64")
    d = wb.dropout(x, 0.5)
    ones = np.ones((4, 50))

    def masks(seed):
        sess = wb.Session(graph, seed=seed)
        return [sess.run(d, {x: ones}) for _ in range(3)]

    a, b, c = masks(0), masks(0), masks(1)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], a[1])  # a new mask each run
    assert not np.array_equal(a[0], c[0])
    assert set(np.unique(a[0])) <= {0.0, 2.0}  # kept values scaled by 1 / (1 - rate)


# -- checkpoints -------------------------------------------------------------------------


def trained(model, seed=0, steps=3):
    sess = wb.Session(model["g"], seed=seed)
    sess.fit(model["train"], {"x": model["X"], "y": model["Y"]}, batch_size=8, steps=steps)
    return sess


def test_save_restore_round_trip(model, tmp_path):
    sess = trained(model)
    path = sess.save(tmp_path / "ckpt.npz")
    assert os.path.exists(path) and os.listdir(tmp_path) == ["ckpt.npz"]
    fresh = wb.Session(model["g"], seed=5)
    fresh.restore(path)
    for name, value in sess.variables.items():
        np.testing.assert_array_equal(fresh.variables[name], value)
    feed = {"x": model["X"], "y": model["Y"]}
    assert fresh.run(model["loss"], feed) == sess.run(model["loss"], feed)


def test_save_handles_any_variable_name(tmp_path):
    g = wb.Graph()
    with g.as_default():
        for name in ("file", "allow_pickle", "layer/w", "args"):
            wb.variable(name, shape=(2,), init=float(len(name)))
    sess = wb.Session(g)
    sess.save(tmp_path / "c.npz")
    with g.as_default():
        bump = wb.group(*(wb.assign_add(v, 1.0) for v in g.variables))
    other = wb.Session(g)
    other.run(bump)
    other.restore(tmp_path / "c.npz")
    assert sorted(other.variables) == sorted(sess.variables)
    for name, value in sess.variables.items():
        np.testing.assert_array_equal(other.variables[name], value)


def _partial_write(member, array, **kwargs):
    member.write(b"\x93NUMPY half an array")
    raise OSError("disk full")


def _failed_replace(src, dst):
    raise OSError("disk full")


@pytest.mark.parametrize("target, broken", [(np.lib.format, "write_array"), (os, "replace")])
def test_save_is_atomic(model, tmp_path, monkeypatch, target, broken):
    path = tmp_path / "ckpt.npz"
    old = trained(model, steps=1)
    old.save(path)
    before = path.read_bytes()
    new = trained(model, steps=5)
    monkeypatch.setattr(target, broken, _partial_write if broken == "write_array" else _failed_replace)
    with pytest.raises(OSError, match="disk full"):
        new.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.npz"]  # no temporary file left behind
    new.save(path)
    assert path.read_bytes() != before and os.listdir(tmp_path) == ["ckpt.npz"]
    fresh = wb.Session(model["g"])
    fresh.restore(path)
    np.testing.assert_array_equal(fresh.variables["w"], new.variables["w"])


def assert_restore_fails(sess, path, match):
    before = sess.variables
    with pytest.raises(wb.FormatError, match=match):
        sess.restore(path)
    for name, value in sess.variables.items():
        np.testing.assert_array_equal(value, before[name])


def test_restore_bad_files(model, tmp_path):
    good = trained(model).save(tmp_path / "good.npz")
    sess = trained(model, seed=1)
    data = open(good, "rb").read()
    for cut in (10, len(data) // 2, len(data) - 10):
        (tmp_path / f"cut{cut}.npz").write_bytes(data[:cut])
        assert_restore_fails(sess, tmp_path / f"cut{cut}.npz", "cannot read checkpoint")
    (tmp_path / "text.npz").write_text("not a checkpoint")
    assert_restore_fails(sess, tmp_path / "text.npz", "cannot read checkpoint")
    np.save(tmp_path / "array.npy", np.zeros(3))
    assert_restore_fails(sess, tmp_path / "array.npy", "cannot read checkpoint|not a workbench checkpoint")
    np.savez(tmp_path / "foreign.npz", w=np.zeros((3, 1)))
    assert_restore_fails(sess, tmp_path / "foreign.npz", "not a workbench checkpoint")
    assert_restore_fails(sess, tmp_path / "missing.npz", "no checkpoint at")


def test_restore_never_unpickles(model, tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    sess = trained(model)
    values = sess.variables
    values["w"] = np.array([Evil()], dtype=object)
    np.savez(tmp_path / "evil.npz", __workbench_checkpoint__=np.array(1), **values, allow_pickle=True)
    assert_restore_fails(sess, tmp_path / "evil.npz", "cannot read checkpoint")
    assert not marker.exists()


def test_restore_checks_shapes_dtypes_and_names(model, tmp_path):
    sess = trained(model)
    values = sess.variables

    def write(name, **changes):
        np.savez(tmp_path / name, __workbench_checkpoint__=np.array(1), **{**values, **changes})
        return tmp_path / name

    assert_restore_fails(
        sess,
        write("shape.npz", w=np.zeros((1, 3))),
        r"checkpoint value of 'w' is float64 \(1, 3\), the variable is float64 \(3, 1\)",
    )
    assert_restore_fails(sess, write("dtype.npz", b=np.zeros(1, np.float32)), "checkpoint value of 'b' is float32")
    assert_restore_fails(sess, write("extra.npz", zz=np.zeros(1)), "has variables this graph lacks: zz")
    partial = {k: v for k, v in values.items() if k != "b"}
    np.savez(tmp_path / "partial.npz", __workbench_checkpoint__=np.array(1), **partial)
    assert_restore_fails(sess, tmp_path / "partial.npz", "lacks variables: b")
    sess.restore(tmp_path / "partial.npz", strict=False)


def test_a_failing_kernel_names_the_op_and_its_line():
    g = wb.Graph()
    with g.as_default():
        params = wb.placeholder("params", shape=(None,))
        index = wb.placeholder("index", shape=(None,), dtype="int64")
        picked = wb.gather(params, index)  # the line the error must name
    sess = wb.Session(g)
    events = []
    sess.events.subscribe(events.append)
    with pytest.raises(
        wb.ExecutionError, match=r"gather 'gather' failed: IndexError: .*\n.*picked = wb.gather"
    ) as info:
        sess.run(picked, {params: [1.0, 2.0], index: [5]})
    assert isinstance(info.value, RuntimeError) and info.value.op == "gather"
    assert [type(e) for e in events] == [PlanCompiled, RunStarted, RunFailed]
    assert events[1].ops == ("gather",) and events[2].op == "gather"
    np.testing.assert_array_equal(sess.run(picked, {params: [1.0, 2.0], index: [1, 0]}), [2.0, 1.0])
    assert [type(e) for e in events[-2:]] == [RunStarted, RunFinished]
    assert events[-1]["kind"] == "run_finished"  # events still read like the earlier dicts


@pytest.mark.parametrize("device", [dict(), dict(device="gpu", emulate=True)], ids=["cpu", "gpu-emulated"])
def test_feeds_that_a_cast_would_change_are_refused(device):
    """Fixes: int64 2**40 fed to an int32 placeholder wrapped to 0; uint64 >= 2**63 became negative."""
    g = wb.Graph()
    with g.as_default():
        i32 = wb.placeholder("i32", shape=(None,), dtype="int32")
        i64 = wb.placeholder("i64", shape=(None,), dtype="int64")
        f32 = wb.placeholder("f32", shape=(None,), dtype="float32")
        outs = [wb.identity(i32), wb.identity(i64), wb.identity(f32)]
    sess = wb.Session(g, **device)
    with pytest.raises(wb.FeedError, match="placeholder 'i32' expects int32 values, got int64 value 1099511627776"):
        sess.run(outs[0], {"i32": np.array([1, 2**40], np.int64)})
    with pytest.raises(wb.FeedError, match="placeholder 'i32' expects int32 values, got int64 value -2147483649"):
        sess.run(outs[0], {"i32": np.array([-(2**31) - 1], np.int64)})
    with pytest.raises(
        wb.FeedError, match="placeholder 'i64' expects int64 values, got uint64 value 9223372036854775808"
    ):
        sess.run(outs[1], {"i64": np.array([3, 2**63], np.uint64)})
    with pytest.raises(
        wb.FeedError, match="placeholder 'f32' expects float32 values, got float64 value 1e\\+300 that overflows"
    ):
        sess.run(outs[2], {"f32": np.array([1.0, 1e300])})
    # lossless casts (and float rounding, and infinities already there) stay accepted
    assert sess.run(outs[0], {"i32": np.array([-(2**31), 2**31 - 1], np.int64)}).tolist() == [-(2**31), 2**31 - 1]
    assert sess.run(outs[1], {"i64": np.array([2**63 - 1], np.uint64)}).tolist() == [2**63 - 1]
    assert sess.run(outs[0], {"i32": np.array([], np.int64)}).shape == (0,)
    got = sess.run(outs[2], {"f32": np.array([0.1, np.inf, -np.inf, np.nan])})
    assert got.dtype == np.float32 and got[0] == np.float32(0.1) and np.isinf(got[1:3]).all() and np.isnan(got[3])
    assert sess.run(outs[2], {"f32": np.array([2**40], np.int64)}).tolist() == [2.0**40]


def test_fit_refuses_data_that_a_cast_would_change():
    g = wb.Graph()
    with g.as_default():
        y = wb.placeholder("y", shape=(None,), dtype="int32")
        v = wb.variable("v", shape=(1,), init=1.0)
        train = wb.optimizers.SGD(0.1).minimize(wb.mean(v * wb.cast(y, "float32")))
    with pytest.raises(wb.FeedError, match="placeholder 'y' expects int32 values, got int64 value 4294967296"):
        wb.Session(g).fit(train, {"y": np.array([1, 2, 2**32, 3], np.int64)}, batch_size=2, steps=1)
