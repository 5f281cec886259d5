"""Time per op: Session.run(profile=True), fit(profile=k) and History.profile()."""

import numpy as np
import pytest

import workbench as wb


def model(width=256):
    g = wb.Graph(name="wide")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, width))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.layers.dense(x, width, activation=wb.tanh, name="hidden")
        logits = wb.layers.dense(h, 4, name="out")
        loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        train = wb.optimizers.SGD(0.01).minimize(loss)
    return g, x, y, loss, train


def data(width=256, n=512):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(n, width)).astype("float32"), "y": rng.integers(0, 4, n)}


def test_run_with_profile_times_every_kernel_call():
    g, x, y, loss, _ = model()
    sess = wb.Session(g, seed=0)
    feeds = {x: data()["x"], y: data()["y"]}
    plain = sess.run(loss, feeds)
    timed = sess.run(loss, feeds, profile=True)
    assert timed == pytest.approx(plain, rel=1e-6)
    plan = sess.plan_for(loss, feeds)
    assert set(sess.last_profile) == {op.name for op in plan.step_ops}
    assert all(seconds >= 0 for seconds in sess.last_profile.values())
    assert "hidden/matmul" in sess.last_profile and "out/matmul" in sess.last_profile


def test_fit_profile_gives_per_op_seconds_that_add_up_to_the_step():
    g, x, y, loss, train = model(width=384)
    sess = wb.Session(g, seed=0)
    hist = sess.fit(train, data(width=384), batch_size=256, steps=6, profile=2, fetches=[loss])
    assert [r["step"] for r in hist.records if "profile" in r] == [2, 4, 6]
    profile = hist.profile()
    assert list(profile) == sorted(profile, key=profile.get, reverse=True)
    ratios = [sum(r["profile"].values()) / r["time"] for r in hist.records if "profile" in r]
    assert 0.8 <= float(np.median(ratios)) <= 1.2, ratios  # each profiled step: its ops' seconds add up to it
    assert any(name.startswith("gradients/") for name in profile)


def test_profile_must_be_a_positive_count_and_local():
    g, x, y, loss, train = model(width=8)
    sess = wb.Session(g, seed=0)
    with pytest.raises(wb.ArgumentError, match="profile must be a positive integer"):
        sess.fit(train, data(width=8), batch_size=32, steps=2, profile=0)
    with pytest.raises(wb.ArgumentError, match=r"profile=2\) times each op of a local fit"):
        wb.Session(g, seed=0, cluster=False).fit(train, data(width=8), batch_size=32, steps=2, profile=2, replicas=2)
