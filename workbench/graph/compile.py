"""The one plan compiler and its cache: every path (local, GPU, cluster workers, sharded
inference) turns a graph into a :class:`~workbench.graph.plan.Plan` here.

:func:`compile_plan` prunes the graph to what the fetches need and optimizes it
(unless the caller ships an already optimized graph, as the cluster client
does), applies the device's own rewrite (fusion on a GPU), checks that every
placeholder left is fed, and builds the plan for the device's array namespace.
:class:`PlanCache` keeps compiled plans, least recently used out first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

from workbench.errors import FeedError
from workbench.graph.core import Graph
from workbench.graph.device import CPU, Device
from workbench.graph.passes import optimize
from workbench.graph.plan import Plan
from workbench.ops import rules


def compile_plan(
    graph: Graph,
    fetches: Sequence[str],
    fed: Sequence[str] | Mapping[str, Any],
    device: Device | None = None,
    *,
    state: dict | None = None,
    seed: int = 0,
    own_state: bool = False,
    optimized: bool = False,
    bucket_bytes: int | None = None,
) -> Plan:
    """A plan computing ``fetches`` of ``graph`` from the placeholders ``fed``, for ``device``.

    Parameters
    ----------
    graph : Graph
    fetches : sequence of str
        Tensor or operation names.
    fed : sequence of str, or mapping of name to value
        The placeholders that will be fed; the plan's :attr:`~Plan.feed_names`
        are those the pruned graph still needs, in graph order.
    device : Device, optional
        Where the plan runs (default: the CPU).
    state : dict, optional
        Variable name to array, shared with other plans of the same owner.
    seed, own_state :
        See :class:`~workbench.graph.plan.Plan`.
    optimized : bool
        ``graph`` is already pruned and optimized for these fetches (a graph the
        cluster client shipped): only the device's rewrite runs.
    bucket_bytes : int, optional
        Bucket the plan's sum and mean all-reduces (see :class:`~workbench.graph.plan.Plan`).

    Examples
    --------
    >>> import workbench as wb
    >>> g = wb.Graph()
    >>> with g.as_default():
    ...     x = wb.placeholder("x", shape=(None,))
    ...     y = wb.sum(x * 2.0)
    >>> plan = compile_plan(g, [y.name], ["x"])
    >>> plan.feed_names, float(plan.run([[1.0, 2.0]])[0])
    (('x',), 6.0)
    """
    device = device if device is not None else CPU()
    fetches = list(fetches)
    pruned = graph if optimized else optimize(graph, fetches, fed=list(fed))
    pruned = device.rewrite(pruned, fetches)
    placeholders = [op for op in pruned.operations if op.type == "placeholder"]
    missing = [op.outputs[0] for op in placeholders if op.name not in fed]
    if missing:
        ph = missing[0]
        shape = "any" if ph.shape is None else rules.fmt(ph.shape)
        raise FeedError(
            f"placeholder {ph.name!r} (shape {shape}, {ph.dtype}) must be fed to compute "
            f"{', '.join(repr(n) for n in fetches)}"
        )
    order = [op.name for op in placeholders]
    state = {} if state is None else state
    compilers = device.fused_compilers
    return Plan(
        pruned,
        fetches,
        order,
        device.xp,
        state,
        seed=seed,
        own_state=own_state,
        compilers=compilers,
        bucket_bytes=bucket_bytes,
    )


def feed_signature(feeds: Mapping[str, Any]) -> tuple:
    """The part of a plan's cache key that feeds decide: their names and dtypes (not their shapes)."""
    return tuple(sorted((name, value.dtype.str) for name, value in feeds.items()))


@dataclass(frozen=True)
class PlanKey:
    """What a compiled plan depends on: which graph (and which version of it), the fetches,
    the feeds' names and dtypes, and the device."""

    graph: str
    version: int
    fetches: tuple
    feeds: tuple
    device: str

    @classmethod
    def of(cls, graph: Graph, fetches: Sequence[str], feeds: Mapping[str, Any], device: Device) -> PlanKey:
        return cls(graph.token, graph.version, tuple(fetches), feed_signature(feeds), device.name)


class PlanCache:
    """Compiled plans by key, at most ``maxsize`` of them; the least recently used goes first.

    >>> cache = PlanCache(maxsize=2)
    >>> cache.get("a", lambda: 1), cache.get("b", lambda: 2), cache.get("a", lambda: 3)
    (1, 2, 1)
    >>> cache.get("c", lambda: 4), list(cache.keys())
    (4, ['a', 'c'])
    """

    def __init__(self, maxsize: int = 64) -> None:
        self.maxsize = maxsize
        self._plans: OrderedDict[Any, Any] = OrderedDict()
        self.compiled = 0  # plans compiled in all (misses)

    def get(self, key, compile: Callable[[], Any]):
        """The plan for ``key``; ``compile()`` makes it on a miss."""
        found = self._plans.get(key)
        if found is not None:
            self._plans.move_to_end(key)
            return found
        found = self._plans[key] = compile()
        self.compiled += 1
        while len(self._plans) > self.maxsize:
            self._plans.popitem(last=False)
        return found

    def keys(self) -> Iterator:
        return iter(self._plans.keys())

    def values(self) -> Iterator:
        return iter(self._plans.values())

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, key) -> bool:
        return key in self._plans
