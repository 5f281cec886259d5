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
    assert len(graph_layout(g, default_collapsed(g))["nodes"]) == 1 + 40 * 5 + 3  # x, the layers, mean, gradients, Adam
