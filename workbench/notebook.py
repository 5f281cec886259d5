"""The notebook hook: shows a TrainingView when ``fit`` starts and a ScalingView when a scaling study does.

It listens to :data:`workbench.events.ROOT`, so the execution layer needs no
notion of notebooks. ``import workbench`` installs it inside an IPython kernel,
and so does ``%load_ext workbench``; widgets are imported only when an event
needs one, so plain scripts never load ipywidgets.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

from workbench.events import ROOT, Event, EventStream, FitStarted, ScalingStarted
from workbench.kernel import in_kernel  # noqa: F401 - also this module's: magics asks it here

_hook: dict[str, Any] = {"unsubscribe": None, "display": None, "views": {}}


def install(stream: EventStream = ROOT, display: Callable[[Any], Any] | None = None) -> None:
    """Show views for training runs and scaling studies as they start (idempotent).

    ``display`` defaults to IPython's; tests pass their own.
    """
    uninstall()
    _hook["display"] = display
    _hook["unsubscribe"] = stream.subscribe(lambda event: _on_event(stream, event))
    if stream is ROOT:
        from workbench.dashboard import forward

        forward(stream)  # fits on a cluster also show on its dashboard's Workbench page


def install_if_kernel() -> bool:
    """:func:`install` when running in a kernel; returns whether it did."""
    if in_kernel() and _hook["unsubscribe"] is None:
        install()
        return True
    return False


def uninstall() -> None:
    """Stop showing views for new runs (views already shown keep following theirs)."""
    if _hook["unsubscribe"] is not None:
        _hook["unsubscribe"]()
    _hook.update(unsubscribe=None, display=None, views={})


def installed() -> bool:
    return _hook["unsubscribe"] is not None


def _on_event(stream: EventStream, event: Event) -> None:
    if not isinstance(event, (FitStarted, ScalingStarted)):
        return
    if isinstance(event, FitStarted) and event.study:
        return  # a run of a scaling study: the study's own view shows it
    from workbench.widgets import ScalingView, TrainingView, link_shown  # widgets only when needed

    _hook["views"] = {k: v for k, v in _hook["views"].items() if v.following}
    key = (event.kind, event.session)
    old = _hook["views"].pop(key, None)
    if old is not None:
        old.stop()
    if isinstance(event, FitStarted):
        view = TrainingView(title=f"training · {event.steps} steps").follow(stream, event.session)
        link_shown(view, event.graph)  # graph views of this model show its statistics at the step clicked
    else:
        view = ScalingView().follow(stream, event.session)
    view.handle(event)  # it subscribed after this event was sent
    view.throttle.request()
    _hook["views"][key] = view
    _show(view)
    if isinstance(event, FitStarted) and event.scheduler:  # a cluster fit: where each worker's time goes
        _show_timeline(view, event)


def _show_timeline(training, event: FitStarted) -> None:
    from workbench.widgets import TimelineView

    key = ("timeline", event.session)
    old = _hook["views"].pop(key, None)
    if old is not None:
        old.stop()
    view = TimelineView(title=f"timeline · {event.strategy}").follow(training)
    view.handle(event)
    _hook["views"][key] = view
    _show(view)


def _show(view) -> None:
    display = _hook["display"]
    if display is None:
        from IPython.display import display
    display(view)
