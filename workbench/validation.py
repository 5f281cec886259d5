"""Validation during ``fit``: the fetches evaluated on held-out data every k steps.

``Session.fit(..., fetches={"loss": loss}, validation=(held_out, k))`` evaluates every
fetch on the whole held-out set after steps k, 2k, ...; the
:class:`~workbench.fitloop.FitLoop` adds ``val_<label>`` to those steps' records and
emits :class:`~workbench.events.Validated` (the TrainingView draws the validation
curve over the training one). One run covers the whole held-out set, so a mean
(a loss, an accuracy) is the mean over all of it, exactly.

- Locally (:class:`LocalValidation`), the session's own plans run it: while the
  local engine yields a step, the session holds that step's variables.
- On a cluster (:class:`ClusterValidation`), the loop asks the engine to bring the
  step's variables home (as for a checkpoint) and one inference task runs the
  pruned graph on a worker, on the worker's kind of device, with the program and
  plan cache of sharded inference (:mod:`workbench.cluster.infer`). The held-out
  data goes to the cluster once, when the fit starts (a dask array is gathered
  there, never on the client).
"""

from __future__ import annotations

import operator

import numpy as np

from workbench.errors import ArgumentError, FeedError
from workbench.graph.passes import optimize
from workbench.ops import rules
from workbench.training import check_data, is_dask_array


def check_validation(validation, fetches: dict) -> tuple[dict, int]:
    """``(data, every)`` of ``fit``'s ``validation`` argument, or ArgumentError / FeedError."""
    if not isinstance(validation, (tuple, list)) or len(validation) != 2:
        sequence = isinstance(validation, (tuple, list))
        got = f"a {type(validation).__name__} of {len(validation)}" if sequence else repr(validation)
        raise ArgumentError(f"fit() validation must be a tuple (data, every_k_steps), got {got}")
    data, every = validation
    if isinstance(every, (bool, np.bool_)) or not _is_int(every) or operator.index(every) < 1:
        raise ArgumentError(f"fit() validation's every_k_steps must be a positive integer, got {every!r}")
    if not isinstance(data, dict) or not data:
        kind = type(data).__name__
        raise FeedError(f"fit() validation data must be a non-empty dict from placeholders to arrays, got {kind}")
    if not fetches:
        raise ArgumentError("fit() validation evaluates the fetches on the held-out data: give fetches= too")
    return data, operator.index(every)


def _is_int(value) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def check_fed(graph, names: list[str], data: dict) -> None:
    """FeedError naming the first placeholder the fetches need that ``data`` lacks."""
    pruned = optimize(graph, names, fed=list(data))
    for op in pruned.operations:
        if op.type == "placeholder" and op.name not in data:
            ph = op.outputs[0]
            shape = "any" if ph.shape is None else rules.fmt(ph.shape)
            raise FeedError(
                f"fit() validation data lacks placeholder {op.name!r} (shape {shape}, {ph.dtype}), "
                f"needed to compute {', '.join(repr(n) for n in names)}"
            )


class LocalValidation:
    """Runs the fetches through the session's plans (the session holds the step's variables)."""

    def __init__(self, session, fetches: dict, data: dict, every: int):
        self.session, self.fetches, self.data, self.every = session, dict(fetches), data, every
        self.examples = check_data(data)
        check_fed(session.graph, list(fetches.values()), data)

    def evaluate(self, engine, step: int) -> dict:
        """The :class:`~workbench.events.Validated` fields of ``step``."""
        from workbench.fitloop import LocalSteps

        if not isinstance(engine, LocalSteps):  # the simulation's replicas hold the step's variables, not the session
            variables, at = engine.variables()
            if at != step:
                raise RuntimeError(f"step engine {engine.strategy!r} holds step {at}'s variables, not step {step}'s")
            self.session.set_variables(variables)
        values = self.session.run(list(self.fetches.values()), self.data)
        return {"step": step, "fetches": _labelled(self.fetches, values), "examples": self.examples}


class ClusterValidation:
    """One inference task per evaluation on the session's cluster, with the engine's host copy
    of the step's variables; the held-out data is sent to the cluster once."""

    def __init__(self, session, fetches: dict, data: dict, every: int):
        from workbench.cluster.infer import inference_program
        from workbench.cluster.uninterrupted import scatter_whole

        self.client, self.fetches, self.every = session.client, dict(fetches), every
        names = list(fetches.values())
        self.examples = check_data(data)
        check_fed(session.graph, names, data)
        graph = optimize(session.graph, names, fed=list(data))
        self.variables = [op.name for op in graph.operations if op.type == "variable"]
        device = (session.device.kind, session.device.options)
        self.program = inference_program(graph, tuple(names), (), tuple(data), session.seed, device)
        # a key of its own (hash=False): a fit after this one may scatter the same arrays while this
        # copy is being released, and a shared key lost in that race ends the next evaluation
        self.data = [
            self.client.compute(v) if is_dask_array(v) else scatter_whole(self.client, v, hash=False)
            for v in data.values()
        ]

    def evaluate(self, engine, step: int) -> dict:
        from workbench.cluster.infer import run_whole

        variables, at = engine.variables()
        if at != step:
            raise RuntimeError(f"step engine {engine.strategy!r} holds step {at}'s variables, not step {step}'s")
        values = {n: variables[n] for n in self.variables}
        fetched = self.client.submit(run_whole, self.program, values, *self.data, pure=False).result()
        return {"step": step, "fetches": _labelled(self.fetches, fetched), "examples": self.examples}


def _labelled(fetches: dict, values) -> dict:
    return {label: _number(v) for label, v in zip(fetches, values)}


def _number(value):
    array = np.asarray(value)
    return float(array) if array.ndim == 0 else array


def make_validation(session, validation, fetches: dict, fit_data) -> LocalValidation | ClusterValidation:
    """The evaluator of ``fit``'s ``validation`` for ``session`` (``fit_data`` checks the held-out arrays
    as ``fit`` checks its data)."""
    data, every = check_validation(validation, fetches)
    try:
        arrays = fit_data(data)
        check_data(arrays)
    except FeedError as e:
        raise FeedError(f"fit() validation data: {e}") from None
    kind = LocalValidation if session.client is None else ClusterValidation
    return kind(session, fetches, arrays, every)
