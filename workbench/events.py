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

    __slots__ = ("_listeners",)

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(event)`` for every later event; returns a function that unsubscribes."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def emit(self, kind: str, **fields: Any) -> None:
        """Send one event to every listener."""
        if not self._listeners:
            return
        event = {"kind": kind, **fields}
        for listener in list(self._listeners):
            listener(event)

    def __bool__(self) -> bool:
        return bool(self._listeners)
