"""The graph IR: names, scopes, operators, source lines and the default graph."""

import os

import numpy as np
import pytest

import workbench as wb
from workbench.graph import passes


def run(t, feed=None):
    return wb.Session(t.graph).run(t, feed)


# -- names -------------------------------------------------------------------------------


def test_names_are_unique(graph):
    x = wb.placeholder("x", shape=(2,))
    a, b, c = x + 1.0, x + 2.0, x + 3.0
    assert [a.name, b.name, c.name] == ["add", "add_1", "add_2"]
    named = wb.relu(x, name="act")
    again = wb.relu(x, name="act")
    assert (named.name, again.name) == ("act", "act_1")
    names = [op.name for op in graph.operations]
    assert len(names) == len(set(names))


def test_name_scopes_nest(graph):
    with wb.name_scope("layer1"):
        w = wb.variable("w", shape=(2,), init=0.0)
        with wb.name_scope("inner"):
            y = wb.tanh(w)
    z = wb.tanh(w)
    assert w.name == "layer1/w"
    assert y.name == "layer1/inner/tanh"
    assert z.name == "tanh"
    assert graph.get("layer1/inner/tanh") is y


def test_duplicate_placeholder_or_variable_name_is_an_error(graph):
    wb.placeholder("x", shape=(2,))
    wb.variable("w", shape=(2,), init=0.0)
    with pytest.raises(wb.GraphError, match="already has an operation named 'x'"):
        wb.placeholder("x", shape=(3,))
    with pytest.raises(wb.GraphError, match="already has an operation named 'w'"):
        wb.variable("w", shape=(2,), init=1.0)
    with pytest.raises(wb.GraphError, match="already has an operation named 'x'"):
        wb.variable("x", shape=(2,), init=1.0)
    with wb.name_scope("s"):  # a different scope is a different name
        assert wb.placeholder("x", shape=(2,)).name == "s/x"


@pytest.mark.parametrize("bad", ["", "a:b", "/a", "a/"])
def test_invalid_names(graph, bad):
    with pytest.raises(wb.GraphError, match="invalid name"):
        wb.placeholder(bad, shape=(1,))


def test_lookup_by_name(graph):
    x = wb.placeholder("x", shape=(2,))
    y = x * 3.0
    grp = wb.group(y)
    assert graph.get("x") is x and graph.get("x:0") is x
    assert graph.get(grp.name) is grp
    assert "x" in graph and "nope" not in graph
    with pytest.raises(wb.GraphError, match="no tensor or operation named 'nope'"):
        graph.get("nope")
    with pytest.raises(wb.GraphError, match="has no output '3'"):
        graph.get("x:3")


# -- operators ---------------------------------------------------------------------------

A = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.5]])
B = np.array([[2.0, 1.0, -1.0], [3.0, 0.25, 2.0]])


@pytest.mark.parametrize(
    "build, expected",
    [
        (lambda a, b: a + b, A + B),
        (lambda a, b: a - b, A - B),
        (lambda a, b: a * b, A * B),
        (lambda a, b: a / b, A / B),
        (lambda a, b: a @ b.T, A @ B.T),
        (lambda a, b: abs(a) ** b, np.abs(A) ** B),
        (lambda a, b: -a, -A),
        (lambda a, b: abs(a), np.abs(A)),
        (lambda a, b: a < b, A < B),
        (lambda a, b: a <= b, A <= B),
        (lambda a, b: a > b, A > B),
        (lambda a, b: a >= b, A >= B),
        (lambda a, b: 1.0 + a, 1.0 + A),
        (lambda a, b: 1.0 - a, 1.0 - A),
        (lambda a, b: 2.0 * a, 2.0 * A),
        (lambda a, b: 1.0 / b, 1.0 / B),
        (lambda a, b: 2.0**a, 2.0**A),
        (lambda a, b: a**2, A**2),
        (lambda a, b: 0.0 < a, 0.0 < A),
        (lambda a, b: a[1], A[1]),
        (lambda a, b: a[:, 1:], A[:, 1:]),
        (lambda a, b: a[::-1, ::2], A[::-1, ::2]),
        (lambda a, b: a[..., 0], A[..., 0]),
        (lambda a, b: a[None, 1, -1], A[None, 1, -1]),
        (lambda a, b: B + a, B + A),  # ndarray + tensor
        (lambda a, b: B * a, B * A),
        (lambda a, b: B @ a.T, B @ A.T),
    ],
)
def test_python_operators(graph, build, expected):
    a = wb.placeholder("a", shape=(2, 3), dtype="float64")
    b = wb.placeholder("b", shape=(2, 3), dtype="float64")
    out = build(a, b)
    assert isinstance(out, wb.Tensor)
    assert out.shape == np.shape(expected)
    value = wb.Session(graph).run(out, {a: A, b: B})
    np.testing.assert_allclose(value, expected, rtol=1e-12)


def test_indexing_with_a_tensor_gathers(graph):
    a = wb.placeholder("a", shape=(None, 3), dtype="float64")
    i = wb.placeholder("i", shape=(None,), dtype="int64")
    out = a[i]
    assert out.op.type == "gather"
    value = wb.Session(graph).run(out, {a: A, i: [1, 1, 0]})
    np.testing.assert_array_equal(value, A[[1, 1, 0]])


def test_python_numbers_take_the_tensor_dtype(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    n = wb.placeholder("n", shape=(2,), dtype="int32")
    assert (x + 1).dtype == "float64"
    assert (x * 0.5).dtype == "float64"
    assert (n + 1).dtype == "int32"


def test_equality_is_identity_so_tensors_are_dict_keys(graph):
    x = wb.placeholder("x", shape=(2,))
    y = wb.placeholder("y", shape=(2,))
    assert (x == x) is True and (x == y) is False and (x != y) is True
    d = {x: 1, y: 2}
    assert d[x] == 1 and d[y] == 2
    assert wb.equal(x, y).op.type == "equal"  # elementwise equality is an op


def test_tensor_truth_value_and_iteration_are_errors(graph):
    x = wb.placeholder("x", shape=(2,))
    with pytest.raises(wb.GraphError, match="truth value of tensor 'x'"):
        bool(x)
    with pytest.raises(wb.GraphError, match="cannot be iterated"):
        list(x)


def test_shape_errors_name_the_op_shapes_and_line(graph):
    a = wb.placeholder("a", shape=(2, 3))
    b = wb.placeholder("b", shape=(4, 5))
    with pytest.raises(wb.ShapeError) as info:
        wb.matmul(a, b)  # the line the error points to
    message = str(info.value)
    assert "matmul" in message and "(2, 3)" in message and "(4, 5)" in message
    assert f"{__file__}" in message and "wb.matmul(a, b)  # the line the error points to" in message
    assert len(graph.operations) == 2  # nothing was added


# -- source lines --------------------------------------------------------------------------


def test_source_line_is_recorded(graph):
    x = wb.placeholder("x", shape=(2,))
    y = wb.exp(x) + 1.0  # recorded line
    for op in (x.op, y.op, y.op.inputs[0].op, y.op.inputs[1].op):
        assert op.source is not None
        assert os.path.samefile(op.source.filename, __file__)
    assert y.op.source.code == "y = wb.exp(x) + 1.0  # recorded line"
    assert y.op.source.lineno == x.op.source.lineno + 1
    assert str(y.op.source).endswith(f"line {y.op.source.lineno}: y = wb.exp(x) + 1.0  # recorded line")


# -- graphs --------------------------------------------------------------------------------


def test_default_graph_and_nesting():
    outer, inner = wb.Graph(name="outer"), wb.Graph(name="inner")
    before = wb.get_default_graph()
    with outer.as_default() as g:
        assert g is outer and wb.get_default_graph() is outer
        a = wb.placeholder("a", shape=(1,))
        with inner.as_default():
            assert wb.get_default_graph() is inner
            b = wb.placeholder("b", shape=(1,))
        assert wb.get_default_graph() is outer
        c = wb.placeholder("c", shape=(1,))
    assert wb.get_default_graph() is before
    assert [op.name for op in outer.operations] == ["a", "c"]
    assert [op.name for op in inner.operations] == ["b"]
    assert a.graph is outer and b.graph is inner and c.graph is outer


def test_default_graph_outside_any_block_and_reset():
    g = wb.reset_default_graph()
    assert wb.get_default_graph() is g and len(g) == 0
    x = wb.placeholder("x", shape=(1,))
    assert x.graph is g
    fresh = wb.reset_default_graph()
    assert fresh is not g and len(fresh) == 0
    with fresh.as_default():
        with pytest.raises(wb.GraphError, match="cannot reset"):
            wb.reset_default_graph()


def test_as_default_pops_on_error():
    g = wb.Graph()
    before = wb.get_default_graph()
    with pytest.raises(ZeroDivisionError):
        with g.as_default():
            _ = 1 / 0
    assert wb.get_default_graph() is before


def test_mixing_graphs_is_an_error():
    g1, g2 = wb.Graph(name="one"), wb.Graph(name="two")
    with g1.as_default():
        a = wb.placeholder("a", shape=(2,))
    with g2.as_default():
        b = wb.placeholder("b", shape=(2,))
        total = wb.sum(b)
        with pytest.raises(wb.GraphError, match="different graphs"):
            a + b
    with pytest.raises(wb.GraphError, match="different graphs"):
        wb.matmul(a, b)
    with pytest.raises(wb.GraphError, match="belongs to graph 'one'"):
        wb.gradients(total, [a])
    with pytest.raises(wb.GraphError, match="belongs to graph 'one'"):
        wb.Session(g2).run(a)
    assert len(g1) == 1 and len(g2) == 2  # nothing added by the failed calls


def test_variables_and_trainable(graph):
    w = wb.variable("w", shape=(2, 2), init="zeros")
    s = wb.variable("s", shape=(), init=0.0, trainable=False)
    wb.placeholder("x", shape=(2,))
    assert graph.variables == [w, s]
    assert graph.trainable_variables == [w]
    assert isinstance(w, wb.Variable) and w.trainable and not s.trainable
    assert [t.name for t in graph.placeholders] == ["x"]


def test_control_dependencies_and_group(graph):
    v = wb.variable("v", shape=(), init=0.0, dtype="float64")
    inc = wb.assign_add(v, 1.0)
    with graph.control_dependencies([inc]):
        after = v * 1.0
    assert after.op.control_inputs == (inc.op,)
    both = wb.group(inc, after)
    assert both.outputs == () and set(both.control_inputs) == {inc.op, after.op}
    sess = wb.Session(graph)
    sess.run(after)
    sess.run(both)
    assert sess.variables["v"] == 2.0


def test_names_never_collide_with_aliases(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    a, b = x * 2.0, x * 2.0
    merged = passes.eliminate_common_subexpressions(graph)
    assert b.name in merged.aliases
    with merged.as_default():
        fresh = wb.placeholder("y", shape=(2,), dtype="float64") * 3.0
    assert fresh.name != b.name
    assert merged.get(fresh.name) is fresh
    assert merged.get(b.name) is merged.get(a.name)


def test_aliases_chain_through_repeated_passes(graph):
    x = wb.placeholder("x", shape=(2,), dtype="float64")
    a, b = x + 1.0, x + 1.0
    once = passes.eliminate_common_subexpressions(graph)
    with once.as_default():
        c, d = once.get(a.name) * 2.0, once.get(b.name) * 2.0
    twice = passes.eliminate_common_subexpressions(once)
    passes.validate(twice)
    assert twice.get(d.name) is twice.get(c.name)
    assert twice.get(b.name) is twice.get(a.name)
    assert all(twice.resolve(target) == target and target in twice for target in twice.aliases.values())
    pruned = passes.prune(twice, [d.name])
    passes.validate(pruned)
    assert pruned.get(b.name) is pruned.get(a.name)


def test_shapes_beyond_the_element_limit_are_refused_when_built():
    """Fixes: a variable of shape (10**12,) was built and then failed with a bare MemoryError."""
    g = wb.Graph()
    with g.as_default():
        with pytest.raises(
            wb.ShapeError,
            match=r"variable 'huge': shape \(1000000000000,\) has 1,000,000,000,000 elements, more than the limit of 2,147,483,648",
        ):
            wb.variable("huge", shape=(10**12,), init="zeros")
        with pytest.raises(wb.ShapeError, match="more than the limit"):
            wb.placeholder("big", shape=(None, 10**6, 10**6))  # too large for even one row
        wb.placeholder("p", shape=(None, 10**4, 10**4))
        x = wb.placeholder("x", shape=(2**16,))
        with pytest.raises(wb.ShapeError, match=r"matmul 'outer'.*has 4,294,967,296 elements"):
            wb.matmul(wb.reshape(x, (-1, 1)), wb.reshape(x, (1, -1)), name="outer")
