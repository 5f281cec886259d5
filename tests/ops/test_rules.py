"""Shape and dtype rules: bad graphs fail when they are built, and say where.

Each message names the op type, the op's name, the shapes or dtypes involved,
and the user's source line (here: the line of this file that built the op).
"""

from __future__ import annotations

import linecache
import re

import numpy as np
import pytest

import workbench as wb


def ph(*shape, dtype="float32"):
    """A placeholder with a fresh name in the default graph."""
    return wb.placeholder(wb.get_default_graph().unique_name("p"), shape=shape, dtype=dtype)


def labels(*shape):
    return wb.constant(np.zeros(shape, dtype=np.int64))


# (op type, how to build it: one line, what the message says, error class)
BAD_GRAPHS = [
    ("matmul", lambda: wb.matmul(ph(2, 3), ph(4, 5)), "inner dimensions differ: (2, 3) @ (4, 5) (3 != 4)", wb.ShapeError),
    ("matmul", lambda: wb.matmul(ph(2, 3), ph(4, 3), transpose_a=True, name="mm"), "(2 != 4, after transposes)", wb.ShapeError),
    ("matmul", lambda: wb.matmul(ph(3), ph(3, 2)), "needs inputs of rank 2 or more, got (3,) and (3, 2)", wb.ShapeError),
    ("matmul", lambda: wb.matmul(ph(2, 2, 3), ph(3, 3, 4)), "shapes (2,), (3,) do not broadcast", wb.ShapeError),
    ("add", lambda: ph(3, 4) + ph(5), "shapes (3, 4), (5,) do not broadcast", wb.ShapeError),
    ("multiply", lambda: wb.multiply(ph(2, 3, 1), ph(4, 5)), "shapes (2, 3, 1), (4, 5) do not broadcast", wb.ShapeError),
    ("where", lambda: wb.where(ph(3, dtype="bool"), ph(3), ph(4)), "shapes (3,), (3,), (4,) do not broadcast", wb.ShapeError),
    ("add", lambda: ph(3) + ph(3, dtype="float64"), "dtypes differ: float32, float64; cast one of them", wb.DTypeError),
    ("where", lambda: wb.where(ph(3), ph(3), ph(3)), "condition must be a bool tensor, got float32", wb.DTypeError),
    ("log", lambda: wb.log(ph(3, dtype="int64")), "input must be a float tensor, got int64", wb.DTypeError),
    ("sum", lambda: wb.sum(ph(3, dtype="bool")), "cannot sum a bool tensor", wb.DTypeError),
    ("softmax_cross_entropy", lambda: wb.softmax_cross_entropy(ph(4, 10), ph(4)),
     "labels must be an integer tensor of class indices, got float32", wb.DTypeError),
    ("softmax_cross_entropy", lambda: wb.softmax_cross_entropy(ph(4, 10), labels(5)),
     "labels (5,) must have the shape of logits (4, 10) without its last (class) axis", wb.ShapeError),
    ("reshape", lambda: wb.reshape(ph(2, 3), (4, 2)), "cannot reshape (2, 3) (6 elements) to (4, 2)", wb.ShapeError),
    ("reshape", lambda: wb.reshape(ph(2, 3), (4, -1)), "cannot reshape (2, 3) (6 elements) to (4, -1)", wb.ShapeError),
    ("reshape", lambda: wb.reshape(ph(2, 3), (-1, -1)), "target shape (-1, -1) may hold one -1", wb.ShapeError),
    ("sum", lambda: wb.sum(ph(2, 3), axis=2), "axis 2 is out of range for a tensor of rank 2", wb.ShapeError),
    ("mean", lambda: wb.mean(ph(2, 3), axis=(0, -2)), "axis (0, -2) repeats an axis", wb.ShapeError),
    ("max", lambda: wb.max(ph(2, 3), axis=-3), "axis -3 is out of range for a tensor of rank 2", wb.ShapeError),
    ("softmax", lambda: wb.softmax(ph(2, 3), axis=2), "axis 2 is out of range for a tensor of rank 2", wb.ShapeError),
    ("concat", lambda: wb.concat([ph(2, 3), ph(2, 3)], axis=2), "axis 2 is out of range for a tensor of rank 2", wb.ShapeError),
    ("concat", lambda: wb.concat([ph(2, 3), ph(2, 4)]), "shapes (2, 3), (2, 4) differ outside axis 0", wb.ShapeError),
    ("stack", lambda: wb.stack([ph(2, 3), ph(3, 2)]), "tensors differ in shape: (2, 3), (3, 2)", wb.ShapeError),
    ("transpose", lambda: wb.transpose(ph(2, 3), (0, 0)), "perm (0, 0) is not a permutation of the axes of (2, 3)",
     wb.ShapeError),
    ("expand_dims", lambda: wb.expand_dims(ph(2, 3), 3), "axis 3 is out of range for a tensor of rank 3", wb.ShapeError),
    ("getitem", lambda: ph(2, 3)[0, 3], "index 3 is out of range for axis 1 of size 3", wb.ShapeError),
    ("getitem", lambda: ph(2, 3)[0, 1, 2], "too many indices for a tensor of shape (2, 3)", wb.ShapeError),
    ("gather", lambda: wb.gather(ph(5, 3), ph(2)), "indices must be an integer tensor, got float32", wb.DTypeError),
    ("gather", lambda: wb.gather(ph(5, 3), labels(2), axis=2), "axis 2 is out of range for a tensor of rank 2",
     wb.ShapeError),
    ("one_hot", lambda: wb.one_hot(labels(3), 0), "depth must be positive, got 0", wb.ShapeError),
    ("conv2d", lambda: wb.conv2d(ph(1, 3, 8, 8), ph(4, 2, 3, 3)), "x has 3 channels but w (4, 2, 3, 3) expects 2",
     wb.ShapeError),
    ("conv2d", lambda: wb.conv2d(ph(1, 3, 8), ph(4, 3, 3, 3)),
     "needs x of shape (N, C, H, W) and w of shape (O, C, kh, kw), got (1, 3, 8) and (4, 3, 3, 3)", wb.ShapeError),
    ("conv2d", lambda: wb.conv2d(ph(1, 3, 8, 8), ph(4, 3, 3, 3), padding="full"),
     'padding must be "same" or "valid" (in any case), got \'full\'', wb.ShapeError),
    ("conv2d", lambda: wb.conv2d(ph(1, 3, 3, 3), ph(4, 3, 5, 5)), "kernel (5, 5) is larger than the input (3, 3)",
     wb.ShapeError),
    ("conv2d", lambda: wb.conv2d(ph(1, 3, 8, 8), ph(4, 3, 3, 3, dtype="float64")), "dtypes differ: float32, float64",
     wb.DTypeError),
    ("max_pool2d", lambda: wb.max_pool2d(ph(1, 3, 8, 8), 2, padding="FULL"), 'padding must be "same" or "valid" (in any case), got \'full\'',
     wb.ShapeError),
    ("max_pool2d", lambda: wb.max_pool2d(ph(1, 3, 3, 3), 4), "window (4, 4) is larger than the input (3, 3)", wb.ShapeError),
    ("dropout", lambda: wb.dropout(ph(2, 3), 1.0), "rate must be in [0, 1), got 1.0", wb.ShapeError),
]  # fmt: skip

BAD_GRAPHS += [
    ("rsqrt", lambda: wb.rsqrt(ph(3, dtype="int32")), "input must be a float tensor, got int32", wb.DTypeError),
    ("gelu", lambda: wb.gelu(ph(3), approximate="fast"), 'approximate must be "none" or "tanh", got \'fast\'', wb.ShapeError),
    ("clip", lambda: wb.clip(ph(3, 4), ph(5), 1.0), "shapes (3, 4), (5,), () do not broadcast", wb.ShapeError),
    ("layer_norm", lambda: wb.layer_norm(ph(2, 8), ph(4), ph(8)), "scale (4,) must have the shape (8,) of x (2, 8) on axis (-1,)",
     wb.ShapeError),
    ("moments", lambda: wb.moments(ph(2, 3), axes=[2]), "axis 2 is out of range for a tensor of rank 2", wb.ShapeError),
    ("avg_pool2d", lambda: wb.avg_pool2d(ph(1, 3, 3, 3), 4), "window (4, 4) is larger than the input (3, 3)", wb.ShapeError),
    ("avg_pool2d", lambda: wb.avg_pool2d(ph(1, 3, 8, 8), 2, padding="FULL"), 'padding must be "same" or "valid"',
     wb.ShapeError),
    ("pad", lambda: wb.pad(ph(2, 3), [(1, 1)]), "paddings give 1 axes for x (2, 3) of rank 2", wb.ShapeError),
    ("pad", lambda: wb.pad(ph(2, 3), [(1, 1), (3, 0)], mode="reflect"),
     "reflect padding (3, 0) of axis 1 needs at most 2 on each side (size 3)", wb.ShapeError),
    ("pad", lambda: wb.pad(ph(2, 3), [(1, 1), (0, 0)], mode="edge"), 'mode must be "constant" or "reflect", got \'edge\'',
     wb.ShapeError),
    ("pad", lambda: wb.pad(ph(2, 3), 3), "paddings must be a list of (before, after) pairs, one per axis, got 3", wb.ShapeError),
    ("cumsum", lambda: wb.cumsum(ph(2, 3), axis=2), "axis 2 is out of range for a tensor of rank 2", wb.ShapeError),
    ("top_k", lambda: wb.top_k(ph(2, 3), 4), "k = 4 is out of range for a last axis of size 3", wb.ShapeError),
    ("scatter_add", lambda: wb.scatter_add(ph(5, 3), labels(2), ph(2, 4)),
     "updates (2, 4) must have the shape (2, 3): indices (2,) followed by base (5, 3) without its first axis", wb.ShapeError),
    ("scatter_add", lambda: wb.scatter_add(ph(5, 3), ph(2), ph(2, 3)), "indices must be an integer tensor, got float32",
     wb.DTypeError),
    ("scaled_dot_product_attention", lambda: wb.scaled_dot_product_attention(ph(2, 4, 8), ph(2, 4, 8), ph(2, 4, 8)),
     "needs q, k and v of shape (batch, heads, length, depth), got (2, 4, 8)", wb.ShapeError),
    ("scaled_dot_product_attention", lambda: wb.scaled_dot_product_attention(ph(1, 2, 4, 8), ph(1, 2, 5, 6), ph(1, 2, 5, 6)),
     "q (1, 2, 4, 8) and k (1, 2, 5, 6) have different depths", wb.ShapeError),
    ("scaled_dot_product_attention",
     lambda: wb.scaled_dot_product_attention(ph(1, 2, 4, 8), ph(1, 2, 5, 8), ph(1, 2, 5, 8), mask=ph(4, 5)),
     "mask must be a bool tensor (True where attention is allowed), got float32", wb.DTypeError),
]  # fmt: skip


def where_built(build) -> str:
    """The ``File "...", line N: code`` part the message must end with: the line of ``build``."""
    lineno = build.__code__.co_firstlineno
    code = linecache.getline(__file__, lineno).strip()
    return f'File "{__file__}", line {lineno}: {code}'


@pytest.mark.parametrize(
    "op_type, build, says, error", BAD_GRAPHS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_GRAPHS)]
)
def test_bad_graph_fails_at_build_time_naming_op_shapes_and_line(graph, op_type, build, says, error):
    name = re.escape(f"{op_type} '")  # the op's type, then its name
    pattern = f"^{name}[^']+': .*{re.escape(says)}.*\n  {re.escape(where_built(build))}$"
    with pytest.raises(error, match=pattern):
        build()


def test_message_names_the_op_by_its_scoped_name(graph):
    a, b = ph(2, 3), ph(4, 5)
    with wb.name_scope("layer1"):
        with pytest.raises(wb.ShapeError, match=r"^matmul 'layer1/proj': inner dimensions differ"):
            wb.matmul(a, b, name="proj")


@pytest.mark.parametrize(
    "error, builtin", [(wb.ShapeError, ValueError), (wb.DTypeError, TypeError)], ids=["shape", "dtype"]
)
def test_rule_errors_are_workbench_errors_and_builtin_ones(graph, error, builtin):
    build = next(b for _, b, _, e in BAD_GRAPHS if e is error)
    with pytest.raises(error) as caught:
        build()
    assert isinstance(caught.value, wb.WorkbenchError)
    assert isinstance(caught.value, builtin)


def test_a_failed_op_is_not_added_to_the_graph(graph):
    a, b = ph(2, 3), ph(4, 5)
    before = len(graph.operations)
    with pytest.raises(wb.ShapeError):
        wb.matmul(a, b)
    assert len(graph.operations) == before
    assert "matmul" not in graph


def test_unknown_dimensions_pass_the_rules(graph):
    x = wb.placeholder("x", shape=(None, 3))
    y = wb.matmul(x, ph(3, 4)) + ph(4)
    assert y.shape == (None, 4)
    assert wb.reshape(x, (-1, 6)).shape == (None, 6)
    assert wb.conv2d(ph(None, 2, 5, 5), ph(3, 2, 3, 3), stride=2, padding="same").shape == (None, 3, 3, 3)
