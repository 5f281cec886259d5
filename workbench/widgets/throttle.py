"""Bounding how often a widget sends its state to the browser, whatever the event rate."""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """Call ``push`` at most ``max_rate`` times a second; :meth:`flush` always pushes.

    Events mark the state as changed (:meth:`request`); a push happens at once
    when the last one is old enough, otherwise the change waits for the next
    request or for the final :meth:`flush`, so the last state is always shown.

    >>> now = [0.0]
    >>> pushes = []
    >>> t = Throttle(lambda: pushes.append(now[0]), max_rate=10, clock=lambda: now[0])
    >>> for i in range(100):  # 100 events in one second
    ...     now[0] = i / 100
    ...     t.request()
    >>> len(pushes)
    10
    >>> t.flush(); pushes[-1]
    0.99
    """

    def __init__(self, push: Callable[[], None], max_rate: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.push = push
        self.interval = 1.0 / max_rate
        self.clock = clock
        self.pending = False
        self.pushes = 0
        self._last: float | None = None

    def request(self) -> None:
        """The state changed: push now if allowed, or remember to."""
        self.pending = True
        now = self.clock()
        if self._last is None or now - self._last >= self.interval:
            self._push(now)

    def flush(self) -> None:
        """Push the latest state if it has not been pushed (at the end of a run)."""
        if self.pending:
            self._push(self.clock())

    def _push(self, now: float) -> None:
        self._last = now
        self.pending = False
        self.pushes += 1
        self.push()
