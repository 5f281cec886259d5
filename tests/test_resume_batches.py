"""Stop, then fit again in the same session: the fit resumes from its checkpoint with the batches the
uninterrupted run draws, so all three (uninterrupted, resumed here, resumed in a fresh session) agree."""

import numpy as np

import workbench as wb


def model():
    g = wb.Graph(name="resumed")
    with g.as_default():
        x = wb.placeholder("x", (None, 3))
        y = wb.placeholder("y", (None,))
        w = wb.variable("w", (3,))
        loss = wb.mean((wb.sum(x * w, axis=1) - y) ** 2.0)
        train = wb.optimizers.SGD(0.05).minimize(loss)
    return g, train, loss


rng = np.random.default_rng(0)
DATA = {"x": rng.standard_normal((200, 3)).astype("float64")}
DATA["y"] = DATA["x"] @ np.array([1.0, -2.0, 0.5])


def stopped_at(sess, train, step, checkpoint_dir):
    def stop(record):
        if record["step"] == step:
            sess.request_stop()

    sess.fit(train, DATA, batch_size=16, steps=30, checkpoint_dir=checkpoint_dir, checkpoint_every=5, callback=stop)


def test_stop_then_fit_again_resumes_with_the_uninterrupted_run_s_batches(tmp_path):
    g, train, loss = model()
    whole = wb.Session(g, seed=0)
    whole.fit(train, DATA, batch_size=16, steps=30)
    again = wb.Session(g, seed=0)
    stopped_at(again, train, 10, tmp_path / "here")
    history = again.fit(train, DATA, batch_size=16, steps=30, checkpoint_dir=tmp_path / "here")
    assert history.records[0]["step"] == 11
    fresh_dir = tmp_path / "fresh"
    stopped_at(wb.Session(g, seed=0), train, 10, fresh_dir)
    fresh = wb.Session(g, seed=0)
    fresh.fit(train, DATA, batch_size=16, steps=30, checkpoint_dir=fresh_dir)
    assert np.array_equal(again.variables["w"], whole.variables["w"])
    assert np.array_equal(fresh.variables["w"], whole.variables["w"])
