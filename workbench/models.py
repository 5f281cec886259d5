"""Models people recognise, built with :mod:`workbench.layers` for the 8x8 digits: what the
notebook ``notebooks/models.ipynb``, the tests and the benchmarks share.

Each builder returns a dict: ``graph``, ``x`` (rows of 64 pixels), ``y`` (labels),
``logits``, ``loss``, ``accuracy``, ``train`` (the optimizer's update) and, for models
that behave differently in training, ``training`` (a bool placeholder that defaults to
False: feed it with ``fit(..., feed_dict={"training": True})``). ``graph=`` builds into a
graph of yours (in a ``%%flow`` cell: ``models.resnet(graph=get_default_graph())``),
else into a new one named ``name``.

>>> import workbench as wb
>>> m = wb.models.transformer()
>>> m["logits"].shape, len(m["graph"].trainable_variables)
((None, 10), 29)
"""

from __future__ import annotations

from workbench import layers, ops, optimizers
from workbench.graph.core import Graph
from workbench.graph.scan import scan
from workbench.metrics import accuracy
from workbench.ops import pool, special

CLASSES = 10
ROWS = COLUMNS = 8


def _inputs(dtype="float32"):
    x = ops.placeholder("x", shape=(None, ROWS * COLUMNS), dtype=dtype)
    y = ops.placeholder("y", shape=(None,), dtype="int64")
    return x, y


def _finish(graph: Graph, x, y, logits, optimizer, training=None) -> dict:
    loss = ops.mean(ops.softmax_cross_entropy(logits, y))
    train = optimizer.minimize(loss)
    model = {"graph": graph, "x": x, "y": y, "logits": logits, "loss": loss, "train": train}
    model["accuracy"] = accuracy(logits, y)
    if training is not None:
        model["training"] = training
    return model


def transformer(
    d: int = 32, heads: int = 4, blocks: int = 2, learning_rate: float = 3e-3, name="transformer", graph=None
) -> dict:
    """A pre-LN transformer classifier reading the 8 rows of a digit as 8 tokens of 8 pixels.

    Tokens are projected to ``d`` and given a learned position embedding; each block is
    ``x + attention(layer_norm(x))`` then ``x + mlp(layer_norm(x))`` (``4d`` hidden units,
    GELU); a final layer norm, the mean over tokens and a dense layer give the logits. Adam.
    """
    g = Graph(name=name) if graph is None else graph
    with g.as_default():
        x, y = _inputs()
        tokens = ops.reshape(x, (-1, ROWS, COLUMNS))
        with g.name_scope("embed"):
            h = layers.dense(tokens, d, name="tokens")
            h = h + ops.variable("positions", shape=(ROWS, d), init="normal")
        for i in range(blocks):
            with g.name_scope(f"block{i}"):
                h = h + layers.multi_head_attention(layers.layer_norm(h), heads, qkv_bias=False)
                hidden = layers.dense(layers.layer_norm(h), 4 * d, activation=special.gelu, name="mlp_in")
                h = h + layers.dense(hidden, d, name="mlp_out")
        h = layers.layer_norm(h, name="final_norm")
        logits = layers.dense(ops.mean(h, axis=1), CLASSES, name="head")
        return _finish(g, x, y, logits, optimizers.Adam(learning_rate))


def _basic_block(h, filters: int, stride: int, training, name: str):
    """conv-bn-relu-conv-bn plus the shortcut (a 1x1 convolution where the shape changes), then relu."""
    with h.graph.name_scope(name):
        out = layers.conv2d(h, filters, 3, stride=stride, use_bias=False)
        out = ops.relu(layers.batch_norm(out, training))
        out = layers.batch_norm(layers.conv2d(out, filters, 3, use_bias=False), training)
        if stride != 1 or h.shape[1] != filters:
            h = layers.batch_norm(
                layers.conv2d(h, filters, 1, stride=stride, use_bias=False, name="shortcut"), training
            )
        return ops.relu(out + h)


def resnet(widths=(16, 32), learning_rate: float = 3e-3, name="resnet", graph=None, dtype="float32") -> dict:
    """A small ResNet: a 3x3 stem, one basic block per width (the later ones with stride 2), batch
    norm throughout, global average pooling and a dense layer. Adam; ``training`` switches batch norm.
    ``dtype``: of the images and every variable (``"float64"`` for comparisons without rounding noise)."""
    g = Graph(name=name) if graph is None else graph
    with g.as_default():
        x, y = _inputs(dtype)
        training = ops.placeholder("training", shape=(), dtype="bool", default=False)
        images = ops.reshape(x, (-1, 1, ROWS, COLUMNS))
        with g.name_scope("stem"):
            h = ops.relu(layers.batch_norm(layers.conv2d(images, widths[0], 3, use_bias=False), training))
        for i, width in enumerate(widths):
            h = _basic_block(h, width, 1 if i == 0 else 2, training, f"block{i}")
        pooled = pool.avg_pool2d(h, h.shape[2:])  # global average pooling: (N, C, 1, 1)
        logits = layers.dense(ops.reshape(pooled, (-1, widths[-1])), CLASSES, name="head")
        return _finish(g, x, y, logits, optimizers.Adam(learning_rate), training)


def rnn(hidden: int = 64, learning_rate: float = 5e-3, name="rnn", graph=None) -> dict:
    """An Elman RNN over the 8 rows of a digit with :func:`workbench.scan`:
    ``h = tanh(row @ w_x + h @ w_h + b)``, the last state through a dense layer. Adam."""
    g = Graph(name=name) if graph is None else graph
    with g.as_default():
        x, y = _inputs()
        rows = ops.transpose(ops.reshape(x, (-1, ROWS, COLUMNS)), (1, 0, 2))  # (rows, batch, 8): time first
        with g.name_scope("cell"):
            w_x = ops.variable("w_x", shape=(COLUMNS, hidden), init="glorot_uniform")
            w_h = ops.variable("w_h", shape=(hidden, hidden), init="glorot_uniform")
            b = ops.variable("b", shape=(hidden,), init="zeros")
            start = ops.zeros_like(ops.matmul(rows[0], w_x))  # (batch, hidden)

            def step(h, row):
                h = ops.tanh(ops.matmul(row, w_x) + ops.matmul(h, w_h) + b)
                return h, None

            last, _ = scan(step, rows, start)
        logits = layers.dense(last, CLASSES, name="head")
        return _finish(g, x, y, logits, optimizers.Adam(learning_rate))


BUILDERS = {"transformer": transformer, "resnet": resnet, "rnn": rnn}
