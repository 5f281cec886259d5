"""``cond``: one of two sub-graphs, chosen at run time by a bool scalar; only that one runs."""

from __future__ import annotations

from workbench import ops
from workbench.errors import DTypeError, ShapeError
from workbench.graph.control import (
    Body,
    BodyGraph,
    as_body_tensors,
    clone,
    graph_for,
    merged,
    placeholder_in,
    same_spec,
    spec_text,
    where,
)
from workbench.graph.core import Tensor
from workbench.graph.gradients import gradients
from workbench.graph.tree import describe, flatten, unflatten
from workbench.ops import rules
from workbench.ops.registry import apply, defop, is_float


def cond(pred, true_fn, false_fn, name=None):
    """``true_fn()`` if ``pred`` else ``false_fn()``, decided when the graph runs; only that branch runs.

    Parameters
    ----------
    pred : Tensor or bool
        A bool scalar. A Python bool picks the branch now (the other is never built).
    true_fn, false_fn : callable
        Called once each, without arguments, to build the branches. They return the same
        structure (a tensor, or a tuple or list of them) with the same dtypes and ranks.
        Tensors from outside that they use are inputs of the op; gradients flow to them
        through the branch that ran.

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=())
    ...     y = wb.cond(x > 0, lambda: x * 2.0, lambda: -x)
    >>> sess = wb.Session(g)
    >>> float(sess.run(y, {x: 3.0})), float(sess.run(y, {x: -4.0}))
    (6.0, 4.0)
    """
    if isinstance(pred, bool):
        return true_fn() if pred else false_fn()
    label = name or "cond"
    graph = graph_for(pred)
    branches, trees = [], []
    for kind, fn in (("true", true_fn), ("false", false_fn)):
        body = BodyGraph(f"{label}/{kind}", graph, "cond")
        with body.as_default():
            flat, tree = flatten(fn())
            outputs = as_body_tensors(body, flat, f"cond {label!r}: {kind}_fn's results")
        branches.append((body, outputs))
        trees.append(tree)
    if trees[0] != trees[1]:
        raise ShapeError(
            f"cond {label!r}: true_fn returns {describe(trees[0])} but false_fn returns {describe(trees[1])}{where()}"
        )
    if not branches[0][1]:
        raise ShapeError(f"cond {label!r}: the branches return nothing{where()}")
    operands = list(branches[0][0].captured) + [t for t in branches[1][0].captured if t not in branches[0][0].captured]
    bodies = [_body(body, operands, outputs) for body, outputs in branches]
    outs = apply("cond", pred, *operands, true_body=bodies[0], false_body=bodies[1], name=name)
    return unflatten(trees[0], outs if isinstance(outs, tuple) else (outs,))


def _body(body: BodyGraph, operands, outputs) -> Body:
    """A branch taking every operand (a placeholder for each one it did not use)."""
    inputs = [body.capture(t).op.name for t in operands]
    return Body(body, inputs, [t.name for t in outputs])


# -- the registry entry -------------------------------------------------------------------------


def _cond_spec(pred, *operands, true_body, false_body):
    if pred.dtype != "bool" or (pred.shape is not None and pred.shape != ()):
        shape = "any shape" if pred.shape is None else rules.fmt(pred.shape)
        raise DTypeError(f"pred must be a bool scalar, got {shape} {pred.dtype}")
    for label, body in (("true", true_body), ("false", false_body)):
        got = body.input_specs
        if len(got) != len(operands) or not all(map(same_spec, got, operands)):
            raise ShapeError(f"the {label} branch takes {[spec_text(s) for s in got]}, the op gives "
                             f"{[spec_text(s) for s in operands]}")  # fmt: skip
    a, b = true_body.output_specs, false_body.output_specs
    if len(a) != len(b):
        raise ShapeError(f"true_fn returns {len(a)} tensors but false_fn returns {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if not same_spec(x, y):
            raise ShapeError(
                f"output {i} is {spec_text(x)} in true_fn but {spec_text(y)} in false_fn; "
                "both branches must return the same dtypes and shapes"
            )
    return tuple(merged(x, y) for x, y in zip(a, b))


def _cond_kernel(xp, pred, *operands, true_body, false_body, plans=None):
    taken = bool(pred)  # on a GPU, one device-to-host read
    if plans:
        plan = plans[0] if taken else plans[1]
    else:
        plan = (true_body if taken else false_body).compile(xp)
    out = plan.run(list(operands))
    return out[0] if len(out) == 1 else tuple(out)


def _cond_grad(op, *grads):
    pred, operands = op.inputs[0], op.inputs[1:]
    wanted = [i for i, g in enumerate(grads) if g is not None and is_float(op.outputs[i].dtype)]
    floats = [k for k, t in enumerate(operands) if is_float(t.dtype)]
    if not wanted or not floats:
        return [None] * len(op.inputs)
    bodies = []
    for label in ("true", "false"):
        body = op.attrs[f"{label}_body"]
        grad_body = BodyGraph(f"{op.name}/grad_{label}", op.graph, "cond")
        with grad_body.as_default():
            held = [placeholder_in(grad_body, f"operand_{k}", t.spec) for k, t in enumerate(operands)]
            g_out = [placeholder_in(grad_body, f"g_{i}", op.outputs[i].spec) for i in wanted]
            with grad_body.name_scope("forward"):
                outs = clone(body, grad_body, held)
            xs = [held[k] for k in floats]
            found = gradients([outs[i] for i in wanted], xs, grad_ys=g_out)
            found = [ops.zeros_like(x) if d is None else d for x, d in zip(xs, found)]
        bodies.append(Body(grad_body, [t.op.name for t in held + g_out], [t.name for t in found]))
    outs = apply("cond", pred, *operands, *(grads[i] for i in wanted), true_body=bodies[0], false_body=bodies[1])
    outs = outs if isinstance(outs, tuple) else (outs,)
    result: list[Tensor | None] = [None] * len(op.inputs)
    for pos, k in enumerate(floats):
        result[1 + k] = outs[pos]
    return result


defop(
    "cond",
    infer=_cond_spec,
    kernel=_cond_kernel,
    grad=_cond_grad,
    variadic=True,
    checks_values=True,  # reads pred on the host: never captured in a CUDA graph
    bodies=("true_body", "false_body"),
)
