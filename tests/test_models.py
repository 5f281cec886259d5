"""The model builders of workbench.models train on the bundled digits to the accuracy people expect."""

import numpy as np
import pytest

import workbench as wb
from workbench import datasets, models


@pytest.fixture(scope="module")
def digits():
    return datasets.digits()


def test_digits_split():
    d = datasets.digits()
    assert (len(d.x_train), len(d.x_test)) == (1347, 450)
    assert d.x_train.dtype == np.float32 and d.y_train.dtype == np.int64 and d.x_train.max() <= 1.0


def test_builders_fold_into_their_blocks():
    t = models.transformer()
    scopes = {v.name.split("/")[0] for v in t["graph"].variables if not v.name.startswith("Adam")}
    assert scopes == {"embed", "block0", "block1", "final_norm", "head"}
    assert "block0/multi_head_attention/qkv/kernel" in t["graph"]
    r = models.resnet()
    assert "block1/shortcut/kernel" in r["graph"] and "block0/batch_norm/moving_mean" in r["graph"]
    assert r["training"].op.attrs["default"].item() is False
    assert len(r["graph"].updates) == 2 * 6  # every batch norm's two moving statistics


def train(model, digits, steps, **fit):
    sess = wb.Session(model["graph"], seed=0)
    feed = {"training": True} if "training" in model else None
    history = sess.fit(model["train"], {"x": digits.x_train, "y": digits.y_train}, batch_size=64, steps=steps,
                       fetches={"loss": model["loss"]}, feed_dict=feed, **fit)  # fmt: skip
    return sess, history, float(sess.run(model["accuracy"], {"x": digits.x_test, "y": digits.y_test}))


@pytest.mark.slow
def test_the_transformer_reaches_90_percent_within_600_steps(digits):
    _, _, accuracy = train(models.transformer(), digits, 600)
    assert accuracy >= 0.90


@pytest.mark.slow
def test_the_resnet_reaches_95_percent_within_600_steps(digits):
    model = models.resnet()  # 200 steps are enough (97% from step 100 with seed 0)
    sess, history, accuracy = train(model, digits, 200, validation=({"x": digits.x_test, "y": digits.y_test}, 100))
    assert accuracy >= 0.95
    # the moving statistics were trained with the weights: evaluation (inference mode) is as good
    assert history["val_loss"][-1] == pytest.approx(float(sess.run(model["loss"], {"x": digits.x_test,
                                                                                 "y": digits.y_test})), rel=1e-6)  # fmt: skip
    moving = sess.variables["stem/batch_norm/moving_variance"]
    assert not np.allclose(moving, 1.0)


@pytest.mark.slow
def test_the_rnn_learns_through_scan(digits):
    _, history, accuracy = train(models.rnn(), digits, 300)
    assert accuracy >= 0.90
    assert history["loss"][-10:].mean() < history["loss"][:10].mean() / 5
