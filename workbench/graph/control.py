"""Control flow as graph: :func:`cond` and :func:`scan`.

Each is one op whose bodies are sub-graphs held as attributes (:class:`Body`: a
graph, its input placeholders and its outputs), so a graph with control flow is
still plain data: it saves to JSON with its bodies, and loading runs no code.

A body is built by calling the user's function once, inside a :class:`BodyGraph`:
tensors of the enclosing graphs that the function uses become inputs of the op
(captured), variables it creates go to the outermost graph. The plan compiler
compiles each body once into a sub-plan (``OpDef.bodies``); ``scan`` runs it once
per step, ``cond`` runs only the chosen branch's.

Gradients are control flow again: the gradient of ``scan`` is a ``scan`` over the
reversed steps whose body is the gradient of the forward body (the carries of
every step are a hidden output of the forward op); the gradient of ``cond`` is a
``cond`` of the branches' gradients.
"""

from __future__ import annotations

from workbench.errors import FormatError, GraphError
from workbench.graph import serialize
from workbench.graph.core import Graph, Tensor, get_default_graph, user_source
from workbench.ops import rules
from workbench.ops.registry import TensorSpec, apply, get_op


class BodyGraph(Graph):
    """The graph of a body being built inside ``parent``: outer tensors it uses become its inputs."""

    def __init__(self, name: str, parent: Graph, kind: str):
        super().__init__(name=name)
        self.parent, self.kind = parent, kind
        self.captured: dict[Tensor, Tensor] = {}  # tensor of the parent graph -> placeholder here

    @property
    def root(self) -> Graph:
        graph = self.parent
        while graph.parent is not None:
            graph = graph.parent
        return graph

    def capture(self, t: Tensor) -> Tensor:
        """The placeholder standing for ``t`` of an enclosing graph (``t`` if it is of no enclosing graph)."""
        if t.graph is self:
            return t
        outer = t
        if t.graph is not self.parent:
            if self.parent.parent is None or not encloses(self.parent, t.graph):
                return t  # a foreign graph: build() says so
            outer = self.parent.capture(t)
        found = self.captured.get(outer)
        if found is None:
            k = len(self.captured)
            while self._taken("/".join(self._scopes + [f"captured_{k}"])):
                k += 1
            name = f"captured_{k}"
            found = self.add_op("placeholder", (), {"shape": outer.shape, "dtype": outer.dtype}, name=name).outputs[0]
            self.captured[outer] = found
        return found

    def add_op(self, op_type, inputs, attrs, name=None, control_inputs=(), source=None):
        if op_type == "variable":  # a variable lives in the outermost graph; the body captures it
            root = self.root
            full = "/".join(self._scopes + [name or op_type])
            return root.add_op(op_type, inputs, attrs, name=full, control_inputs=control_inputs, source=source)
        opdef = get_op(op_type)
        if opdef.stateful or opdef.random:
            what = "updates a variable" if opdef.stateful else "draws random numbers"
            where = f"\n  {source}" if source else ""
            raise GraphError(
                f"{self.kind} body {self.name!r}: {op_type} {name or op_type!r} {what}, which a {self.kind} body "
                f"cannot do; compute it outside the {self.kind}{where}"
            )
        return super().add_op(op_type, inputs, attrs, name, control_inputs, source)


class Body:
    """A sub-graph with named input placeholders and output tensors: the body of a control-flow op.

    Immutable once made. :meth:`compile` makes the sub-plan that runs it (the plan compiler
    calls it once per plan); :meth:`to_doc` and :meth:`from_doc` are its file form.
    """

    __slots__ = ("graph", "inputs", "outputs", "_plans", "compiled")

    def __init__(self, graph: Graph, inputs, outputs):
        self.graph = graph
        self.inputs: tuple[str, ...] = tuple(inputs)  # placeholder names, in the op's input order
        self.outputs: tuple[str, ...] = tuple(outputs)  # tensor names
        self._plans: dict = {}
        self.compiled = 0  # sub-plans compiled so far (for tests and diagnostics)

    @property
    def input_specs(self) -> list[TensorSpec]:
        return [self.graph.get(n).spec for n in self.inputs]

    @property
    def output_specs(self) -> list[TensorSpec]:
        return [self.graph.get(n).spec for n in self.outputs]

    def compile(self, xp, compilers=()) -> SubPlan:  # noqa: A003 - what a plan compiler calls
        """A sub-plan running this body with namespace ``xp``: pruned and optimized once, then cached."""
        key = (getattr(xp, "__name__", id(xp)), tuple(compilers))
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = SubPlan(self, xp, compilers)
            self.compiled += 1
        return found

    def to_doc(self) -> dict:
        return {"graph": serialize.graph_to_doc(self.graph), "inputs": list(self.inputs), "outputs": list(self.outputs)}

    @classmethod
    def from_doc(cls, doc) -> Body:
        if (
            not isinstance(doc, dict)
            or not isinstance(doc.get("inputs"), list)
            or not isinstance(doc.get("outputs"), list)
        ):
            raise FormatError('a body needs a "graph" and lists of "inputs" and "outputs"')
        graph = serialize.graph_from_doc(doc.get("graph"), Graph)
        for name in doc["inputs"]:
            if not isinstance(name, str) or name not in graph or graph.get(name).op.type != "placeholder":
                raise FormatError(f"body input {name!r} is not a placeholder of the body")
        for name in doc["outputs"]:
            if not isinstance(name, str) or name.partition(":")[0] not in graph or not hasattr(graph.get(name), "op"):
                raise FormatError(f"body output {name!r} is not a tensor of the body")
        for op in graph.operations:
            if op.opdef.stateful or op.opdef.random:
                raise FormatError(f"body op {op.name!r} ({op.type}) updates state or draws random numbers")
            if op.type == "placeholder" and op.name not in doc["inputs"]:
                raise FormatError(f"body placeholder {op.name!r} is not one of its inputs")
        return cls(graph, doc["inputs"], doc["outputs"])

    def __repr__(self) -> str:
        return f"<Body of {len(self.graph.operations)} ops: {len(self.inputs)} inputs, {len(self.outputs)} outputs>"


serialize.DECODERS["body"] = Body.from_doc


class SubPlan:
    """A body compiled for one array namespace: ``run(arrays)`` takes one array per body input."""

    def __init__(self, body: Body, xp, compilers=()):
        from workbench.graph.passes import optimize
        from workbench.graph.plan import Plan

        graph = optimize(body.graph, list(body.outputs), fed=list(body.inputs))
        fed = [n for n in body.inputs if n in graph]
        self.positions = [body.inputs.index(n) for n in fed]
        self.plan = Plan(graph, list(body.outputs), fed, xp, {}, compilers=compilers)

    def run(self, arrays) -> list:
        return self.plan.run([arrays[i] for i in self.positions])


# -- helpers of cond and scan -------------------------------------------------------------------


def graph_for(*tensors) -> Graph:
    """The graph a control-flow op goes to: the one being built, unless the tensors come from
    another graph that it does not enclose (then theirs)."""
    current = get_default_graph()
    for t in tensors:
        if isinstance(t, Tensor) and not encloses(current, t.graph):
            return t.graph
    return current


def encloses(graph: Graph, other: Graph) -> bool:
    """``other`` is ``graph`` or one of the graphs it is built inside."""
    while graph is not None:
        if graph is other:
            return True
        graph = graph.parent
    return False


def as_body_tensors(body: BodyGraph, values, what: str) -> list[Tensor]:
    """Tensors of ``body`` for a function's flat results: outer tensors are captured, numbers become constants."""
    out = []
    for v in values:
        if isinstance(v, Tensor):
            out.append(body.capture(v) if v.graph is not body else v)
            continue
        try:
            with body.as_default():
                out.append(apply("identity", v))
        except Exception as e:
            raise GraphError(f"{what} must be tensors or numbers, got {type(v).__name__}{where()}") from e
    return out


def as_tensors(graph: Graph, values) -> list[Tensor]:
    """``values`` as tensors of ``graph``: numbers and arrays become constants."""
    out = []
    for v in values:
        if not isinstance(v, Tensor):
            with graph.as_default():
                v = apply("identity", v)
        out.append(v)
    return out


def placeholder_in(body: Graph, name: str, spec: TensorSpec) -> Tensor:
    return body.add_op("placeholder", (), {"shape": spec.shape, "dtype": spec.dtype}, name=name).outputs[0]


def clone(body: Body, graph: Graph, inputs) -> list[Tensor]:
    """The ops of ``body`` added to ``graph`` with ``inputs`` (one per body input) in place of its
    placeholders; returns the copies of its outputs."""
    by_name = dict(zip(body.inputs, inputs))
    tensors: dict = {}
    ops_: dict = {}
    for op in body.graph.operations:
        if op.type == "placeholder":
            tensors[op.outputs[0]] = by_name[op.name]
            continue
        control = [ops_[c] for c in op.control_inputs if c in ops_]
        name = op.name.rsplit("/", 1)[-1]
        copy = graph.add_op(op.type, [tensors[t] for t in op.inputs], op.attrs, name, control, op.source)
        ops_[op] = copy
        tensors.update(zip(op.outputs, copy.outputs))
    return [tensors[body.graph.get(n)] for n in body.outputs]


def where() -> str:
    """The user's line, as messages end with it."""
    source = user_source()
    return f"\n  {source}" if source else ""


def spec_text(spec: TensorSpec) -> str:
    return f"{'any shape' if spec.shape is None else rules.fmt(spec.shape)} {spec.dtype}"


def same_spec(a: TensorSpec, b: TensorSpec) -> bool:
    """The same dtype and rank, and sizes that agree where both are known."""
    if a.dtype != b.dtype or (a.shape is None) != (b.shape is None):
        return False
    return a.shape is None or (len(a.shape) == len(b.shape) and all(map(rules.dims_match, a.shape, b.shape)))


def merged(a: TensorSpec, b: TensorSpec) -> TensorSpec:
    """What both specs promise: sizes they agree on, None elsewhere."""
    if a.shape is None or b.shape is None:
        return TensorSpec(None, a.dtype)
    return TensorSpec(tuple(x if x == y else None for x, y in zip(a.shape, b.shape)), a.dtype)


def bodies_of(op) -> list[tuple[str, Body]]:
    """``(attribute, body)`` for each body of a control-flow op (none for other ops)."""
    return [(key, op.attrs[key]) for key in op.opdef.bodies]
