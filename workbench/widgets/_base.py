"""What the views share: an anywidget with its front end in ``static/``, event following, and a
static picture of their state in the mime bundle.

The front ends are plain ES modules shipped in the package and synced as widget
state, so views render offline and from a saved notebook's widget state. Next to
the widget, each view's output carries an ``image/svg+xml`` picture of what it
shows (:class:`Snapshot`), kept up to date when the view finishes, so GitHub,
nbviewer, ``nbconvert --to html`` and papermill outputs show it without a kernel.
"""

from __future__ import annotations

import pathlib
import time
import uuid
from typing import Any
from collections.abc import Callable

import anywidget

from workbench.events import ROOT, Event, EventStream, as_event
from workbench.widgets.throttle import Throttle

STATIC = pathlib.Path(__file__).parent / "static"


def front_end(name: str) -> str:
    """The text of ``static/<name>`` (read once, at class creation)."""
    return (STATIC / name).read_text(encoding="utf-8")


SVG_MIME = "image/svg+xml"


class Snapshot:
    """Mixin for widgets: an SVG picture of the current state next to the widget in the mime bundle.

    Subclasses define :meth:`snapshot_state` (what the picture is drawn from: the
    state the front end draws, compared with ``==`` to skip redrawing) and
    :meth:`render_snapshot` (that state to an SVG document). Displayed in a
    kernel, the output gets a display id; :meth:`refresh_snapshot` (called when
    the view finishes something) replaces the saved picture with the current one.
    A live front end still renders the widget; files and viewers without one
    show the picture.
    """

    _display_id: str | None = None
    _drawn: tuple = (None, "")  # (state, svg) of the last picture drawn
    _shown_svg = ""  # the picture in the output now

    def snapshot_state(self) -> Any:
        raise NotImplementedError

    def render_snapshot(self, state: Any) -> str:
        raise NotImplementedError

    def snapshot(self) -> str:
        """The SVG picture of the view as it is now."""
        state = self.snapshot_state()
        drawn_state, svg = self._drawn
        if not svg or drawn_state != state:
            svg = self.render_snapshot(state)
            self._drawn = (state, svg)
        return svg

    def _repr_mimebundle_(self, **kwargs: Any):
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        self._shown_svg = self.snapshot()
        return {**data, SVG_MIME: self._shown_svg}, metadata

    def _ipython_display_(self) -> None:
        from IPython.display import display

        from workbench.kernel import in_kernel

        if self._repr_mimebundle_ is None:  # a closed widget shows nothing (as ipywidgets does)
            return
        if not in_kernel():
            data, metadata = self._repr_mimebundle_()
            display(data, metadata=metadata, raw=True)
            return
        # In a kernel: the widget, then its picture as an output of its own. JupyterLab renders a widget
        # output with the widget manager whatever else the bundle holds, and a reopened notebook's widgets
        # have no model ("model not found"): the picture's own output is what it shows then (its style hides
        # that error), while a live view hides the picture (views.css).
        if self._display_id is None:
            self._display_id = uuid.uuid4().hex
        data, metadata = self._repr_mimebundle_()
        widget = {k: v for k, v in data.items() if k != SVG_MIME}
        display(widget, metadata=metadata, raw=True)
        display(self._picture_bundle(), raw=True, display_id=self._display_id)

    def _picture_bundle(self) -> dict:
        """The output that carries the picture: an image, a caption, and the style that shows it in place
        of a widget that cannot be rendered."""
        self._shown_svg = self.snapshot()
        return {
            "text/html": picture_html(self._shown_svg, repr(self)),
            SVG_MIME: self._shown_svg,
            "text/plain": repr(self),
        }

    def refresh_snapshot(self) -> bool:
        """Replace the picture in the displayed outputs with the current one; True if it changed."""
        if self._display_id is None or self._repr_mimebundle_ is None or self.snapshot() == self._shown_svg:
            return False
        from IPython.display import update_display

        update_display(self._picture_bundle(), raw=True, display_id=self._display_id)
        return True


#: In a notebook whose widgets have no model (reopened, kernel restarted): hide the output before the picture
#: (the widget manager's "model not found") unless it holds a live view; a live view hides the picture instead.
_PICTURE_STYLE = (
    ".jp-OutputArea-child:has(+ .jp-OutputArea-child .wb-saved-picture):not(:has(.wb-view, .wb-playground))"
    " { display: none; }"
    ".jp-OutputArea-child:has(.wb-view, .wb-playground) + .jp-OutputArea-child:has(.wb-saved-picture) { display: none; }"
)


def picture_html(svg: str, summary: str) -> str:
    """The saved picture as HTML: the SVG as an image, and how to get the live view back."""
    import base64
    import html

    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return (
        f'<div class="wb-saved-picture"><style>{_PICTURE_STYLE}</style>'
        f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(summary)}">'
        '<div style="color:#57606a;font-size:12px">the saved picture of this view: run the cell again for the live view</div>'
        "</div>"
    )


class View(Snapshot, anywidget.AnyWidget):
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
        self._session, self._stream = None, ROOT

    def follow(self, stream: EventStream = ROOT, session=None):
        """Update from ``stream``'s events (only those whose ``session`` token is ``session``, when given)."""
        self.stop()
        self._session, self._stream = session, stream
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
        self.refresh_snapshot()

    def _on_event(self, event: Event) -> None:
        if self._session is not None and event.session != self._session:
            return
        if self.handle(event):
            self.throttle.pending = True
            self.throttle.flush()
            self.refresh_snapshot()  # something finished: the saved picture shows it
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
