"""``scan``: a loop over the leading axis of tensors, as one op with a compiled body.

The op's inputs are the initial carries, the sequences and the tensors the body
captured; its outputs the final carries, the stacked per-step outputs and, hidden,
the carries at the start of every step (what the gradient reads back).
"""

from __future__ import annotations

from workbench import ops
from workbench.errors import ShapeError
from workbench.graph.control import (
    Body,
    BodyGraph,
    as_body_tensors,
    as_tensors,
    clone,
    graph_for,
    placeholder_in,
    same_spec,
    spec_text,
    where,
)
from workbench.graph.tree import describe, flatten, unflatten
from workbench.ops.registry import TensorSpec, apply, defop, is_float


def scan(fn, xs, init, length=None, reverse=False, name=None):
    """Loop ``fn(carry, x) -> (carry, y)`` over the leading axis of ``xs``, as ``jax.lax.scan``.

    Parameters
    ----------
    fn : callable
        Called once, to build the body: ``carry`` has the structure of ``init`` and ``x``
        that of ``xs`` (one slice of each tensor). It returns the new carry, with the
        shapes and dtypes of ``init``, and ``y``: a tensor, a tuple or list of them, or None.
        Tensors from outside that ``fn`` uses (weights) are inputs of the loop;
        gradients flow to them, through every step.
    xs : Tensor, tuple or list of tensors, or None
        Sequences of the same length along axis 0; None with ``length``.
    init : Tensor, tuple or list of tensors (or numbers)
        The initial carry.
    length : int, optional
        The number of steps, when there is nothing to scan over.
    reverse : bool
        Run from the last step to the first (``ys`` stay in the order of ``xs``).

    Returns
    -------
    (final_carry, ys)
        The carry after the last step, and the ``y`` of every step stacked along a new axis 0.

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     total, running = wb.scan(lambda c, x: (c + x, c + x), wb.constant([1.0, 2.0, 3.0]), wb.constant(0.0))
    >>> [v.tolist() for v in wb.Session(g).run([total, running])]
    [6.0, [1.0, 3.0, 6.0]]
    """
    flat_xs, xs_tree = flatten(xs)
    flat_init, init_tree = flatten(init)
    graph = graph_for(*flat_xs, *flat_init)
    label = name or "scan"
    flat_xs, flat_init = as_tensors(graph, flat_xs), as_tensors(graph, flat_init)
    body = BodyGraph(f"{label}/body", graph, "scan")
    with body.as_default():
        carry = [placeholder_in(body, f"carry_{i}", t.spec) for i, t in enumerate(flat_init)]
        x = [placeholder_in(body, f"x_{i}", _step_spec(t, label, i)) for i, t in enumerate(flat_xs)]
        result = fn(unflatten(init_tree, carry), unflatten(xs_tree, x))
        if not isinstance(result, (tuple, list)) or len(result) != 2:
            raise ShapeError(f"scan {label!r}: fn must return (carry, y), got {type(result).__name__}{where()}")
        flat_carry, carry_tree = flatten(result[0])
        if carry_tree != init_tree:
            raise ShapeError(
                f"scan {label!r}: fn returns a carry structured as {describe(carry_tree)}, but init is "
                f"{describe(init_tree)}{where()}"
            )
        flat_y, y_tree = flatten(result[1])
        outputs = as_body_tensors(body, flat_carry + flat_y, f"scan {label!r}: the carry and y")
    captured = list(body.captured)
    inputs = [t.op.name for t in carry + x] + [body.captured[t].op.name for t in captured]
    steps = None if length is None else int(length)
    outs = apply(
        "scan",
        *flat_init,
        *flat_xs,
        *captured,
        body=Body(body, inputs, [t.name for t in outputs]),
        carries=len(flat_init),
        sequences=len(flat_xs),
        reverse=bool(reverse),
        length=steps,
        name=name,
    )
    outs = outs if isinstance(outs, tuple) else (outs,)
    n = len(flat_init)
    return unflatten(init_tree, outs[:n]), unflatten(y_tree, outs[n : n + len(flat_y)])


def _step_spec(t, label, i) -> TensorSpec:
    if not t.shape:
        raise ShapeError(
            f"scan {label!r}: sequence {i} ({spec_text(t.spec)}) has no leading axis to scan over{where()}"
        )
    return TensorSpec(t.shape[1:], t.dtype)


# -- the registry entry -------------------------------------------------------------------------


def _scan_spec(*specs, body, carries, sequences, reverse, length, seed_scope=None):
    init, xs, captured = specs[:carries], specs[carries : carries + sequences], specs[carries + sequences :]
    steps = length
    if length is not None and length < 0:
        raise ShapeError(f"length must not be negative, got {length}")
    for i, x in enumerate(xs):
        if not x.shape:
            raise ShapeError(f"sequence {i} ({spec_text(x)}) has no leading axis to scan over")
        n = x.shape[0]
        if steps is not None and n is not None and n != steps:
            raise ShapeError(f"sequence {i} has {n} steps, but {'length' if i == 0 else 'sequence 0'} says {steps}")
        steps = n if steps is None else steps
    if not xs and length is None:
        raise ShapeError("needs sequences to scan over or a length")
    expected = [*init, *(TensorSpec(x.shape[1:], x.dtype) for x in xs), *captured]
    got = body.input_specs
    if len(got) != len(expected) or not all(map(same_spec, got, expected)):
        raise ShapeError(
            f"the body takes {[spec_text(s) for s in got]}, the op gives {[spec_text(s) for s in expected]}"
        )
    outs = body.output_specs
    if len(outs) < carries:
        raise ShapeError(f"the body returns {len(outs)} tensors, fewer than the {carries} carries")
    for i in range(carries):
        if not same_spec(outs[i], init[i]):
            raise ShapeError(
                f"carry {i} is {spec_text(init[i])} at the start of a step but {spec_text(outs[i])} at its end; "
                "fn must return each carry with the shape and dtype it was given"
            )
    stacked = [TensorSpec(None if s.shape is None else (steps, *s.shape), s.dtype) for s in outs[carries:]]
    history = [TensorSpec(None if s.shape is None else (steps, *s.shape), s.dtype) for s in init]
    return (*init, *stacked, *history)


def _scan_kernel(xp, *arrays, body, carries, sequences, reverse, length, seed_scope=None, plans=None):
    run = (plans[0] if plans else body.cached(xp)).run
    carry = list(arrays[:carries])
    xs, captured = arrays[carries : carries + sequences], list(arrays[carries + sequences :])
    steps = xs[0].shape[0] if xs else length
    if steps == 0:
        specs = body.output_specs[carries:] + body.input_specs[:carries]
        result = (*carry, *(_empty(xp, s) for s in specs))
        return result[0] if len(result) == 1 else result
    ys = history = None  # (steps, ...) arrays, made at the first step and written one step at a time
    for t in reversed(range(steps)) if reverse else range(steps):
        out = run([*carry, *(x[t, ...] for x in xs), *captured])
        if ys is None:
            ys = [_stacked(xp, steps, y) for y in out[carries:]]
            history = [_stacked(xp, steps, c) for c in carry]
        for stack, value in zip(history, carry, strict=True):
            stack[t, ...] = value
        for i in range(carries):  # a dimension the graph left open (None) must not change either
            if out[i].shape != carry[i].shape:  # raised as the op's ExecutionError, with the user's line
                raise ValueError(
                    f"carry {i} has shape {tuple(carry[i].shape)} at the start of step {t} but "
                    f"{tuple(out[i].shape)} at its end; fn must return each carry with the shape it was given"
                )
        carry = out[:carries]
        for stack, value in zip(ys, out[carries:], strict=True):
            stack[t, ...] = value
    result = (*carry, *ys, *history)
    return result[0] if len(result) == 1 else result


def _stacked(xp, steps: int, like):
    like = xp.asarray(like)
    return xp.empty((steps, *like.shape), dtype=like.dtype)


def _empty(xp, spec: TensorSpec):
    if spec.shape is None or None in spec.shape:
        raise ValueError("a scan of 0 steps needs outputs of known shapes")
    return xp.zeros((0, *spec.shape), dtype=getattr(xp, spec.dtype))


def _scan_grad(op, *grads):
    a, body = op.attrs, op.attrs["body"]
    nc, ns = a["carries"], a["sequences"]
    ny = len(body.outputs) - nc
    init, xs, caps = op.inputs[:nc], op.inputs[nc : nc + ns], op.inputs[nc + ns :]
    final, ys, hist = op.outputs[:nc], op.outputs[nc : nc + ny], op.outputs[nc + ny :]
    g_final, g_ys, g_hist = grads[:nc], grads[nc : nc + ny], grads[nc + ny :]
    fc = [i for i in range(nc) if is_float(init[i].dtype)]
    fy = [j for j in range(ny) if g_ys[j] is not None and is_float(ys[j].dtype)]
    fx = [i for i in range(ns) if is_float(xs[i].dtype)]
    fk = [i for i in range(len(caps)) if is_float(caps[i].dtype)]
    fh = [i for i in fc if g_hist[i] is not None]
    step = lambda t: TensorSpec(None if t.shape is None else t.shape[1:], t.dtype)  # noqa: E731
    bw = BodyGraph(f"{op.name}/grad_body", op.graph, "scan")
    with bw.as_default():
        g_carry = [placeholder_in(bw, f"g_carry_{i}", init[i].spec) for i in fc]
        acc = [placeholder_in(bw, f"g_captured_{i}", caps[i].spec) for i in fk]
        x_t = [placeholder_in(bw, f"x_{i}", step(xs[i])) for i in range(ns)]
        c_t = [placeholder_in(bw, f"carry_{i}", init[i].spec) for i in range(nc)]
        gy_t = [placeholder_in(bw, f"g_y_{j}", step(ys[j])) for j in fy]
        gh_t = [placeholder_in(bw, f"g_carry_in_{i}", init[i].spec) for i in fh]
        k_t = [placeholder_in(bw, f"captured_{i}", caps[i].spec) for i in range(len(caps))]
        with bw.name_scope("forward"):
            outs = clone(body, bw, c_t + x_t + k_t)
        d = _body_gradients(
            [outs[i] for i in fc] + [outs[nc + j] for j in fy],
            [c_t[i] for i in fc] + [x_t[i] for i in fx] + [k_t[i] for i in fk],
            g_carry + gy_t,
        )
        d_carry, d_x, d_k = d[: len(fc)], d[len(fc) : len(fc) + len(fx)], d[len(fc) + len(fx) :]
        for i, extra in zip(fh, gh_t, strict=True):
            d_carry[fc.index(i)] = d_carry[fc.index(i)] + extra
        new_acc = [total + part for total, part in zip(acc, d_k, strict=True)]
    placeholders = g_carry + acc + x_t + c_t + gy_t + gh_t + k_t
    bw_body = Body(bw, [t.op.name for t in placeholders], [t.name for t in d_carry + new_acc + d_x])
    start = [ops.zeros_like(final[i]) if g_final[i] is None else g_final[i] for i in fc]
    start += [ops.zeros_like(caps[i]) for i in fk]
    seqs = [*xs, *hist, *(g_ys[j] for j in fy), *(g_hist[i] for i in fh)]
    back = apply(
        "scan",
        *start,
        *seqs,
        *caps,
        body=bw_body,
        carries=len(start),
        sequences=len(seqs),
        reverse=not a["reverse"],
        length=a["length"],
        seed_scope=a.get("seed_scope") or op.name,  # the body's copy draws what the forward body drew
    )
    # each gradient through identity: a single-output op, which a distributed fit can cut the graph at
    back = tuple(ops.identity(t) for t in (back if isinstance(back, tuple) else (back,)))
    result = [None] * len(op.inputs)
    for pos, i in enumerate(fc):
        result[i] = back[pos]
    for pos, i in enumerate(fk):
        result[nc + ns + i] = back[len(fc) + pos]
    for pos, i in enumerate(fx):
        result[nc + i] = back[len(start) + pos]
    return result


def _body_gradients(ys, xs, grad_ys):
    """Gradients inside a body, zeros where ``ys`` do not depend on an x."""
    from workbench.graph.gradients import gradients

    found = gradients(ys, xs, grad_ys=grad_ys) if ys and xs else [None] * len(xs)
    return [ops.zeros_like(x) if d is None else d for x, d in zip(xs, found, strict=True)]


defop(
    "scan",
    infer=_scan_spec,
    kernel=_scan_kernel,
    grad=_scan_grad,
    variadic=True,
    bodies=("body",),
)
