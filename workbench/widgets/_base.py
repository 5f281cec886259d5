"""What the views share: an anywidget with its front end in ``static/``, and event following.

The front ends are plain ES modules shipped in the package and synced as widget
state, so views render offline and from a saved notebook's widget state.
"""

from __future__ import annotations

import pathlib
import time
from typing import Any, Callable

import anywidget

from workbench.events import ROOT, Event, EventStream, as_event
from workbench.widgets.throttle import Throttle

STATIC = pathlib.Path(__file__).parent / "static"


def front_end(name: str) -> str:
    """The text of ``static/<name>`` (read once, at class creation)."""
    return (STATIC / name).read_text(encoding="utf-8")


class View(anywidget.AnyWidget):
    """An anywidget that can follow an :class:`EventStream`, pushing its state at a bounded rate.

    Subclasses implement :meth:`handle` (update the Python-side model from one
    event; return True when its state should be pushed at once, e.g. at the
    end of a run) and :meth:`_sync` (copy the model into the synced traits).
    A view stops following once :attr:`ended` (what it shows is over).
    """

    _css = front_end("views.css")
    max_rate = 10.0  # state pushes per second, at most

    def __init__(self, clock: Callable[[], float] = time.monotonic, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.throttle = Throttle(self._sync, max_rate=self.max_rate, clock=clock)
        self._unsubscribe: Callable[[], None] | None = None
        self._session = None

    def follow(self, stream: EventStream = ROOT, session=None):
        """Update from ``stream``'s events (only those whose ``session`` token is ``session``, when given)."""
        self.stop()
        self._session = session
        self._unsubscribe = stream.subscribe(self._on_event)
        return self

    def stop(self) -> None:
        """Stop following events (the view keeps showing its last state)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    @property
    def following(self) -> bool:
        return self._unsubscribe is not None

    def feed(self, events) -> None:
        """Apply events in order (e.g. a recorded run), then show the final state.

        Events are :class:`workbench.events.Event` objects (or dicts with a ``"kind"``).
        """
        for event in events:
            self.handle(as_event(event))
        self.throttle.pending = True
        self.throttle.flush()

    def _on_event(self, event: Event) -> None:
        if self._session is not None and event.session != self._session:
            return
        if self.handle(event):
            self.throttle.pending = True
            self.throttle.flush()
        else:
            self.throttle.request()
        if self.ended:
            self.stop()

    @property
    def ended(self) -> bool:
        return False

    def handle(self, event: Event) -> bool:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stop()
        super().close()
