"""Strategies by name: ``@wb.strategy("name")``, ``wb.strategy("name", fn)``, ``wb.strategies.names()``.

A strategy is a function of one argument ``r``, the :class:`~workbench.strategies.context.ReplicaContext`
of one replica, that builds the replica's update as graph. A :class:`Strategy` holds the function, its
name and its parameters (the built-ins with parameters, ``local_sgd(every=8)``, are Strategy objects
made by a factory); ``fit(strategy=...)`` takes a registered name, a Strategy or a plain function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable

from workbench.errors import StrategyError
from workbench.graph.records import Source


@dataclass(frozen=True)
class Strategy:
    """A strategy function with its name (and, for a parameterized built-in, its parameters).

    Calling it calls the function: ``strategy(r)``.
    """

    name: str
    fn: Callable = field(repr=False)
    params: tuple = ()

    def __call__(self, r):
        return self.fn(r)

    def source(self) -> Source | None:
        """Where the function is defined (its ``def`` line, or a cell's first line)."""
        cell = getattr(self.fn, "cell_source", None)  # a %%flow_strategy cell
        if cell is not None:
            return cell
        code = getattr(self.fn, "__code__", None)
        if code is None:
            return None
        import linecache

        line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
        return Source(code.co_filename, code.co_firstlineno, line)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params)
        return f"<Strategy {self.name!r}{f' ({args})' if args else ''}>"


#: Registered strategies by name (the built-ins and the user's).
REGISTRY: dict[str, Strategy] = {}
BUILT_IN: set[str] = set()


def strategy(name: str, fn: Callable | None = None):
    """Register a strategy function under ``name``: ``@wb.strategy("name")`` or ``wb.strategy("name", fn)``.

    Returns the :class:`Strategy` (the decorator form binds it to the function's name), which
    ``fit(strategy=...)`` takes as it takes the name. Registering a name again replaces it (a
    re-run cell); the built-ins' names are taken.

    Examples
    --------
    >>> import workbench as wb
    >>> @wb.strategy("my_local_sgd")
    ... def my_local_sgd(r):
    ...     r.apply(r.gradients)
    ...     with r.every(4):
    ...         r.assign({v: wb.all_reduce(v, op="mean") for v in r.variables})
    >>> "my_local_sgd" in wb.strategies.names()
    True
    """
    if not isinstance(name, str) or not name or not name.replace("_", "a").replace("-", "a").isalnum():
        raise StrategyError(f"a strategy's name is a word (letters, digits, '_', '-'), got {name!r}")
    if name in BUILT_IN:
        raise StrategyError(f"strategy {name!r} is built in; register yours under another name")

    def register(function: Callable) -> Strategy:
        if isinstance(function, Strategy):
            function = function.fn
        if not callable(function):
            raise StrategyError(f"strategy {name!r} needs a function of r, got {type(function).__name__}")
        made = REGISTRY[name] = Strategy(name, function)
        return made

    return register if fn is None else register(fn)


def register_builtin(made: Strategy) -> Strategy:
    """Register a built-in under its name (what ``fit(strategy="<name>")`` uses: its default parameters)."""
    REGISTRY[made.name] = made
    BUILT_IN.add(made.name)
    return made


def names() -> list[str]:
    """The registered strategies' names, sorted (the built-ins and the user's)."""
    return sorted(REGISTRY)


def resolve(chosen) -> Strategy:
    """The Strategy ``chosen`` names: a registered name, a Strategy, or a function of ``r``."""
    if isinstance(chosen, Strategy):
        return chosen
    if isinstance(chosen, str):
        found = REGISTRY.get(chosen)
        if found is None:
            raise StrategyError(f"unknown strategy {chosen!r}; registered strategies are {', '.join(names())}")
        return found
    if callable(chosen):
        name = getattr(chosen, "__name__", "")
        return Strategy(name if name.isidentifier() else "strategy", chosen)
    raise StrategyError(f"strategy must be a name, a Strategy or a function of r, got {type(chosen).__name__}")


def is_strategy(chosen) -> bool:
    """Whether ``chosen`` is a strategy function (a registered name, a Strategy or a function), not an engine name."""
    return isinstance(chosen, Strategy) or callable(chosen) or (isinstance(chosen, str) and chosen in REGISTRY)
