"""How losses and fetches reduce over the batch's rows: the rule a data-parallel fit splits them by."""

import numpy as np
import pytest

import workbench as wb
from workbench.errors import ClusterError
from workbench.graph.batch_reduction import Reduction, combine, fetch_reduction, loss_reduction


@pytest.fixture
def model():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", (None, 4))
        y = wb.placeholder("y", (None,), "int64")
        w = wb.variable("w", (4, 3))
        logits = wb.matmul(x, w)
        xent = wb.softmax_cross_entropy(logits, y)
    return g, x, y, w, logits, xent


def test_means_and_sums_of_per_row_values(model):
    g, x, y, w, logits, xent = model
    with g.as_default():
        assert loss_reduction(g, wb.mean(xent)) == "mean"
        assert loss_reduction(g, wb.sum(xent)) == "sum"
        assert loss_reduction(g, wb.sum(xent) * 0.5) == "sum"
        assert loss_reduction(g, wb.sum(xent) / 32.0) == "sum"
        assert loss_reduction(g, wb.mean(logits * logits)) == "mean"
        assert loss_reduction(g, wb.sum(wb.mean(logits, axis=0))) == "mean"
        assert loss_reduction(g, wb.mean(xent) + 1e-3 * wb.sum(w * w)) == "mean"  # a mean takes a constant term
        assert loss_reduction(g, wb.mean(xent) + wb.mean(wb.sum(logits, axis=1))) == "mean"
        assert loss_reduction(g, -wb.sum(xent)) == "sum"
        assert loss_reduction(g, wb.sum(w * w)) == "mean"  # no rows at all: the shares add up to 1
        flat = wb.reshape(logits, (-1,))
        assert loss_reduction(g, wb.sum(flat)) == "sum"
        assert loss_reduction(g, wb.mean(wb.transpose(logits))) == "mean"


def test_rows_times_a_matrix_keep_their_rows_at_any_rank():
    g = wb.Graph()
    with g.as_default():
        x = wb.placeholder("x", (None, 8, 4))  # (batch, tokens, features)
        w = wb.variable("w", (4, 3))
        stacked = wb.variable("stacked", (2, 1, 4, 3))
        tokens = wb.matmul(x, w)  # (batch, tokens, 3): each row's tokens times the same matrix
        assert loss_reduction(g, wb.mean(tokens)) == "mean"
        assert loss_reduction(g, wb.sum(wb.mean(tokens, axis=(1, 2)))) == "sum"
        assert fetch_reduction(g, tokens) == Reduction("rows", 0)
        assert fetch_reduction(g, wb.matmul(x, stacked)) == Reduction("rows", 1)  # (2, batch, 8, 3)
        pooled = wb.matmul(wb.transpose(w), wb.transpose(x, (0, 2, 1)))  # (3, 4) @ (batch, 4, 8)
        assert fetch_reduction(g, pooled) == Reduction("rows", 0)
        q = wb.reshape(tokens, (-1, 1, 8, 3))  # (batch, heads, length, depth)
        assert fetch_reduction(g, wb.scaled_dot_product_attention(q, q, q, causal=True)) == Reduction("rows", 0)
        assert fetch_reduction(g, wb.layer_norm(tokens)) == Reduction("rows", 0)
        assert fetch_reduction(g, wb.cumsum(tokens, axis=1)) == Reduction("rows", 0)
        with pytest.raises(ClusterError, match="normalizes across the rows"):
            loss_reduction(g, wb.sum(wb.layer_norm(tokens, wb.variable("s", (1,)), wb.variable("o", (1,)), axis=0)))
        mixed = wb.matmul(wb.transpose(x, (1, 2, 0)), wb.transpose(x, (1, 0, 2)))  # a row axis contracted
        with pytest.raises(ClusterError, match="multiplies matrices across the rows"):
            loss_reduction(g, wb.sum(mixed))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda xent, w, logits: wb.sum(xent) + wb.sum(w * w), "adds a term that does not depend on the rows"),
        (lambda xent, w, logits: wb.sum(xent) + wb.mean(xent), r"combines values reduced differently.*mean and sum"),
        (lambda xent, w, logits: wb.max(xent), "it is a max over the rows"),
        (lambda xent, w, logits: wb.log(wb.mean(xent)), "applies 'log' to a mean over the rows"),
        (lambda xent, w, logits: wb.mean(xent) * wb.mean(xent), "applies 'multiply' to a mean"),
        (lambda xent, w, logits: wb.mean(xent - wb.mean(xent)), "combines per-row values with values reduced"),
        (lambda xent, w, logits: xent[0], "picks some of the rows"),
        (lambda xent, w, logits: wb.sum(wb.softmax(logits, axis=0)), "takes 'softmax' across the rows"),
    ],
)
def test_losses_that_cannot_be_split_name_the_op_and_line(model, build, match):
    g, x, y, w, logits, xent = model
    with g.as_default():
        loss = build(xent, w, logits)
    with pytest.raises(ClusterError, match=match) as caught:
        loss_reduction(g, loss)
    message = str(caught.value)
    assert "cannot be split across replicas exactly" in message
    assert loss.name in message and "test_batch_reduction.py" in message  # the user's line


def test_fetches_say_how_they_combine(model):
    g, x, y, w, logits, xent = model
    with g.as_default():
        right = wb.cast(wb.equal(wb.argmax(logits), y), "float32")
        cases = {
            "mean": wb.mean(xent),
            "sum": wb.sum(right),
            "max": wb.max(xent),
            "min": -wb.max(-xent),
            "same": wb.sum(w * w),
        }
    for kind, tensor in cases.items():
        assert fetch_reduction(g, tensor) == Reduction(kind), kind
    assert fetch_reduction(g, logits) == Reduction("rows", 0)
    assert fetch_reduction(g, wb.transpose(logits)) == Reduction("rows", 1)
    assert fetch_reduction(g, "x") == Reduction("rows", 0)
    with g.as_default():
        bad = wb.log(wb.sum(xent))
    with pytest.raises(ClusterError, match=r"fetch 'log.*cannot be combined across replicas: it applies 'log'"):
        fetch_reduction(g, bad)


def test_combine_gives_the_global_batch_value():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((10, 3))
    parts, shares = [rows[:6], rows[6:]], [0.6, 0.4]
    assert np.allclose(combine(Reduction("mean"), [p.mean() for p in parts], shares), rows.mean())
    assert np.allclose(combine(Reduction("sum"), [p.sum(0) for p in parts], shares), rows.sum(0))
    assert combine(Reduction("max"), [p.max() for p in parts], shares) == rows.max()
    assert combine(Reduction("min"), [p.min() for p in parts], shares) == rows.min()
    assert np.array_equal(combine(Reduction("rows", 0), parts, shares), rows)
    assert np.array_equal(combine(Reduction("rows", 1), [p.T for p in parts], shares), rows.T)
    assert combine(Reduction("same"), [2.0, 2.0], shares) == 2.0
    assert combine(Reduction("mean"), [np.float32(1.0), np.float32(3.0)], [0.5, 0.5]).dtype == np.float32
