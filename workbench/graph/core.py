"""The graph IR: :class:`Graph`, :class:`Operation`, :class:`Tensor` and :class:`Variable`.

Op functions (``wb.matmul`` ...) add operations to the graph of their inputs,
or to the default graph. Each operation is checked by its op's shape rule when
it is created, and remembers the user's source line that created it.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
import uuid
import types
from typing import Any
from collections.abc import Iterator, Mapping

import numpy as np

from workbench import ops
from workbench.errors import DTypeError, GraphError, ShapeError
from workbench.graph import precision
from workbench.graph.default_session import running_session
from workbench.graph.records import Source, TrainingRecord
from workbench.graph.serialize import graph_from_json, graph_to_json
from workbench.ops import registry, rules
from workbench.ops.registry import TensorSpec

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_source() -> Source | None:
    """The innermost calling frame outside the workbench package."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back
    if frame is None:
        return None
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    return Source(filename, lineno, linecache.getline(filename, lineno, frame.f_globals).strip())


class Tensor:
    """The output of an operation: a static shape (``None`` for unknown sizes) and a dtype.

    Tensors hash and compare by identity (use :func:`wb.equal` for elementwise
    equality), so they can be keys of a ``feed_dict``.
    """

    __slots__ = ("op", "index", "shape", "dtype")
    __array_priority__ = 100  # ``ndarray + tensor`` calls ``tensor.__radd__``

    def __init__(self, op: Operation, index: int, spec: TensorSpec):
        self.op, self.index = op, index
        self.shape = None if spec.shape is None else tuple(spec.shape)
        self.dtype = spec.dtype

    @property
    def name(self) -> str:
        return self.op.name if self.index == 0 else f"{self.op.name}:{self.index}"

    @property
    def graph(self) -> Graph:
        return self.op.graph

    @property
    def spec(self) -> TensorSpec:
        return TensorSpec(self.shape, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def T(self) -> Tensor:
        return ops.transpose(self)

    def __repr__(self) -> str:
        shape = "unknown" if self.shape is None else rules.fmt(self.shape)
        return f"<Tensor {self.name!r} shape={shape} dtype={self.dtype}>"

    def eval(self, feed_dict=None, session=None):
        """This tensor's value, computed by ``session`` or the default session
        (``with sess.as_default():``, ``with wb.Session(g) as sess:``, an ``InteractiveSession``)."""
        return running_session(session, f"tensor {self.name!r}.eval()").run(self, feed_dict=feed_dict)

    def __bool__(self) -> bool:
        raise GraphError(
            f"the truth value of tensor {self.name!r} is not known until the graph runs "
            "(Python's max(a, b) and min(a, b) compare their arguments: write wb.maximum(a, b) or wb.minimum(a, b); "
            "for a choice, wb.where(condition, a, b))"
        )

    def __iter__(self):
        raise GraphError(
            f"tensor {self.name!r} cannot be iterated over; index it instead. Python's sum, max, min, all and any "
            f"iterate over their argument: for a reduction write reduce_sum({_short_name(self)}, axis=...) "
            "(reduce_max, reduce_min, reduce_all, reduce_any), or wb.sum, wb.max, wb.min, wb.all"
        )

    def __len__(self) -> int:
        if self.shape is None or not self.shape or self.shape[0] is None:
            raise GraphError(f"the length of tensor {self.name!r} is not known until the graph runs")
        return self.shape[0]

    def __getitem__(self, index):
        if isinstance(index, Tensor):
            return ops.gather(self, index)
        return ops.getitem(self, index)

    __add__ = lambda a, b: ops.add(a, b)  # noqa: E731
    __radd__ = lambda a, b: ops.add(b, a)  # noqa: E731
    __sub__ = lambda a, b: ops.subtract(a, b)  # noqa: E731
    __rsub__ = lambda a, b: ops.subtract(b, a)  # noqa: E731
    __mul__ = lambda a, b: ops.multiply(a, b)  # noqa: E731
    __rmul__ = lambda a, b: ops.multiply(b, a)  # noqa: E731
    __truediv__ = lambda a, b: ops.divide(a, b)  # noqa: E731
    __rtruediv__ = lambda a, b: ops.divide(b, a)  # noqa: E731
    __matmul__ = lambda a, b: ops.matmul(a, b)  # noqa: E731
    __rmatmul__ = lambda a, b: ops.matmul(b, a)  # noqa: E731
    __pow__ = lambda a, b: ops.pow(a, b)  # noqa: E731
    __rpow__ = lambda a, b: ops.pow(b, a)  # noqa: E731
    __neg__ = lambda a: ops.negative(a)  # noqa: E731
    __abs__ = lambda a: ops.abs(a)  # noqa: E731
    __lt__ = lambda a, b: ops.less(a, b)  # noqa: E731
    __le__ = lambda a, b: ops.less_equal(a, b)  # noqa: E731
    __gt__ = lambda a, b: ops.greater(a, b)  # noqa: E731
    __ge__ = lambda a, b: ops.greater_equal(a, b)  # noqa: E731


def _short_name(t: Tensor) -> str:
    return t.name.rsplit("/", 1)[-1].partition(":")[0]


class Variable(Tensor):
    """A tensor whose value a session keeps between runs.

    ``wb.Variable(initial_value, name=None, trainable=True, dtype=None)`` creates one
    in the default graph, as TensorFlow 1.x does: ``initial_value`` is a number, an
    array or a constant tensor (``wb.constant``, ``workbench.tf1.zeros`` ...), and
    the name defaults to ``"Variable"`` (``"Variable_1"`` ... when taken). See also
    :func:`wb.variable`, which takes a name and an initializer.
    """

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        if args and isinstance(args[0], Operation):  # the graph builder's (op, index, spec)
            return super().__new__(cls)
        return _new_variable(*args, **kwargs)

    def __init__(self, *args, **kwargs):
        if args and isinstance(args[0], Operation):
            super().__init__(*args)

    @property
    def trainable(self) -> bool:
        return self.op.attrs["trainable"]

    @property
    def init(self):
        return self.op.attrs["init"]

    def __repr__(self) -> str:
        return f"<Variable {self.name!r} shape={rules.fmt(self.shape)} dtype={self.dtype}>"


class Operation:
    """A node of the graph: an op type, input tensors, static attributes and output tensors."""

    __slots__ = ("graph", "name", "type", "inputs", "attrs", "outputs", "control_inputs", "source", "index")

    def __init__(self, graph, name, type, inputs, attrs, control_inputs, source, index):  # noqa: A002
        self.graph, self.name, self.type = graph, name, type
        self.inputs: tuple[Tensor, ...] = tuple(inputs)
        self.attrs: dict[str, Any] = attrs
        self.control_inputs: tuple[Operation, ...] = tuple(control_inputs)
        self.source: Source | None = source
        self.index = index  # position in graph.operations: a topological order
        self.outputs: tuple[Tensor, ...] = ()

    @property
    def opdef(self) -> registry.OpDef:
        return registry.REGISTRY[self.type]

    def __repr__(self) -> str:
        return f"<Operation {self.name!r} type={self.type}>"

    def run(self, feed_dict=None, session=None) -> None:
        """Run this operation in ``session`` or the default session (see :meth:`Tensor.eval`)."""
        running_session(session, f"operation {self.name!r}.run()").run(self, feed_dict=feed_dict)


class Graph:
    """A dataflow graph. Build it inside ``with g.as_default():``.

    >>> import workbench as wb
    >>> g = wb.Graph(name="demo")
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None, 3))
    ...     y = wb.sum(x * 2.0, axis=1)
    >>> y.shape
    (None,)
    """

    #: The graph a control-flow body is built inside (see :mod:`workbench.graph.control`); None for a graph.
    parent: Graph | None = None

    def __init__(self, name: str = "graph"):
        self.name = name
        self.operations: list[Operation] = []
        self._by_name: dict[str, Operation] = {}
        self._aliases: dict[str, str] = {}
        self._scopes: list[str] = []
        self._control: list[list[Operation]] = []
        self.version = 0  # grows with every change; sessions compile plans per version
        self.token = f"graph-{uuid.uuid4().hex[:12]}"  # identity in events (never reused, unlike id())
        # update-op name -> how an optimizer built that update (distributed training splits by it)
        self.training: dict[str, TrainingRecord] = {}
        # state-update op name -> the tensor it accompanies (batch norm's moving statistics): an
        # optimizer's minimize(loss) runs the updates of the tensors its loss depends on
        self.updates: dict[str, str] = {}
        self.replaced_by: str | None = None  # how a newer graph took this one's place (see replaced())

    def replaced(self, how: str) -> None:
        """Record that a new graph took this one's place (``how``: e.g. ``"re-running %%flow mlp"``),
        so a session still running this graph, given the new graph's tensors, says so."""
        self.replaced_by = how

    def foreign(self, item: str, other: Graph) -> str:
        """Why ``item`` (e.g. ``"'loss'"``) of graph ``other`` cannot be used with this graph's session."""
        message = f"{item} belongs to graph {other.name!r}, not this session's {self.name!r}"
        stale = self if self.replaced_by else other if other.replaced_by else None
        if stale is not None:
            message = (
                f"the graph {stale.name!r} was rebuilt by {stale.replaced_by}; create a new Session "
                f"({message}: a tensor of the {'new' if stale is self else 'old'} graph)"
            )
        return message

    # -- context --------------------------------------------------------------------
    @contextlib.contextmanager
    def as_default(self) -> Iterator[Graph]:
        """Make this the graph that op functions add to, inside the ``with`` block."""
        _stack().append(self)
        try:
            yield self
        finally:
            _stack().pop()

    @contextlib.contextmanager
    def name_scope(self, name: str) -> Iterator[str]:
        """Prefix the names of operations created inside with ``name/``."""
        _check_name(name)
        self._scopes.append(name)
        try:
            yield "/".join(self._scopes)
        finally:
            self._scopes.pop()

    @contextlib.contextmanager
    def control_dependencies(self, deps) -> Iterator[None]:
        """Operations created inside run only after ``deps`` (tensors or operations)."""
        self._control.append([_as_op(d) for d in deps])
        try:
            yield
        finally:
            self._control.pop()

    # -- building -------------------------------------------------------------------
    def unique_name(self, base: str) -> str:
        name = "/".join(self._scopes + [base])
        if not self._taken(name):
            return name
        i = 1
        while self._taken(f"{name}_{i}"):
            i += 1
        return f"{name}_{i}"

    def _taken(self, name: str) -> bool:
        # alias names (left by passes) stay reserved so that lookups stay unambiguous
        return name in self._by_name or name in self._aliases

    def resolve(self, name: str) -> str:
        """The op name that ``name`` refers to: itself, or the target of an alias (chains followed)."""
        for _ in range(len(self._aliases) + 1):
            if name in self._by_name or name not in self._aliases:
                return name
            name = self._aliases[name]
        return name

    @property
    def aliases(self) -> Mapping[str, str]:
        """Names of ops that passes removed (merged, folded, fused) to the op that now stands
        for each (read-only; see :meth:`set_aliases`)."""
        return types.MappingProxyType(self._aliases)

    def set_aliases(self, aliases: Mapping[str, str]) -> None:
        """Replace the aliases (what a pass does for the graph it builds): chains are followed,
        and only aliases that end at an op of this graph, and shadow none, are kept."""
        self._aliases = dict(aliases)
        resolved = {a: self.resolve(a) for a in aliases if a not in self._by_name}
        self._aliases = {a: t for a, t in resolved.items() if t in self._by_name}

    def add_op(self, op_type: str, inputs, attrs: dict, name: str | None = None, control_inputs=(), source=None):
        """Add an operation after checking it with its op's shape rule; returns the Operation."""
        opdef = registry.get_op(op_type)
        if name is not None:
            _check_name(name)
        scoped = self.unique_name(name or op_type)
        wanted = "/".join(self._scopes + [name or op_type])
        if op_type in ("placeholder", "variable") and scoped != wanted:
            raise GraphError(f"graph {self.name!r} already has an operation named {wanted!r}")
        for t in inputs:
            if t.graph is not self:
                raise GraphError(
                    f"{op_type} {scoped!r}: input {t.name!r} belongs to graph {t.graph.name!r}, not {self.name!r}"
                )
            if self._by_name.get(t.op.name) is not t.op:
                raise GraphError(
                    f"{op_type} {scoped!r}: input {t.name!r} was the initial value of a Variable and is no longer "
                    "in the graph; create the constant again"
                )
        try:
            specs = opdef.infer(*(t.spec for t in inputs), **attrs)
            specs = (specs,) if isinstance(specs, TensorSpec) else tuple(specs)
            for spec in specs:
                rules.check_elements(spec.shape)
        except (ShapeError, DTypeError) as e:
            where = f"\n  {source}" if source else ""
            raise type(e)(f"{op_type} {scoped!r}: {e}{where}") from None
        deps = [d for frame in self._control for d in frame] + list(control_inputs)
        op = Operation(self, scoped, op_type, inputs, attrs, _unique(deps), source, len(self.operations))
        cls = Variable if op_type == "variable" else Tensor
        op.outputs = tuple(cls(op, i, spec) for i, spec in enumerate(specs))
        self.operations.append(op)
        self._by_name[scoped] = op
        self.version += 1
        return op

    def discard(self, op: Operation) -> bool:
        """Remove ``op`` if it is the newest operation and a constant (nothing can use it yet);
        returns whether it did. ``wb.Variable(wb.constant(...))`` keeps only the variable."""
        if not self.operations or self.operations[-1] is not op or op.type != "constant":
            return False
        self.operations.pop()
        del self._by_name[op.name]
        self.version += 1
        return True

    # -- lookup ---------------------------------------------------------------------
    def get(self, name: str) -> Tensor | Operation:
        """The tensor (``"name"`` or ``"name:i"``) or operation (an op without outputs) of that name."""
        if not isinstance(name, str):
            raise GraphError(f"expected a name, got {name!r}")
        base, _, index = name.partition(":")
        base = self.resolve(base)
        op = self._by_name.get(base)
        if op is None:
            raise GraphError(f"graph {self.name!r} has no tensor or operation named {name!r}")
        if not op.outputs and not index:
            return op
        i = int(index) if index.isdigit() else 0 if not index else -1
        if not 0 <= i < len(op.outputs):
            raise GraphError(f"operation {base!r} has no output {index!r}")
        return op.outputs[i]

    def operation(self, name: str) -> Operation:
        op = self._by_name.get(self.resolve(name))
        if op is None:
            raise GraphError(f"graph {self.name!r} has no operation named {name!r}")
        return op

    def __contains__(self, name: str) -> bool:
        return self.resolve(name) in self._by_name

    @property
    def variables(self) -> list[Variable]:
        return [op.outputs[0] for op in self.operations if op.type == "variable"]

    @property
    def trainable_variables(self) -> list[Variable]:
        return [v for v in self.variables if v.trainable]

    @property
    def placeholders(self) -> list[Tensor]:
        return [op.outputs[0] for op in self.operations if op.type == "placeholder"]

    def __len__(self) -> int:
        return len(self.operations)

    def summary(self, print_fn=print) -> str | None:
        """Print (with ``print_fn``; None: return it) a table of parameters per top-level name scope and
        in total: trained parameters, and the other values variables hold (optimizer slots, counters)."""
        from workbench.graph.summary import summary_text

        text = summary_text(self)
        if print_fn is None:
            return text
        print_fn(text)
        return None

    def __repr__(self) -> str:
        return f"<Graph {self.name!r} with {len(self.operations)} operations>"

    # -- files ----------------------------------------------------------------------
    def to_json(self, indent: int | None = None) -> str:
        """The graph as versioned JSON, initial values included (see :mod:`workbench.graph.serialize`)."""
        return graph_to_json(self, indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """Rebuild a graph from :meth:`to_json` output; never executes code from the file."""
        return graph_from_json(text, cls)


def _check_name(name: str) -> None:
    if (
        not isinstance(name, str)
        or not name
        or ":" in name
        or name.startswith("/")
        or name.endswith("/")
        or "\0" in name
    ):
        raise GraphError(f"invalid name {name!r}: use a non-empty string without ':', NUL or a leading or trailing '/'")


def _unique(ops_: list[Operation]) -> list[Operation]:
    seen, out = set(), []
    for op in ops_:
        if id(op) not in seen:
            seen.add(id(op))
            out.append(op)
    return out


def _as_op(x) -> Operation:
    if isinstance(x, Operation):
        return x
    if isinstance(x, Tensor):
        return x.op
    raise GraphError(f"expected a tensor or an operation, got {x!r}")


# -- default graph ----------------------------------------------------------------------

_local = threading.local()
_global_default = Graph(name="default")


def _stack() -> list[Graph]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def get_default_graph() -> Graph:
    """The graph op functions add to outside any ``with g.as_default():`` block."""
    stack = _stack()
    return stack[-1] if stack else _global_default


def reset_default_graph() -> Graph:
    """Replace the global default graph with an empty one and return it."""
    global _global_default
    if _stack():
        raise GraphError("cannot reset the default graph inside a 'with graph.as_default()' block")
    _global_default = Graph(name="default")
    return _global_default


# -- the builder that op functions call -------------------------------------------------


def _to_tensor(value, graph: Graph, like: str | None, source) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, Operation):
        raise GraphError(f"operation {value.name!r} has no output to use as an input")
    if isinstance(value, (bool, np.bool_)):
        dtype = "bool"
    elif isinstance(value, (int, float, np.number)) and not isinstance(value, np.ndarray):
        is_int = isinstance(value, (int, np.integer))
        if like is not None and (is_int or registry.is_float(like)):
            dtype = like  # Python numbers take the dtype of the tensors they meet
        else:
            dtype = "int64" if is_int else "float32"
    else:
        dtype = None
    try:
        value = ops.state.constant_array(value, dtype)
    except (TypeError, ValueError) as e:
        raise DTypeError(f"cannot turn {type(value).__name__} into a tensor: {e}") from None
    return graph.add_op("constant", (), {"value": value}, source=source).outputs[0]


def build(op_type: str, inputs, attrs: dict, name: str | None):
    """Add an op to the graph of its tensor inputs (or the default graph)."""
    current = get_default_graph()
    if current.parent is not None:  # a control-flow body: tensors of enclosing graphs become its inputs
        inputs = tuple(current.capture(t) if isinstance(t, Tensor) and t.graph is not current else t for t in inputs)
    graphs = {id(t.graph): t.graph for t in inputs if isinstance(t, Tensor)}
    if len(graphs) > 1:
        names = ", ".join(repr(g.name) for g in graphs.values())
        raise GraphError(f"{op_type}: inputs come from different graphs ({names})")
    graph = next(iter(graphs.values())) if graphs else get_default_graph()
    check_default(graph, op_type, inputs)
    source = user_source()
    like = next((t.dtype for t in inputs if isinstance(t, Tensor) and t.dtype != "bool"), None)
    tensors = tuple(_to_tensor(v, graph, like, source) for v in inputs)
    tensors = precision.cast_inputs(op_type, tensors)  # inside ``wb.mixed_precision``
    op = graph.add_op(op_type, tensors, attrs, name, source=source)
    if len(op.outputs) == 1:
        return op.outputs[0]
    return op.outputs if op.outputs else op


def check_default(graph: Graph, what: str, inputs=()) -> None:
    """GraphError if a ``with g.as_default():`` block (or a ``%%flow`` cell) of another graph is
    open: an op on ``graph``'s tensors would silently land in ``graph``, not the one being built."""
    stack = _stack()
    if stack and stack[-1] is not graph:
        tensor = next((t for t in inputs if isinstance(t, (Tensor, Operation)) and t.graph is graph), None)
        label = f"{tensor.name!r} belongs to" if tensor is not None else "its inputs belong to"
        raise GraphError(
            f"{what}: {label} graph {graph.name!r}, but graph {stack[-1].name!r} is being built; "
            "tensors must be from the same graph"
        )


registry.bind_builder(build)


def group(*inputs, name: str | None = None) -> Operation:
    """An operation that runs all of ``inputs`` (tensors or operations) and outputs nothing."""
    deps = [_as_op(x) for x in inputs]
    graph = deps[0].graph if deps else get_default_graph()
    check_default(graph, "group", deps)
    return graph.add_op("no_op", (), {}, name or "group", control_inputs=deps, source=user_source())


def name_scope(name: str):
    """``with wb.name_scope("layer1"):`` prefixes op names in the default graph."""
    return get_default_graph().name_scope(name)


def _new_variable(initial_value=None, trainable=True, name=None, dtype=None, **unsupported):
    """``wb.Variable(initial_value, ...)``: a variable initialized from a number, an array or a
    constant tensor (whose constant op is dropped when nothing else used it)."""
    if unsupported:
        raise GraphError(f"Variable() does not take {', '.join(sorted(unsupported))}")
    if initial_value is None:
        raise GraphError("Variable() needs an initial value (a number, an array or a constant tensor)")
    graph = initial_value.graph if isinstance(initial_value, Tensor) else get_default_graph()
    value = initial_value
    if isinstance(initial_value, Tensor):
        if initial_value.op.type != "constant":
            raise GraphError(
                f"Variable(): the initial value {initial_value.name!r} is a {initial_value.op.type} op, not a "
                "constant; give an array, a number or a constant tensor (workbench.tf1.truncated_normal is one)"
            )
        value = initial_value.op.attrs["value"]
        graph.discard(initial_value.op)
    array = ops.state.constant_array(value, dtype)
    base = name if name is not None else _free_name(graph, "Variable")
    return ops.variable(base, init=array, dtype=array.dtype.name, trainable=trainable)


def _free_name(graph: Graph, base: str) -> str:
    """``base`` or ``base_1`` ...: the first name not taken inside the open name scopes."""
    taken = graph.unique_name(base)
    return taken.rsplit("/", 1)[-1]
