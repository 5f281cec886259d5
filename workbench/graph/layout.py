"""Transposes folded away: a plan pass for models written in one layout over ops of another.

``workbench.tf1`` maps TensorFlow's NHWC convolutions and poolings onto workbench's NCHW
ops with a transpose on each side, so a stack of layers moves every activation (and its
gradient) to NHWC and back between two NCHW ops. :func:`fold_transposes` removes those
round trips. It follows each transpose downstream, without computing it:

- ``transpose(transpose(x, p), q)`` is ``x`` when the two permutations undo each other,
  and one transpose of ``x`` otherwise;
- an elementwise op whose inputs are transposes by the same permutation (or small
  operands that broadcast, such as a bias, a scalar) runs on the untransposed inputs, the
  small operands reshaped to match, and its result stays "transposed";
- a reduction (``sum``, ``mean``, ``max``, ``min``, ``prod``, and ``reduce_to_like``, the
  gradient of a broadcast bias) of a transposed tensor reduces the untransposed one over
  the matching axes.

The tensors reached this way form regions (connected through those ops); a region is
rewritten only when it needs fewer transposed elements than the graph had: each tensor
of it that an other op reads (or that is fetched) costs one transpose, and the
transposes of the region are saved. So ``conv -> transpose -> bias add -> relu ->
transpose -> pool`` computes the bias add and the relu in NCHW with no transpose at all,
and a stack of NHWC layers keeps one transpose at its input and one at its output, in
the backward pass too. Values are the same; sums may add in another order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from workbench.graph.core import Graph, Operation, Tensor
from workbench.ops import rules

REDUCTIONS = ("sum", "mean", "max", "min", "prod")
UNKNOWN_SIZE = 64  # what an unknown dimension (the batch) counts as when costs are compared


@dataclass(frozen=True)
class _Lazy:
    """An old tensor's value is ``transpose(base, perm)`` (``perm`` None: the base itself)."""

    perm: tuple | None
    region: int


def fold_transposes(graph: Graph, fetches: Iterable[str]) -> Graph:
    """``graph`` with the transposes that cancel or that elementwise ops and reductions can
    do without folded away, where that moves fewer elements; see the module docstring.

    The fetched ops and the ops that others wait for (control inputs) keep their names,
    shapes and values.
    """
    fetched = {_op_of(graph, name) for name in fetches}
    waited = {c for op in graph.operations for c in op.control_inputs}
    analysis = _Analysis(fetched | waited)
    for op in graph.operations:
        analysis.visit(op)
    accepted = analysis.accepted(graph, fetched)
    if not accepted:
        return graph
    return _Emitter(graph, analysis, accepted).build()


# -- permutations -------------------------------------------------------------------


def _perm_of(op: Operation) -> tuple:
    perm = op.attrs["perm"]
    return tuple(range(len(op.inputs[0].shape)))[::-1] if perm is None else tuple(perm)


def _compose(p: tuple | None, q: tuple) -> tuple | None:
    """``transpose(transpose(x, p), q) == transpose(x, r)``; None when ``r`` is the identity."""
    r = q if p is None else tuple(p[i] for i in q)
    return None if r == tuple(range(len(r))) else r


def _inverse(p: tuple) -> tuple:
    inverse = [0] * len(p)
    for i, j in enumerate(p):
        inverse[j] = i
    return tuple(inverse)


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= UNKNOWN_SIZE if d is None else d
    return n


def _in_order(axes: list[int]) -> bool:
    return all(a < b for a, b in zip(axes, axes[1:]))


# -- which tensors can stay transposed ------------------------------------------------


class _Analysis:
    """Visits the ops in order and records, for each tensor that can stay transposed, its
    permutation and region; ``accepted`` picks the regions worth rewriting."""

    def __init__(self, fixed: set[Operation]) -> None:
        self.fixed = fixed  # ops that must keep their outputs as they are
        self.lazy: dict[Tensor, _Lazy] = {}
        self.members: dict[Operation, int] = {}
        self.parent: list[int] = []
        self.extra: dict[Operation, int] = {}  # elements of the small operands an op reshapes

    def region(self, *joined: int) -> int:
        if not joined:
            self.parent.append(len(self.parent))
            return len(self.parent) - 1
        roots = [self.find(r) for r in joined]
        for r in roots[1:]:
            self.parent[r] = roots[0]
        return roots[0]

    def find(self, r: int) -> int:
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def transposed(self, t: Tensor) -> _Lazy | None:
        """The lazy state of ``t`` when it is a transpose of its base (not the base itself)."""
        found = self.lazy.get(t)
        return found if found is not None and found.perm is not None else None

    def visit(self, op: Operation) -> None:
        if len(op.outputs) != 1 or op.outputs[0].shape is None:
            return
        if op.type == "transpose":
            found = self.visit_transpose(op)
        elif op.opdef.elementwise:
            found = self.visit_elementwise(op)
        elif op.type in REDUCTIONS:
            found = self.visit_reduction(op)
        elif op.type == "reduce_to_like":
            found = self.visit_reduce_to_like(op)
        else:
            return
        if found is None:
            return
        perm, region = found
        if perm is not None and op in self.fixed:
            return  # its value must exist as it is: no gain in keeping it transposed
        self.lazy[op.outputs[0]] = _Lazy(perm, region)
        self.members[op] = region

    def visit_transpose(self, op: Operation):
        x = self.transposed(op.inputs[0])
        if op in self.fixed:  # it stays, as one transpose of the base (or none)
            if x is None:
                return None
            if _compose(x.perm, _perm_of(op)) is not None:
                self.extra[op] = _size(op.outputs[0].shape)
            return None, self.region(x.region)
        if x is None:
            return _perm_of(op), self.region()
        return _compose(x.perm, _perm_of(op)), self.region(x.region)

    def visit_elementwise(self, op: Operation):
        out = op.outputs[0]
        n = len(out.shape)
        states = [self.transposed(t) for t in op.inputs]
        perms = {s.perm for s in states if s is not None}
        if len(perms) != 1:
            return None
        extra = 0
        for t, state in zip(op.inputs, states):
            if state is not None:
                if len(t.shape) != n:
                    return None
            elif not _small_operand(t, out):
                return None
            else:
                extra += rules.num_elements(t.shape)
        self.extra[op] = extra
        return perms.pop(), self.region(*(s.region for s in states if s is not None))

    def visit_reduction(self, op: Operation):
        x = self.transposed(op.inputs[0])
        if x is None:
            return None
        if op.attrs["axis"] is None:
            return (x.perm if op.attrs["keepdims"] else None), self.region(x.region)
        return _reduced_perm(x.perm, op), self.region(x.region)

    def visit_reduce_to_like(self, op: Operation):
        g, like = op.inputs
        x = self.transposed(g)
        if x is None or like.shape is None or None in like.shape:
            return None
        if _bias_axes(g.shape, like.shape, x.perm) is None:
            return None
        return None, self.region(x.region)

    def accepted(self, graph: Graph, fetched: set[Operation]) -> set[int]:
        """The regions whose rewrite moves fewer elements than the transposes it removes."""
        saved: dict[int, int] = {}
        cost: dict[int, int] = {}
        for op, region in self.members.items():
            root = self.find(region)
            if op.type == "transpose":
                saved[root] = saved.get(root, 0) + _size(op.outputs[0].shape)
            cost[root] = cost.get(root, 0) + self.extra.get(op, 0)
        for t in self.read_transposed(graph, fetched):
            root = self.find(self.lazy[t].region)
            cost[root] = cost.get(root, 0) + _size(t.shape)
        return {root for root, s in saved.items() if cost.get(root, 0) < s}

    def read_transposed(self, graph: Graph, fetched: set[Operation]) -> set[Tensor]:
        """The tensors that stay transposed but that an op outside their region reads (or a fetch)."""
        read = {t for op in fetched for t in op.outputs if self.transposed(t) is not None}
        for op in graph.operations:
            if op not in self.members:
                read.update(t for t in op.inputs if self.transposed(t) is not None)
        return read


def _small_operand(t: Tensor, out: Tensor) -> bool:
    """Whether ``t`` broadcasts to ``out`` and is cheap to reshape (a bias, a scalar): a fully
    known shape, no more axes than ``out``, and smaller than it along some axis."""
    if t.shape is None or None in t.shape or len(t.shape) > len(out.shape):
        return False
    if len(t.shape) < len(out.shape):
        return True
    return any(d == 1 and o != 1 for d, o in zip(t.shape, out.shape))


def _reduced_perm(perm: tuple, op: Operation) -> tuple | None:
    """The permutation of a reduction's result when its input is ``transpose(base, perm)``."""
    n = len(perm)
    axes = rules.axes_tuple(op.attrs["axis"], n)
    if op.attrs["keepdims"]:
        return perm
    kept = [i for i in range(n) if i not in axes]
    order = sorted(perm[i] for i in kept)
    return _compose(None, tuple(order.index(perm[i]) for i in kept)) if kept else None


def _bias_axes(g_shape: tuple, like_shape: tuple, perm: tuple) -> tuple | None:
    """The axes of the base that ``reduce_to_like(transpose(base, perm), like)`` sums over, when
    the axes it keeps stay in order (so a reshape gives ``like``'s shape); None otherwise."""
    n = len(g_shape)
    if len(like_shape) > n:
        return None
    padded = (1,) * (n - len(like_shape)) + tuple(like_shape)
    summed = [i for i in range(n) if padded[i] == 1 and g_shape[i] != 1]
    kept = [perm[i] for i in range(n) if i not in summed and g_shape[i] != 1]
    if not _in_order(kept):
        return None
    return tuple(sorted(perm[i] for i in summed))


def _op_of(graph: Graph, name: str) -> Operation:
    found = graph.get(name)
    return found if isinstance(found, Operation) else found.op


# -- the rewritten graph ------------------------------------------------------------


class _Emitter:
    """Builds the new graph: the accepted regions' ops on untransposed values, the rest as they were."""

    def __init__(self, graph: Graph, analysis: _Analysis, accepted: set[int]) -> None:
        self.old, self.fixed = graph, analysis.fixed
        self.new = Graph(name=graph.name)
        self.lazy = {t: s for t, s in analysis.lazy.items() if analysis.find(s.region) in accepted}
        self.members = {op for op, r in analysis.members.items() if analysis.find(r) in accepted}
        self.value: dict[Tensor, Tensor] = {}  # old tensor -> its value, or its base when it is in self.lazy
        self.ops: dict[Operation, Operation] = {}
        self.cache: dict[tuple, Tensor] = {}
        self.taken = {op.name for op in graph.operations} | set(graph.aliases)
        self.aliases = {a: graph.resolve(a) for a in graph.aliases}

    def build(self) -> Graph:
        for op in self.old.operations:
            if op in self.members:
                getattr(self, "emit_" + ("reduction" if op.type in REDUCTIONS else op.type), self.emit_elementwise)(op)
            else:
                self.copy(op)
        self.new.set_aliases(self.aliases)
        return self.new

    def add(self, op_type: str, inputs, attrs: dict, old: Operation | None = None, name: str | None = None) -> Tensor:
        """Add an op: in the place of ``old`` (its name, source and control inputs), or a new one named from ``name``."""
        return self.add_op(op_type, inputs, attrs, old, name).outputs[0]

    def add_op(self, op_type: str, inputs, attrs: dict, old: Operation | None = None, name: str | None = None):
        if old is None:
            return self.new.add_op(op_type, inputs, attrs, name=self.fresh(name))
        control = [self.ops[c] for c in old.control_inputs if c in self.ops]
        made = self.new.add_op(op_type, inputs, attrs, name=old.name, control_inputs=control, source=old.source)
        self.ops[old] = made
        return made

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}_{i}", i + 1
        self.taken.add(name)
        return name

    def read(self, t: Tensor) -> Tensor:
        """The value of old tensor ``t`` in the new graph, transposed back where it stayed transposed."""
        state = self.lazy.get(t)
        if state is None or state.perm is None:
            return self.value[t]
        key = ("read", t)
        if key not in self.cache:
            # a transpose folded away leaves its name free; an op computed on bases keeps its own
            name = t.op.name if t.op.type == "transpose" else self.fresh(f"{t.op.name}/transposed")
            made = self.new.add_op("transpose", (self.value[t],), {"perm": state.perm}, name=name)
            self.cache[key] = made.outputs[0]
        return self.cache[key]

    def copy(self, op: Operation) -> None:
        made = self.add_op(op.type, tuple(self.read(t) for t in op.inputs), op.attrs, old=op)
        self.value.update(zip(op.outputs, made.outputs))

    def emit_transpose(self, op: Operation) -> None:
        x, out = op.inputs[0], op.outputs[0]
        base = self.value[x]
        if op in self.fixed:  # fetched or waited for: one transpose of the base, or the base itself
            state = self.lazy.get(x)
            perm = _compose(state.perm if state is not None else None, _perm_of(op))
            made = self.add("identity", (base,), {}, old=op) if perm is None else None
            self.value[out] = made if made is not None else self.add("transpose", (base,), {"perm": perm}, old=op)
            return
        self.value[out] = base  # no op: its consumers read the base
        if self.lazy[out].perm is None and base.index == 0:
            self.aliases[op.name] = base.op.name

    def emit_elementwise(self, op: Operation) -> None:
        perm = self.lazy[op.outputs[0]].perm
        n = len(op.outputs[0].shape)
        inputs = []
        for t in op.inputs:
            state = self.lazy.get(t)
            inputs.append(self.value[t] if state is not None and state.perm is not None else self.aligned(t, perm, n))
        self.value[op.outputs[0]] = self.add(op.type, tuple(inputs), op.attrs, old=op)

    def aligned(self, t: Tensor, perm: tuple, n: int) -> Tensor:
        """Small operand ``t`` laid out like the bases: padded to ``n`` axes, axes permuted by ``perm``'s inverse."""
        value = self.read(t)
        if not t.shape:
            return value
        key = ("aligned", t, perm)
        if key in self.cache:
            return self.cache[key]
        padded = (1,) * (n - len(t.shape)) + tuple(t.shape)
        inverse = _inverse(perm)
        target = tuple(padded[i] for i in inverse)
        name = f"{t.op.name}/aligned"
        if _in_order([i for i in inverse if padded[i] != 1]):
            aligned = value if target == tuple(t.shape) else self.add("reshape", (value,), {"shape": target}, name=name)
        else:
            if padded != tuple(t.shape):
                value = self.add("reshape", (value,), {"shape": padded}, name=name)
            aligned = self.add("transpose", (value,), {"perm": inverse}, name=name)
        self.cache[key] = aligned
        return aligned

    def emit_reduction(self, op: Operation) -> None:
        x = op.inputs[0]
        perm = self.lazy[x].perm
        attrs = dict(op.attrs)
        if attrs["axis"] is not None:
            attrs["axis"] = tuple(sorted(perm[i] for i in rules.axes_tuple(attrs["axis"], len(perm))))
        self.value[op.outputs[0]] = self.add(op.type, (self.value[x],), attrs, old=op)

    def emit_reduce_to_like(self, op: Operation) -> None:
        g, like = op.inputs
        axes = _bias_axes(g.shape, like.shape, self.lazy[g].perm)
        attrs = {"axis": axes, "keepdims": False}
        summed = rules.reduced_shape(self.value[g].shape, axes, False)
        if summed == tuple(like.shape):
            self.value[op.outputs[0]] = self.add("sum", (self.value[g],), attrs, old=op)
            return
        summed = self.add("sum", (self.value[g],), attrs, name=f"{op.name}/sum")
        self.value[op.outputs[0]] = self.add("reshape", (summed,), {"shape": tuple(like.shape)}, old=op)
