import pytest

import workbench as wb
from workbench.widgets.layout import (
    all_scopes,
    default_collapsed,
    graph_layout,
    group_states,
    scopes_of,
    visible_node,
)


def by_id(layout):
    return {n["id"]: n for n in layout["nodes"]}


def test_gradients_and_optimizer_scopes_are_folded_by_default(mlp):
    assert default_collapsed(mlp) == ["SGD", "gradients"]
    layout = graph_layout(mlp, default_collapsed(mlp))
    nodes = by_id(layout)
    assert sorted(nodes) == ["SGD", "add", "b", "gradients", "matmul", "mean", "softmax_cross_entropy", "w", "x", "y"]
    assert nodes["gradients"]["kind"] == "scope" and nodes["gradients"]["members"] == 6
    assert nodes["SGD"]["members"] == 7
    assert layout["boxes"] == []  # nothing open to draw a box around


def test_unfolding_shows_every_op_and_boxes_the_scopes(mlp):
    layout = graph_layout(mlp, collapsed=())
    assert len(layout["nodes"]) == len(mlp.operations) == 21
    assert {b["scope"] for b in layout["boxes"]} == {"gradients", "SGD"}
    for box in layout["boxes"]:
        inside = [n for n in layout["nodes"] if n["id"].startswith(box["scope"] + "/")]
        assert all(box["x"] <= n["x"] and n["x"] + n["w"] <= box["x"] + box["w"] for n in inside)


def test_nodes_tell_inputs_apart_and_carry_type_shape_and_source(mlp):
    nodes = by_id(graph_layout(mlp, default_collapsed(mlp)))
    assert [nodes[n]["kind"] for n in ("x", "w", "matmul")] == ["placeholder", "variable", "op"]
    assert nodes["matmul"]["type"] == "matmul" and nodes["matmul"]["shape"] == "(None, 10)"
    assert nodes["y"]["dtype"] == "int64"
    assert nodes["w"]["source"]["code"].startswith('w = wb.variable("w"')
    assert nodes["softmax_cross_entropy"]["outputs"][1] == {"shape": "(None, 10)", "dtype": "float32"}
    expanded = by_id(graph_layout(mlp, ()))
    assert expanded["SGD/constant"]["kind"] == "constant"
    assert expanded["SGD/assign_sub"]["kind"] == "update"
    assert expanded["SGD/update"]["inputs"] == ["^SGD/assign_sub", "^SGD/assign_sub_1"]


def test_every_edge_points_down_and_joins_visible_nodes(mlp):
    for collapsed in ((), default_collapsed(mlp), ["gradients"]):
        layout = graph_layout(mlp, collapsed)
        nodes = by_id(layout)
        assert layout["edges"]
        for e in layout["edges"]:
            assert nodes[e["source"]]["y"] < nodes[e["target"]]["y"]
        assert all(0 <= n["x"] and n["x"] + n["w"] <= layout["width"] for n in nodes.values())
        ys = {(n["x"], n["y"]) for n in nodes.values()}
        assert len(ys) == len(nodes)  # no two nodes on one spot


def test_folded_scopes_merge_edges_and_control_dependencies(mlp):
    edges = {(e["source"], e["target"]): e["control"] for e in graph_layout(mlp, ["SGD", "gradients"])["edges"]}
    assert edges[("gradients", "SGD")] is False
    assert edges[("w", "SGD")] is False
    assert ("SGD", "SGD") not in edges
    expanded = {(e["source"], e["target"]): e["control"] for e in graph_layout(mlp, ())["edges"]}
    assert expanded[("SGD/assign_sub", "SGD/update")] is True


def test_nested_scopes():
    g = wb.Graph(name="nested")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 3))
        with wb.name_scope("net"):
            with wb.name_scope("layer1"):
                h = wb.relu(x * 2.0)
            with wb.name_scope("layer2"):
                wb.sum(h, axis=1)
    assert scopes_of("net/layer1/relu") == ["net", "net/layer1"]
    assert all_scopes(g) == ["net", "net/layer1", "net/layer2"]
    assert visible_node("net/layer1/relu", {"net/layer1"}) == "net/layer1"
    assert visible_node("net/layer1/relu", {"net", "net/layer1"}) == "net"
    assert sorted(by_id(graph_layout(g, ["net/layer1"]))) == ["net/layer1", "net/layer2/sum", "x"]
    boxes = graph_layout(g, ["net/layer1"])["boxes"]
    assert [b["scope"] for b in boxes] == ["net", "net/layer2"]
    assert [b["scope"] for b in graph_layout(g, ["net"])["boxes"]] == []


def test_a_folded_group_shows_its_most_urgent_state():
    states = {"x": "done", "gradients/a": "done", "gradients/b": "running", "SGD/c": "error", "SGD/d": "done"}
    assert group_states(states, ["gradients", "SGD"]) == {"x": "done", "gradients": "running", "SGD": "error"}
    assert group_states(states, ()) == states


@pytest.mark.slow
def test_a_big_graph_lays_out_quickly():
    g = wb.Graph(name="deep")
    with g.as_default():
        h = wb.placeholder("x", shape=(None, 16))
        for i in range(40):
            with wb.name_scope(f"layer{i}"):
                h = wb.relu(wb.matmul(h, wb.variable("w", shape=(16, 16))) + wb.variable("b", shape=(16,)))
        wb.optimizers.Adam().minimize(wb.mean(h))
    layout = graph_layout(g, ())
    assert len(layout["nodes"]) == len(g.operations) > 500
    assert (
        len(graph_layout(g, default_collapsed(g))["nodes"]) == 1 + 40 + 3
    )  # x, the folded layers, mean, gradients, Adam
    open_layers = default_collapsed(g, fold_over=5)
    assert open_layers == ["Adam", "gradients"]
    assert len(graph_layout(g, open_layers)["nodes"]) == 1 + 40 * 5 + 3
    assert_boxes_hold_only_their_members(layout)


# -- compound layout of real models ------------------------------------------------------------


def cnn_with_scopes():
    """A small CNN on 8x8 digits, each layer in its name scope, trained with Adam."""
    g = wb.Graph(name="cnn")
    with g.as_default():
        x = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        h = wb.reshape(x, (-1, 1, 8, 8))
        for i, (cin, cout) in enumerate([(1, 8), (8, 16)], start=1):
            with wb.name_scope(f"conv{i}"):
                k = wb.variable("k", shape=(cout, cin, 3, 3), init="he_normal")
                c = wb.variable("c", shape=(cout, 1, 1), init="zeros")
                h = wb.max_pool2d(wb.relu(wb.conv2d(h, k, padding="same") + c), 2)
        with wb.name_scope("dense"):
            flat = wb.reshape(h, (-1, 16 * 2 * 2))
            logits = flat @ wb.variable("w", shape=(64, 10)) + wb.variable("b", shape=(10,), init="zeros")
        with wb.name_scope("loss"):
            loss = wb.mean(wb.softmax_cross_entropy(logits, y))
        wb.optimizers.Adam(0.01).minimize(loss)
    return g


def mlp6():
    """A 6-layer MLP whose layers are name scopes."""
    g = wb.Graph(name="mlp6")
    with g.as_default():
        h = wb.placeholder("x", shape=(None, 64))
        y = wb.placeholder("y", shape=(None,), dtype="int64")
        for i, units in enumerate([64, 48, 32, 32, 16, 10], start=1):
            with wb.name_scope(f"layer{i}"):
                h = wb.matmul(h, wb.variable("w", shape=(h.shape[1], units))) + wb.variable("b", shape=(units,))
                h = wb.relu(h) if i < 6 else h
        wb.optimizers.SGD(0.1).minimize(wb.mean(wb.softmax_cross_entropy(h, y)))
    return g


def overlaps(a, b):
    return (
        a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]
    )


def holds(box, node):
    return (box["x"] <= node["x"] and node["x"] + node["w"] <= box["x"] + box["w"]
            and box["y"] <= node["y"] and node["y"] + node["h"] <= box["y"] + box["h"])  # fmt: skip


def assert_boxes_hold_only_their_members(layout):
    """Every node of a scope inside its box; no other node touching it; nested boxes nested; no overlaps."""
    nodes, boxes = layout["nodes"], layout["boxes"]
    for box in boxes:
        for n in nodes:
            member = n["id"].startswith(box["scope"] + "/")
            assert holds(box, n) if member else not overlaps(box, n), (box["scope"], n["id"])
        for other in boxes:
            if other["scope"].startswith(box["scope"] + "/"):
                assert holds(box, other)
            elif other is not box and not box["scope"].startswith(other["scope"] + "/"):
                assert not overlaps(box, other), (box["scope"], other["scope"])
    for i, a in enumerate(nodes):
        assert all(not overlaps(a, b) for b in nodes[i + 1 :]), a["id"]
        assert 0 <= a["x"] and a["x"] + a["w"] <= layout["width"] and a["y"] + a["h"] <= layout["height"]


@pytest.mark.parametrize("make", [cnn_with_scopes, mlp6], ids=["cnn", "mlp6"])
def test_scope_boxes_hold_only_their_members(make):
    g = make()
    for collapsed in ((), ["gradients"], ["gradients", "Adam", "SGD"], default_collapsed(g)):
        layout = graph_layout(g, collapsed)
        assert_boxes_hold_only_their_members(layout)
        nodes = by_id(layout)
        for e in layout["edges"]:
            if not e["control"]:
                assert nodes[e["source"]]["y"] < nodes[e["target"]]["y"], e


def test_placeholders_are_not_swallowed_by_the_first_layer():
    layout = graph_layout(cnn_with_scopes(), ["Adam", "gradients"])
    (conv1,) = [b for b in layout["boxes"] if b["scope"] == "conv1"]
    for name in ("x", "y", "reshape"):
        assert not overlaps(conv1, by_id(layout)[name])
    assert {b["scope"] for b in layout["boxes"]} == {"conv1", "conv2", "dense", "loss"}


def test_user_scopes_over_the_threshold_start_folded():
    cnn = cnn_with_scopes()
    assert default_collapsed(cnn) == ["Adam", "conv1", "conv2", "dense", "gradients"]  # loss has 3 ops
    nodes = by_id(graph_layout(cnn, default_collapsed(cnn)))
    assert nodes["conv1"]["kind"] == "scope" and nodes["conv1"]["members"] == 6
    assert default_collapsed(mlp6()) == ["SGD", "gradients", *[f"layer{i}" for i in range(1, 7)]]
    layout = graph_layout(mlp6(), default_collapsed(mlp6()))
    assert len(layout["nodes"]) == 2 + 6 + 4 and layout["height"] < 900  # x, y, the layers, loss ops, folds
    assert default_collapsed(mlp6(), fold_over=100) == ["SGD", "gradients"]
