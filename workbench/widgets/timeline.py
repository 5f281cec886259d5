"""TimelineView: one lane per worker of where each step's time went, live during a fit.

Each :class:`~workbench.events.Step` of a replicated fit carries its spans (``metrics["spans"]``,
see :mod:`workbench.timeline`). The view keeps every step's spans and shows a window of steps:
the latest while the fit runs, any earlier one when scrolled back (:attr:`TimelineView.end_step`).
Spans are coloured by phase; hovering one shows its numbers; a wait is drawn with an arrow to the
worker it waited for. Linked to a :class:`~workbench.widgets.TrainingView`
(``TimelineView().follow(training_view)``, what the notebook does for a cluster fit), a click on a
loss spike there shows that step's lanes here, and a click on a span here selects its step there.

>>> from workbench.events import FitStarted, Step
>>> view = TimelineView()
>>> spans = [{"worker": "a", "replica": 0, "step": 1, "phase": "compute", "start": 0.0, "end": 0.5},
...          {"worker": "b", "replica": 1, "step": 1, "phase": "wait", "start": 0.0, "end": 0.5, "waiting_for": "a"}]
>>> view.feed([FitStarted(steps=1, strategy="allreduce"), Step(step=1, metrics={"spans": spans})])
>>> view.workers, view.shown_steps, view.stragglers[0]
(['a', 'b'], [1, 1], ['a', 0.5])
"""

from __future__ import annotations

import bisect
from typing import Any

import traitlets

from workbench.events import Event, FitFailed, FitFinished, FitInterrupted, FitStarted, Step
from workbench.timeline import PHASES, Timeline
from workbench.widgets._base import View, front_end
from workbench.widgets.timeline_svg import timeline_svg

#: Each phase's colour (as static/timeline_view.js draws them); a compute span's backward part is lighter.
PHASE_COLORS = {
    "compute": "#0969da",
    "communicate": "#bf8700",
    "wait": "#cf222e",
    "update": "#1a7f37",
    "idle": "#d0d7de",
}
PART_COLORS = {"forward": "#0969da", "backward": "#54aeff"}


class TimelineView(View):
    """Lanes per worker (compute, communicate, wait with an arrow to the worker waited for, update,
    idle), a window of ``window`` steps that follows the fit, a scroll back over the whole run.

    Attributes
    ----------
    window : int
        Steps shown at once.
    end_step : int
        The last step shown; 0 follows the latest step (live).
    selected_step : int
        The step highlighted (a click here, or on a linked TrainingView's charts); 0: none.
    """

    _esm = front_end("timeline_view.js")
    title = traitlets.Unicode("timeline").tag(sync=True)
    status = traitlets.Unicode("waiting").tag(sync=True)
    workers = traitlets.List(traitlets.Unicode()).tag(sync=True)
    #: The spans shown: ``[lane, step, phase, start, end, lane waited for or -1, bytes, part or ""]``
    #: (``part``: a compute span's ``"forward"`` or ``"backward"``).
    spans = traitlets.List().tag(sync=True)
    #: The first and last step recorded (the scroll back's range), and the steps shown.
    steps = traitlets.List(traitlets.Int()).tag(sync=True)
    shown_steps = traitlets.List(traitlets.Int()).tag(sync=True)
    window = traitlets.Int(8, min=1).tag(sync=True)
    end_step = traitlets.Int(0, min=0).tag(sync=True)
    selected_step = traitlets.Int(0, min=0).tag(sync=True)
    #: ``[worker, seconds per step]`` of the wait each worker caused the others, most first.
    stragglers = traitlets.List().tag(sync=True)

    def __init__(self, title: str = "timeline", window: int = 8, **kwargs: Any) -> None:
        super().__init__(title=title, window=window, **kwargs)
        self._by_step: dict[int, list[dict]] = {}
        self._order: list[int] = []
        self._linked: list = []
        self.observe(lambda _: self._sync(), ["window", "end_step", "selected_step"])

    # -- events -----------------------------------------------------------------------------------
    def handle(self, event: Event) -> bool:
        if isinstance(event, FitStarted):
            if not event.start:
                self.clear()
            self.status = "running"
            return False
        if isinstance(event, Step):
            spans = event.metrics.get("spans") if isinstance(event.metrics, dict) else None
            if spans:
                self.add(event.step, spans)
            return False
        if isinstance(event, FitFinished | FitFailed | FitInterrupted):
            self.status = {"fit_finished": "done", "fit_failed": "failed"}.get(event.kind, "stopped")
            return True
        return False

    @property
    def ended(self) -> bool:
        return self.status in ("done", "failed", "stopped")

    def clear(self) -> None:
        self._by_step, self._order = {}, []
        self.end_step = self.selected_step = 0

    def add(self, step: int, spans: list[dict]) -> None:
        """Keep one step's spans."""
        step = int(step)
        if step not in self._by_step:
            bisect.insort(self._order, step)
        self._by_step[step] = [dict(s) for s in spans]

    def show(self, timeline: Timeline) -> TimelineView:
        """Show a finished fit's timeline (``History.timeline()``)."""
        self.clear()
        for step in timeline.steps:
            self.add(step, timeline.step(step).spans)
        self.status = "done"
        self._sync()
        self.refresh_snapshot()
        return self

    @property
    def timeline(self) -> Timeline:
        """Everything this view holds, as a :class:`~workbench.timeline.Timeline`."""
        return Timeline(s for step in self._order for s in self._by_step[step])

    # -- linking ----------------------------------------------------------------------------------
    def follow(self, stream=None, session=None):
        """Follow an event stream (as every view), or a :class:`~workbench.widgets.TrainingView`:
        its stream and session, and its selected step (both ways)."""
        from workbench.events import ROOT
        from workbench.widgets.training_view import TrainingView

        for unlink in self._linked:
            unlink()
        self._linked = []
        if not isinstance(stream, TrainingView):
            return super().follow(ROOT if stream is None else stream, session=session)
        view = stream
        super().follow(view._stream, session=view._session if session is None else session)

        def picked(change):  # a click on the training view's charts
            if change["new"]:
                self.show_step(change["new"])

        def clicked(change):  # a click on a span here
            if change["new"] and view.selected_step != change["new"]:
                view.selected_step = change["new"]

        view.observe(picked, "selected_step")
        self.observe(clicked, "selected_step")
        self._linked = [
            lambda: view.unobserve(picked, "selected_step"),
            lambda: self.unobserve(clicked, "selected_step"),
        ]
        return self

    def show_step(self, step: int) -> int:
        """Scroll to show the recorded step nearest ``step`` (highlighted); returns that step."""
        if not self._order:
            return 0
        i = bisect.bisect_left(self._order, int(step))
        near = self._order[max(i - 1, 0) : i + 1]
        found = min(near, key=lambda s: (abs(s - step), -s))
        last = self._order[-1]
        end = min(found + self.window // 2, last)
        self.end_step = 0 if end >= last else end
        self.selected_step = found
        self._sync()
        return found

    def live(self) -> None:
        """Follow the latest step again."""
        self.end_step = 0

    # -- state ------------------------------------------------------------------------------------
    def _window(self) -> list[int]:
        if not self._order:
            return []
        end = self._order[-1] if not self.end_step else min(self.end_step, self._order[-1])
        k = bisect.bisect_right(self._order, end)
        return self._order[max(k - self.window, 0) : k]

    def _sync(self) -> None:
        shown = self._window()
        spans = [s for step in shown for s in self._by_step[step]]
        ranks: dict[str, int] = {}
        for step in self._order:
            for s in self._by_step[step]:
                ranks.setdefault(s["worker"], s.get("replica", 0))
        workers = sorted(ranks, key=lambda w: (ranks[w], w))
        lane = {w: i for i, w in enumerate(workers)}
        self.workers = workers
        self.spans = [
            [
                lane[s["worker"]],
                int(s["step"]),
                s["phase"],
                round(float(s["start"]), 6),
                round(float(s["end"]), 6),
                lane.get(s.get("waiting_for"), -1),
                int(s.get("bytes", 0) or 0),
                str(s.get("part") or ""),
            ]
            for s in spans
        ]
        self.steps = [self._order[0], self._order[-1]] if self._order else []
        self.shown_steps = [shown[0], shown[-1]] if shown else []
        self.stragglers = [[w, round(v, 6)] for w, v in Timeline(spans).stragglers()[:3]]

    def snapshot_state(self):
        return (
            self.title,
            self.status,
            tuple(self.workers),
            str(self.spans),
            tuple(self.shown_steps),
            self.selected_step,
        )

    def render_snapshot(self, state) -> str:
        title, status, workers, _, shown, selected = state
        return timeline_svg(title, status, list(workers), self.spans, list(shown), selected, PHASE_COLORS, PART_COLORS)

    def __repr__(self) -> str:
        """One line: ``timeline · 3 workers · steps 1..40 · most waited for: tcp://... (0.2 s/step)``."""
        parts = [self.title, f"{len(self.workers)} workers"]
        if self._order:
            parts.append(f"steps {self._order[0]}..{self._order[-1]}")
        top = self.timeline.stragglers()[:1] if self._order else []
        if top and top[0][1] > 0:
            parts.append(f"most waited for: {top[0][0]} ({top[0][1]:.3g} s/step)")
        return " · ".join(parts)


__all__ = ["PART_COLORS", "PHASES", "PHASE_COLORS", "TimelineView"]
