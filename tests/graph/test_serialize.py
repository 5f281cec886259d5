"""Graph files: versioned JSON that round-trips and never runs code when loaded."""

import base64
import copy
import json
import os

import numpy as np
import pytest

import workbench as wb
from workbench.graph import passes


@pytest.fixture
def model():
    g = wb.Graph(name="files")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 1, 6, 6))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        k = wb.variable("conv/k", shape=(2, 1, 3, 3), init="he_normal")
        w = wb.variable("dense/w", init=np.arange(8 * 3, dtype=np.float32).reshape(8, 3) / 10)
        s = wb.variable("scale", shape=(), init=0.5, trainable=False)
        h = wb.max_pool2d(wb.relu(wb.conv2d(x, k, padding="valid")), 2)
        flat = wb.reshape(h, (-1, 8))
        logits = wb.matmul(flat, w) * s + wb.constant(np.array([0.1, -0.2, 0.3], np.float32))
        part = logits[:, 1:]  # a slice, stored as attrs
        loss = wb.mean(wb.softmax_cross_entropy(logits, y)) + 0.0 * wb.sum(part)
        train = wb.optimizers.Momentum(0.1, nesterov=True).minimize(loss)
    return g, loss, train


def structure(g):
    return [
        (op.name, op.type, [t.name for t in op.inputs], [c.name for c in op.control_inputs],
         [(t.shape, t.dtype) for t in op.outputs], _plain(op.attrs), op.source)
        for op in g.operations
    ]  # fmt: skip


def _plain(attrs):
    def norm(v):
        if isinstance(v, np.ndarray):
            return ("array", v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, (list, tuple)):
            return tuple(norm(x) for x in v)
        return v

    return {k: norm(v) for k, v in attrs.items()}


def test_round_trip(model):
    g, loss, train = model
    text = g.to_json()
    g2 = wb.Graph.from_json(text)
    assert g2.name == g.name
    assert structure(g2) == structure(g)
    passes.validate(g2)
    assert g2.to_json() == text
    assert wb.Graph.from_json(text.encode()).to_json() == text  # bytes too
    assert [v.trainable for v in g2.variables] == [v.trainable for v in g.variables]
    # source lines survive
    src = g2.get(loss.name).op.source
    assert src is not None and os.path.samefile(src.filename, __file__) and "wb.mean" in src.code
    # same initial values and results
    rng = np.random.default_rng(0)
    feed = {"x": rng.normal(size=(4, 1, 6, 6)).astype(np.float32), "y": np.array([0, 1, 2, 1])}
    s1, s2 = wb.Session(g, seed=3), wb.Session(g2, seed=3)
    for name, value in s1.variables.items():
        np.testing.assert_array_equal(s2.variables[name], value)
    for _ in range(2):
        s1.run(train, feed)
        s2.run(train.name, feed)
    assert s1.run(loss, feed) == s2.run(loss.name, feed)


def test_round_trip_keeps_aliases(graph):
    x = wb.placeholder("x", shape=(3,), dtype="float64")
    a, b = x * 2.0, x * 2.0
    merged = passes.eliminate_common_subexpressions(graph)
    again = wb.Graph.from_json(merged.to_json())
    assert again.aliases == merged.aliases and b.name in again.aliases
    assert again.get(b.name) is again.get(a.name)
    np.testing.assert_array_equal(wb.Session(again).run(b.name, {"x": [1.0, 2.0, 3.0]}), [2.0, 4.0, 6.0])


def test_float64_and_int_arrays_round_trip(graph):
    wb.variable("v64", init=np.array([[1.5, -2.25]]), dtype="float64")
    wb.constant(np.array([1, 2, 3], np.int32))
    wb.constant(np.array([True, False]))
    wb.constant(np.float16(1.5))
    g2 = wb.Graph.from_json(graph.to_json())
    assert structure(g2) == structure(graph)


# -- bad files ---------------------------------------------------------------------------


@pytest.fixture
def doc(model):
    return json.loads(model[0].to_json())


def load(doc_or_text):
    text = doc_or_text if isinstance(doc_or_text, (str, bytes)) else json.dumps(doc_or_text)
    return wb.Graph.from_json(text)


def op_record(doc, name):
    return next(r for r in doc["operations"] if r["name"] == name)


def test_format_error_is_a_workbench_error():
    assert issubclass(wb.FormatError, wb.WorkbenchError) and issubclass(wb.FormatError, ValueError)


@pytest.mark.parametrize("text", ["", "nope", "{", "[1, 2", b"\xff\xfe", "null", "[]", "42", '"text"'])
def test_not_json_or_not_a_graph(text):
    with pytest.raises(wb.FormatError, match="not a graph file"):
        load(text)


def test_truncated_json(model):
    text = model[0].to_json()
    for cut in sorted({1, 10, len(text) // 7, len(text) // 3, len(text) // 2, len(text) - 50, len(text) - 1}):
        with pytest.raises(wb.FormatError, match="invalid JSON"):
            load(text[:cut])


def test_wrong_marker_and_versions(doc):
    for marker in ("tensorflow-graph", None, 1):
        with pytest.raises(wb.FormatError, match='"format": "workbench-graph"'):
            load({**doc, "format": marker})
    for version in (2, 99, 0, "1", 1.0, True, None):
        with pytest.raises(wb.FormatError, match="unsupported graph file version"):
            load({**doc, "version": version})


def test_bad_top_level_fields(doc):
    with pytest.raises(wb.FormatError, match='needs a string "name" and a list of "operations"'):
        load({**doc, "operations": {"a": 1}})
    with pytest.raises(wb.FormatError, match='needs a string "name"'):
        load({**doc, "name": 3})
    with pytest.raises(wb.FormatError, match="is not a JSON object"):
        load({**doc, "operations": [1]})


def test_unknown_op_type(doc):
    op_record(doc, "scale")["type"] = "tf.raw_ops.ReadFile"
    with pytest.raises(
        wb.FormatError, match=r"operation \d+ of the graph file: 'scale' has unknown op type 'tf.raw_ops.ReadFile'"
    ):
        load(doc)


def test_undefined_input(doc):
    op_record(doc, "relu")["inputs"] = ["nowhere"]
    with pytest.raises(wb.FormatError, match="'relu' uses 'nowhere', which is not defined before it"):
        load(doc)


def test_input_defined_later(doc):
    ops = doc["operations"]
    i = next(i for i, r in enumerate(ops) if r["name"] == "conv2d")
    ops.insert(0, ops.pop(i))
    with pytest.raises(wb.FormatError, match="'conv2d' uses 'x', which is not defined before it"):
        load(doc)


def test_bad_input_index_and_control_input(doc):
    op_record(doc, "relu")["inputs"] = ["conv2d:7"]
    with pytest.raises(wb.FormatError, match="has no output"):
        load(doc)


def test_duplicate_name(doc):
    doc["operations"].append(copy.deepcopy(op_record(doc, "scale")))
    with pytest.raises(wb.FormatError, match="the name 'scale' is used twice"):
        load(doc)


def test_attrs_that_fail_the_shape_rule(doc):
    op_record(doc, "max_pool2d")["attrs"]["size"] = [5, 5]
    with pytest.raises(
        wb.FormatError, match=r"\('max_pool2d'\) of the graph file is invalid: ShapeError: .*window \(5, 5\)"
    ):
        load(doc)
    op_record(doc, "max_pool2d")["attrs"]["size"] = [2, 2]
    op_record(doc, "conv2d")["attrs"]["padding"] = "diagonal"
    with pytest.raises(wb.FormatError, match=r"\('conv2d'\) of the graph file is invalid: ShapeError: .*padding"):
        load(doc)


def test_outputs_that_disagree_with_the_rule(doc):
    op_record(doc, "relu")["outputs"][0]["dtype"] = "float64"
    with pytest.raises(wb.FormatError, match="'relu' records outputs"):
        load(doc)


def test_unknown_attr_and_attr_objects(doc):
    op_record(doc, "relu")["attrs"] = {"alpha": 0.1}
    with pytest.raises(wb.FormatError, match="TypeError"):
        load(doc)
    op_record(doc, "relu")["attrs"] = {"x": {"py/object": "os.system"}}
    with pytest.raises(wb.FormatError, match="unexpected object in attributes"):
        load(doc)


def _array(doc):
    return op_record(doc, "dense/w")["attrs"]["init"]["ndarray"]


def test_array_with_wrong_byte_length(doc):
    data = base64.b64decode(_array(doc)["data"])
    _array(doc)["data"] = base64.b64encode(data[:-4]).decode()
    with pytest.raises(wb.FormatError, match=r"array data holds 92 bytes; shape \(8, 3\) of float32 needs 96"):
        load(doc)


@pytest.mark.parametrize("data", ["not base64!!", "QUJ", "QUJD\n", 12, None])
def test_array_with_bad_base64(doc, data):
    _array(doc)["data"] = data
    with pytest.raises(wb.FormatError, match="base64"):
        load(doc)


@pytest.mark.parametrize("dtype", ["object", "O", "|O", "complex128", "<U10", "V8", None, ["f4"]])
def test_array_with_bad_dtype(doc, dtype):
    _array(doc)["dtype"] = dtype
    with pytest.raises(wb.FormatError, match="array dtype .* is not one of"):
        load(doc)


@pytest.mark.parametrize("shape", [[-1, 3], [8.0, 3], "8,3", [True, 3], [2**40, 2**40]])
def test_array_with_bad_shape(doc, shape):
    _array(doc)["shape"] = shape
    with pytest.raises(wb.FormatError, match="array shape .* is not a list of non-negative ints|too large"):
        load(doc)


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("dtype", "object", "has dtype 'object'"),
        ("dtype", "__import__('os').system('echo hacked')", "has dtype"),
        ("shape", [1.5, 2], "has shape"),
        ("shape", ["x"], "has shape"),
        ("shape", None, "has shape"),
        ("init", "__import__('os').system('echo hacked')", "has initializer"),
        ("init", True, "has initializer"),
        ("trainable", "yes", '"trainable"'),
    ],
)
def test_bad_variable_attrs(doc, field, value, match):
    op_record(doc, "scale")["attrs"][field] = value
    with pytest.raises(wb.FormatError, match=match):
        load(doc)


def test_bad_placeholder_dtype(doc):
    op_record(doc, "x")["attrs"]["dtype"] = "object"
    with pytest.raises(wb.FormatError, match="'x' has dtype 'object'"):
        load(doc)


def test_aliases_cannot_shadow_or_dangle(doc):
    for aliases in ({"x": "y"}, {"gone": "missing"}, {"a": 3}, ["x"]):
        with pytest.raises(wb.FormatError, match='invalid "aliases"'):
            load({**doc, "aliases": aliases})


def test_deeply_nested_json():
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        with pytest.raises(wb.FormatError, match="not a graph file"):
            load(text)
    nested = {"format": "workbench-graph", "version": 1, "name": "n", "operations": [
        {"name": "c", "type": "constant", "inputs": [], "attrs": {"value": json.loads("[" * 500 + "]" * 500)}}
    ]}  # fmt: skip
    with pytest.raises(wb.FormatError):
        load(nested)


def test_hostile_content_never_runs(doc, tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    payload = f"__import__('os').system('touch {marker}')"
    hostile = [
        ("type", payload),
        ("name", payload),
    ]
    for field, value in hostile:
        bad = copy.deepcopy(doc)
        op_record(bad, "scale")[field] = value
        try:
            load(bad)
        except wb.FormatError:
            pass
    # code in places that are plain strings: loads as text and stays text
    bad = copy.deepcopy(doc)
    op_record(bad, "relu")["source"] = {"filename": payload, "lineno": 1, "code": f"exec({payload!r})"}
    bad["name"] = payload
    g = load(bad)
    assert g.name == payload and g.get("relu").op.source.code == f"exec({payload!r})"
    bad = copy.deepcopy(doc)
    op_record(bad, "scale")["attrs"]["init"] = {"ndarray": {"dtype": payload, "shape": [], "data": ""}}
    with pytest.raises(wb.FormatError):
        load(bad)
    for op in ("x", "scale"):
        bad = copy.deepcopy(doc)
        op_record(bad, op)["attrs"]["dtype"] = payload
        with pytest.raises(wb.FormatError):
            load(bad)
    assert not marker.exists() and calls == []


def test_failed_load_has_no_side_effects(doc):
    before = wb.get_default_graph()
    count = len(before.operations)
    bad = copy.deepcopy(doc)
    bad["operations"][-1]["type"] = "nope"
    with pytest.raises(wb.FormatError):
        load(bad)
    assert wb.get_default_graph() is before and len(before.operations) == count


def test_a_variable_beyond_the_element_limit_is_refused_at_load(doc):
    """Fixes: a graph file with a (10**12,) variable loaded, then its first run raised MemoryError."""
    record = op_record(doc, "scale")
    record["attrs"]["shape"] = [10**12]
    record["outputs"][0]["shape"] = [10**12]
    with pytest.raises(
        wb.FormatError, match=r"'scale'.*ShapeError: .*shape \(1000000000000,\) has .* elements, more than the limit"
    ):
        load(doc)


def test_a_nul_in_a_name_is_refused_at_load(doc):
    op_record(doc, "scale")["name"] = "sc\0ale"
    with pytest.raises(wb.FormatError, match="invalid name"):
        load(doc)
