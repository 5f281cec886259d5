"""Small records the graph keeps: where an op was made, and how an optimizer built an update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Source(NamedTuple):
    """Where the user created an operation."""

    filename: str
    lineno: int
    code: str

    def __str__(self) -> str:
        return (
            f'File "{self.filename}", line {self.lineno}: {self.code}'
            if self.code
            else f'File "{self.filename}", line {self.lineno}'
        )


@dataclass(frozen=True)
class TrainingRecord:
    """How an optimizer built an update operation: what distributed training splits the graph by.

    Attributes
    ----------
    update : str
        The update operation's name.
    gradients : tuple of (gradient tensor name, variable name)
    loss : str or None
        The loss tensor, when the update came from ``minimize``.
    loss_scale : str
        The variable of a dynamic loss scale, or "".
    """

    update: str
    gradients: tuple[tuple[str, str], ...]
    loss: str | None = None
    loss_scale: str = ""

    @property
    def gradient_names(self) -> tuple[str, ...]:
        return tuple(g for g, _ in self.gradients)

    def to_dict(self) -> dict:
        """The JSON form (see :mod:`workbench.graph.serialize`)."""
        out: dict = {"loss": self.loss, "gradients": [list(p) for p in self.gradients]}
        if self.loss_scale:
            out["loss_scale"] = self.loss_scale
        return out
