"""The drawing of a graph as plain data: visible nodes, edges, scope boxes and coordinates.

Pure functions of a :class:`~workbench.graph.core.Graph` and the set of collapsed
name scopes, so the layout is tested without a browser. A collapsed scope is one
node standing for all its operations; the front end only draws what it is given.

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

NODE_W, NODE_H = 150, 40
GAP_X, GAP_Y = 24, 44
MARGIN = 16
STATE_ORDER = ("error", "running", "waiting", "done")  # a group shows its most urgent member state
_UPDATES = ("assign", "assign_add", "assign_sub")


def scopes_of(name: str) -> list[str]:
    """The enclosing scopes of an op name, outermost first: ``"a/b/c"`` -> ``["a", "a/b"]``."""
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def all_scopes(graph: Graph) -> list[str]:
    """Every name scope that holds an operation, outermost first."""
    seen: dict[str, None] = {}
    for op in graph.operations:
        for scope in scopes_of(op.name):
            seen.setdefault(scope)
    return sorted(seen, key=lambda s: (s.count("/"), s))


def default_collapsed(graph: Graph) -> list[str]:
    """Scopes folded at first: the gradient subgraph and the optimizers' update scopes."""
    folded = []
    for op in graph.operations:
        top = scopes_of(op.name)[:1]
        if top and (top[0] == "gradients" or top[0].startswith("gradients_") or op.type in _UPDATES):
            folded.append(top[0])
    return sorted(set(folded))


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
    """Nodes with coordinates, edges, boxes around expanded scopes, and the drawing's size."""
    collapsed = set(collapsed)
    nodes: dict[str, dict] = {}
    for op in graph.operations:
        vid = visible_node(op.name, collapsed)
        if vid == op.name:
            nodes[vid] = {**op_info(op), "scope": "/".join(op.name.split("/")[:-1])}
        elif vid not in nodes:
            nodes[vid] = _group_node(vid)
        if vid != op.name:
            nodes[vid]["members"] += 1
    edges = _edges(graph, collapsed)
    layers = _layers(list(nodes), edges, nodes)
    order = _order(layers, edges)
    width = _place(order, nodes)
    boxes = _boxes(nodes, collapsed, all_scopes(graph))
    height = max((n["y"] + NODE_H for n in nodes.values()), default=0) + MARGIN
    return {
        "name": graph.name,
        "nodes": list(nodes.values()),
        "edges": [{"source": s, "target": t, "control": c} for (s, t), c in edges.items()],
        "boxes": boxes,
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


def _group_node(scope: str) -> dict[str, Any]:
    return {
        "id": scope, "label": scope.rsplit("/", 1)[-1], "type": "scope", "kind": "scope", "shape": "",
        "dtype": "", "outputs": [], "inputs": [], "source": None, "members": 0,
        "scope": "/".join(scope.split("/")[:-1]),
    }  # fmt: skip


def _shape(shape) -> str:
    return "?" if shape is None else rules.fmt(shape)


def _edges(graph: Graph, collapsed: set[str]) -> dict[tuple[str, str], bool]:
    """(source, target) -> whether it is only a control dependency; no self loops."""
    edges: dict[tuple[str, str], bool] = {}
    for op in graph.operations:
        target = visible_node(op.name, collapsed)
        deps = [(t.op, False) for t in op.inputs] + [(c, True) for c in op.control_inputs]
        for dep, control in deps:
            source = visible_node(dep.name, collapsed)
            if source != target:
                edges[(source, target)] = edges.get((source, target), True) and control
    return edges


def _layers(ids: list[str], edges, nodes) -> dict[str, int]:
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
    """Nodes of each layer, ordered by the barycenter of their neighbours (a few sweeps)."""
    rows: list[list[str]] = [[] for _ in range(max(layers.values(), default=-1) + 1)]
    for n in layers:  # creation order is a good start
        rows[layers[n]].append(n)
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


def _place(rows: list[list[str]], nodes: dict[str, dict]) -> int:
    """Set x, y of every node (rows centered); returns the drawing's width."""
    widest = max((len(r) for r in rows), default=0)
    width = 2 * MARGIN + widest * NODE_W + max(widest - 1, 0) * GAP_X
    for i, row in enumerate(rows):
        row_w = len(row) * NODE_W + max(len(row) - 1, 0) * GAP_X
        x0 = (width - row_w) / 2
        for k, n in enumerate(row):
            nodes[n]["x"] = round(x0 + k * (NODE_W + GAP_X))
            nodes[n]["y"] = MARGIN + 14 + i * (NODE_H + GAP_Y)
            nodes[n]["w"], nodes[n]["h"] = NODE_W, NODE_H
    return width


def _boxes(nodes: dict[str, dict], collapsed: set[str], scopes: list[str]) -> list[dict]:
    """One box per expanded scope, around the nodes inside it (clicking its title folds it)."""
    boxes = []
    for scope in scopes:
        if scope in collapsed or any(s in collapsed for s in scopes_of(scope + "/x")[:-1]):
            continue
        inside = [n for n in nodes.values() if n["id"].startswith(scope + "/")]
        if not inside:
            continue
        depth = scope.count("/")
        pad = 8 - 2 * min(depth, 3)
        x0 = min(n["x"] for n in inside) - pad
        y0 = min(n["y"] for n in inside) - pad - 14
        x1 = max(n["x"] + n["w"] for n in inside) + pad
        y1 = max(n["y"] + n["h"] for n in inside) + pad
        boxes.append({"scope": scope, "x": x0, "y": y0, "w": x1 - x0, "h": y1 - y0, "depth": depth})
    return boxes
