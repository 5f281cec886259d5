"""A small publish/subscribe stream for execution events.

The execution layer emits events (plan compiled, step finished, ...); widgets,
training histories and scaling studies subscribe. Nothing that emits knows who
listens.
"""

from __future__ import annotations

from typing import Any, Callable

Event = dict[str, Any]
Listener = Callable[[Event], None]


class EventStream:
    """Listeners called in subscription order with one ``dict`` per event.

    >>> stream = EventStream()
    >>> seen = []
    >>> unsubscribe = stream.subscribe(seen.append)
    >>> stream.emit("step", step=1)
    >>> seen
    [{'kind': 'step', 'step': 1}]
    >>> unsubscribe()
    >>> stream.emit("step", step=2)
    >>> len(seen)
    1
    """

    __slots__ = ("_listeners", "parent", "tags")

    def __init__(self, parent: EventStream | None = None, **tags: Any) -> None:
        self._listeners: list[Listener] = []
        self.parent = parent  # also receives every event, with ``tags`` added
        self.tags = tags

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every later event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, kind: str, **fields: Any) -> None:
        """Send one event to every listener (and to the parent stream's)."""
        if not self.wanted:
            return
        event = {"kind": kind, **self.tags, **fields}
        for listener in list(self._listeners):
            listener(event)
        if self.parent is not None and self.parent.wanted:
            self.parent.emit(kind, **self.tags, **fields)

    @property
    def wanted(self) -> bool:
        """Whether anybody listens, here or upstream: emitters can skip building costly events."""
        return bool(self._listeners) or (self.parent is not None and self.parent.wanted)


#: Every session's events also reach this stream, tagged with ``session`` (its id).
#: The notebook layer listens here to show progress for any session.
ROOT = EventStream()
