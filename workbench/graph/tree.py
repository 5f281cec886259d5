"""Nested tuples and lists of tensors, flattened to a list and rebuilt (the carries and outputs
of :func:`~workbench.graph.control.scan` and :func:`~workbench.graph.control.cond`).

>>> leaves, tree = flatten((1, [2, 3], None))
>>> leaves, unflatten(tree, ["a", "b", "c"])
([1, 2, 3], ('a', ['b', 'c'], None))
"""

from __future__ import annotations

from typing import Any

LEAF = "*"


def flatten(value: Any) -> tuple[list, Any]:
    """The leaves of ``value`` (anything but tuples, lists and None is a leaf) and its structure."""
    if value is None:
        return [], None
    if isinstance(value, (tuple, list)):
        leaves, trees = [], []
        for item in value:
            sub, tree = flatten(item)
            leaves.extend(sub)
            trees.append(tree)
        return leaves, (type(value).__name__, tuple(trees))
    return [value], LEAF


def unflatten(tree: Any, leaves) -> Any:
    """``value`` of :func:`flatten` rebuilt from the structure and new leaves."""
    it = iter(leaves)
    return _build(tree, it)


def _build(tree, it):
    if tree is None:
        return None
    if tree == LEAF:
        return next(it)
    kind, children = tree
    items = [_build(child, it) for child in children]
    return tuple(items) if kind == "tuple" else items


def describe(tree: Any) -> str:
    """The structure as a user writes it: ``(*, [*, *])``."""
    if tree is None:
        return "None"
    if tree == LEAF:
        return "tensor"
    kind, children = tree
    inner = ", ".join(describe(c) for c in children)
    return f"({inner}{',' if len(children) == 1 else ''})" if kind == "tuple" else f"[{inner}]"
