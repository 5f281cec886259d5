"""The drawing of a graph as plain data: visible nodes, edges, scope boxes and coordinates.

Pure functions of a :class:`~workbench.graph.core.Graph` and the set of collapsed
name scopes, so the layout is tested without a browser. A collapsed scope is one
node standing for all its operations; the front end only draws what it is given.

Expanded scopes are compound nodes, laid out from the inside out: each scope's
direct members (ops and inner scopes) are layered and ordered as one small graph
(networkx's topological generations, then barycenter sweeps), and the resulting
block is a single node of its parent's layout. A scope's members are therefore
contiguous and its box holds nothing else, by construction rather than by a
bounding rectangle; and nothing beyond PyPI is needed (graphviz's ``dot``
clusters would need a system binary).

>>> import workbench as wb
>>> g = wb.Graph(name="tiny")
>>> with g.as_default():
...     x = wb.placeholder("x", shape=(None, 2))
...     with wb.name_scope("layer"):
...         y = wb.relu(x * 2.0)
>>> [n["id"] for n in graph_layout(g, collapsed={"layer"})["nodes"]]
['x', 'layer']
"""

from __future__ import annotations

from typing import Any

from workbench.graph.core import Graph, Operation
from workbench.ops import rules
from workbench.widgets.drawn import control_scopes, drawn_operations

NODE_W, NODE_H = 150, 40
GAP_X, GAP_Y = 24, 36
MARGIN = 16
PAD, TITLE = 10, 16  # inside a scope's box: the padding, and the room for its title above its rows
ROW_ITEMS = 8  # a layer with more items than this wraps onto more rows
FOLD_OVER = 3  # a user name scope with more operations than this starts folded
STATE_ORDER = ("error", "running", "waiting", "done")  # a group shows its most urgent member state
_UPDATES = ("assign", "assign_add", "assign_sub")


def scopes_of(name: str) -> list[str]:
    """The enclosing scopes of an op name, outermost first: ``"a/b/c"`` -> ``["a", "a/b"]``."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def all_scopes(graph: Graph) -> list[str]:
    """Every name scope that holds an operation, outermost first."""
    seen: dict[str, None] = {}
    for op in drawn_operations(graph):
        for scope in scopes_of(op.name):
            seen.setdefault(scope)
    return sorted(seen, key=lambda s: (s.count("/"), s))


def default_collapsed(graph: Graph, fold_over: int = FOLD_OVER) -> list[str]:
    """Scopes folded at first: the gradient subgraph, the optimizers' update scopes, the statistics
    (``stats``, see :mod:`workbench.graph.probes`), and every user name scope (nested ones too)
    with more than ``fold_over`` operations."""
    system: set[str] = set(control_scopes(graph))  # a loop or a branch is one node until opened
    sizes: dict[str, int] = {}
    for op in drawn_operations(graph):
        scopes = scopes_of(op.name)
        if scopes and (
            scopes[0] in ("gradients", "stats") or scopes[0].startswith("gradients_") or op.type in _UPDATES
        ):
            system.add(scopes[0])
        for scope in scopes:
            sizes[scope] = sizes.get(scope, 0) + 1
    user = [s for s, n in sizes.items() if n > fold_over and s.split("/")[0] not in system]
    return sorted(system | set(user))


def kind_of(op: Operation) -> str:
    """How a node is drawn: ``placeholder``, ``variable``, ``constant``, ``update``, ``group`` or ``op``."""
    if op.type in ("placeholder", "variable", "constant"):
        return op.type
    if op.type in _UPDATES:
        return "update"
    if op.type == "no_op":
        return "group"
    return "op"


def op_info(op: Operation) -> dict[str, Any]:
    """What the details panel shows about one operation."""
    out = op.outputs[0] if op.outputs else None
    source = None
    if op.source is not None:
        source = {"file": op.source.filename, "line": op.source.lineno, "code": op.source.code}
    return {
        "id": op.name,
        "label": op.name.rsplit("/", 1)[-1],
        "type": op.type,
        "kind": kind_of(op),
        "shape": _shape(out.shape) if out is not None else "",
        "dtype": out.dtype if out is not None else "",
        "outputs": [{"shape": _shape(t.shape), "dtype": t.dtype} for t in op.outputs],
        "inputs": [t.name for t in op.inputs] + [f"^{c.name}" for c in op.control_inputs],
        "source": source,
    }


def visible_node(name: str, collapsed: set[str]) -> str:
    """The node that shows op ``name``: itself, or its outermost collapsed scope."""
    for scope in scopes_of(name):
        if scope in collapsed:
            return scope
    return name


def graph_layout(graph: Graph, collapsed=()) -> dict[str, Any]:
    """Nodes with coordinates, edges, boxes around expanded scopes, and the drawing's size.

    Expanded scopes are laid out as compound nodes: each is a block, laid out on
    its own, that its parent lays out as one node. A scope's members are therefore
    contiguous and its box holds only them.
    """
    collapsed = set(collapsed)
    nodes: dict[str, dict] = {}
    drawn = drawn_operations(graph)
    controls = {op.control: op for op in drawn if op.control}
    for op in drawn:
        vid = visible_node(op.name, collapsed)
        if vid == op.name:
            nodes[vid] = {**op_info(op), "scope": "/".join(op.name.split("/")[:-1])}
        elif vid not in nodes:
            nodes[vid] = _group_node(vid, controls.get(vid))
        if vid != op.name:
            nodes[vid]["members"] += 1
    edges = _edges(drawn, collapsed)
    blocks = _blocks(nodes, edges)
    width, height = blocks[""]["w"], blocks[""]["h"]
    _position("", blocks, nodes, 0, 0)
    boxes = [
        {"scope": scope, "x": b["x"], "y": b["y"], "w": b["w"], "h": b["h"], "depth": scope.count("/")}
        for scope, b in blocks.items()
        if scope
    ]
    return {
        "name": graph.name,
        "nodes": list(nodes.values()),
        "edges": [{"source": s, "target": t, "control": c} for (s, t), c in edges.items()],
        "boxes": sorted(boxes, key=lambda b: (b["depth"], b["scope"])),
        "collapsed": sorted(collapsed),
        "width": width,
        "height": height,
    }


def group_states(states: dict[str, str], collapsed=()) -> dict[str, str]:
    """Per-op states (``waiting``, ``running``, ``done``, ``error``) as per-visible-node states."""
    collapsed = set(collapsed)
    out: dict[str, str] = {}
    for name, state in states.items():
        vid = visible_node(name, collapsed)
        old = out.get(vid)
        if old is None or STATE_ORDER.index(state) < STATE_ORDER.index(old):
            out[vid] = state
    return out


def _group_node(scope: str, control=None) -> dict[str, Any]:
    """A folded scope; ``control``: the control-flow op the scope opens (drawn with its type and outputs)."""
    if control is not None:
        return {**_group_node(scope), **{k: op_info(control)[k] for k in ("type", "shape", "dtype", "outputs", "inputs")},
                "source": op_info(control)["source"], "control": control.type}  # fmt: skip
    return {
        "id": scope,
        "label": scope.rsplit("/", 1)[-1],
        "type": "scope",
        "kind": "scope",
        "shape": "",
        "dtype": "",
        "outputs": [],
        "inputs": [],
        "source": None,
        "members": 0,
        "scope": "/".join(scope.split("/")[:-1]),
    }


def _shape(shape) -> str:
    return "?" if shape is None else rules.fmt(shape)


def _edges(drawn, collapsed: set[str]) -> dict[tuple[str, str], bool]:
    """(source, target) -> whether it is only a control dependency; no self loops."""
    edges: dict[tuple[str, str], bool] = {}
    for op in drawn:
        target = visible_node(op.name, collapsed)
        deps = [(t.op, False) for t in op.inputs] + [(c, True) for c in op.control_inputs]
        for dep, control in deps:
            source = visible_node(dep.name, collapsed)
            if source != target:
                edges[(source, target)] = edges.get((source, target), True) and control
    return edges


def _blocks(nodes: dict[str, dict], edges) -> dict[str, dict]:
    """Every expanded scope (and the top level, ``""``) as a block: its items, sizes and
    positions relative to the block, innermost scopes laid out first."""
    items: dict[str, dict[str, None]] = {"": {}}  # ordered sets: creation order
    for node_id in nodes:
        chain = ["", *scopes_of(node_id)]  # the expanded scopes holding it, outermost first
        for parent, child in zip(chain, [*chain[1:], node_id]):
            items.setdefault(parent, {})[child] = None
    blocks: dict[str, dict] = {}
    for scope in sorted(items, key=lambda s: -1 if s == "" else s.count("/"), reverse=True):
        members = list(items[scope])
        sizes = {i: (blocks[i]["w"], blocks[i]["h"]) if i in blocks else (NODE_W, NODE_H) for i in members}
        blocks[scope] = _layout_block(scope, members, sizes, _item_edges(scope, edges))
    return blocks


def _item_of(scope: str, node_id: str) -> str | None:
    """Which item of ``scope``'s block holds ``node_id`` (None when it lies outside the scope)."""
    if scope and not node_id.startswith(scope + "/"):
        return None
    depth = scope.count("/") + 1 if scope else 0
    chain = [*scopes_of(node_id), node_id]
    return chain[depth] if depth < len(chain) else None


def _item_edges(scope: str, edges) -> list[tuple[str, str]]:
    """Edges between different items of ``scope``'s block (a scope stands for all it holds)."""
    out: dict[tuple[str, str], None] = {}
    for s, t in edges:
        a, b = _item_of(scope, s), _item_of(scope, t)
        if a is not None and b is not None and a != b:
            out[(a, b)] = None
    return list(out)


def _layout_block(scope: str, items: list[str], sizes: dict, edges) -> dict:
    """Rows of items (layered, ordered by barycenters), centred; the block's size and each item's offset."""
    layers = _layers(items, edges)
    # A wide layer (an optimizer's slots, the gradients of every variable) wraps onto several
    # rows: its items share no edges, so every edge still points down.
    rows = [row[i : i + ROW_ITEMS] for row in _order(layers, edges) for i in range(0, len(row), ROW_ITEMS)]
    pad, title = (PAD, TITLE) if scope else (MARGIN, 14)
    widths = [sum(sizes[i][0] for i in row) + GAP_X * max(len(row) - 1, 0) for row in rows]
    inner_w = max(widths, default=0)
    offsets, y = {}, title + pad
    for row, row_w in zip(rows, widths):
        x = pad + (inner_w - row_w) / 2
        row_h = max(sizes[i][1] for i in row)
        for i in row:
            offsets[i] = (round(x), round(y + (row_h - sizes[i][1]) / 2))
            x += sizes[i][0] + GAP_X
        y += row_h + GAP_Y
    height = y - (GAP_Y if rows else 0) + pad
    return {"items": items, "offsets": offsets, "w": round(inner_w + 2 * pad), "h": round(height)}


def _position(scope: str, blocks: dict, nodes: dict, x0: float, y0: float) -> None:
    """Absolute coordinates of ``scope``'s block (its box) and, recursively, of everything in it."""
    block = blocks[scope]
    block["x"], block["y"] = x0, y0
    for item, (dx, dy) in block["offsets"].items():
        if item in blocks and item not in nodes:
            _position(item, blocks, nodes, x0 + dx, y0 + dy)
        else:
            nodes[item].update(x=x0 + dx, y=y0 + dy, w=NODE_W, h=NODE_H)


def _layers(ids: list[str], edges) -> dict[str, int]:
    """Longest-path layers; inputs (no incoming edges) sit just above their first consumer."""
    import networkx as nx

    dag = nx.DiGraph()
    dag.add_nodes_from(ids)
    dag.add_edges_from(edges)
    if not nx.is_directed_acyclic_graph(dag):  # collapsing a scope can close a cycle
        dag = _break_cycles(dag, ids)
    layer = {}
    for i, generation in enumerate(nx.topological_generations(dag)):
        for n in generation:
            layer[n] = i
    for n in reversed(list(nx.topological_sort(dag))):
        succ = [layer[s] for s in dag.successors(n)]
        if not list(dag.predecessors(n)) and succ:
            layer[n] = min(succ) - 1
    shift = min(layer.values(), default=0)
    return {n: v - shift for n, v in layer.items()}


def _break_cycles(dag, ids):
    """Keep only edges that go forward in graph order (ids are in creation order)."""
    import networkx as nx

    rank = {n: i for i, n in enumerate(ids)}
    out = nx.DiGraph()
    out.add_nodes_from(ids)
    out.add_edges_from((s, t) for s, t in dag.edges if rank[s] < rank[t])
    return out


def _order(layers: dict[str, int], edges) -> list[list[str]]:
    """Items of each layer, ordered by the barycenter of their neighbours (a few sweeps)."""
    rows: list[list[str]] = [[] for _ in range(max(layers.values(), default=-1) + 1)]
    for n in layers:  # creation order is a good start
        rows[layers[n]].append(n)
    rows = [r for r in rows if r]
    preds: dict[str, list[str]] = {n: [] for n in layers}
    succs: dict[str, list[str]] = {n: [] for n in layers}
    for s, t in edges:
        preds[t].append(s)
        succs[s].append(t)
    for sweep in range(4):
        down = sweep % 2 == 0
        indices = range(1, len(rows)) if down else range(len(rows) - 2, -1, -1)
        for i in indices:
            ref = {n: k for k, n in enumerate(rows[i - 1 if down else i + 1])}
            rows[i] = _by_barycenter(rows[i], preds if down else succs, ref)
    return rows


def _by_barycenter(row: list[str], neighbours, ref: dict[str, int]) -> list[str]:
    def key(item):
        k, n = item
        pos = [ref[m] for m in neighbours[n] if m in ref]
        return (sum(pos) / len(pos) if pos else k * len(ref) / max(len(row), 1), k)

    return [n for _, n in sorted(enumerate(row), key=key)]
