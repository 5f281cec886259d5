"""The static picture of a TimelineView: its lanes as static/timeline_view.js draws them.

>>> svg = timeline_svg("timeline", "done", ["a", "b"], [[0, 1, "compute", 0.0, 0.5, -1, 0],
...                    [1, 1, "wait", 0.1, 0.5, 0, 0]], [1, 1], 0, {"compute": "#00f", "wait": "#f00"})
>>> svg.startswith("<svg") and "waits for a" in svg
True
"""

from __future__ import annotations

from workbench.widgets.svg import BORDER, INK, MUTED, document, element

LANE, LABEL, WIDTH, TOP = 26, 170, 760, 40


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1) :]


def timeline_svg(title, status, workers, spans, shown, selected, colors, part_colors=None) -> str:
    """Lanes per worker: each span a bar coloured by phase, waits with an arrow to the worker waited for,
    step boundaries, the ``selected`` step outlined."""
    height = TOP + LANE * max(len(workers), 1) + 44
    steps = f" · steps {shown[0]}..{shown[1]}" if shown else ""
    body = [
        element("text", f"{title} · {status}{steps}", x=8, y=18, font_weight="600", fill=INK),
        element(
            "defs",
            None,
            element(
                "marker",
                None,
                element("path", d="M0,0 L6,3 L0,6 z", fill="#cf222e"),
                id="wb-arrow",
                markerWidth=6,
                markerHeight=6,
                refX=5,
                refY=3,
                orient="auto",
            ),
        ),
    ]
    if not spans:
        body.append(element("text", "no spans yet", x=8, y=TOP + 16, fill=MUTED))
        return document(LABEL + WIDTH + 20, height, body, f"{title}: no spans")
    lo, hi = min(s[3] for s in spans), max(s[4] for s in spans)
    scale = WIDTH / max(hi - lo, 1e-9)

    def x(t: float) -> float:
        return LABEL + (t - lo) * scale

    for i, worker in enumerate(workers):
        y = TOP + i * LANE
        body.append(element("text", _clip(str(worker), 26), x=8, y=y + LANE / 2 + 4, fill=INK))
        body.append(element("line", x1=LABEL, x2=LABEL + WIDTH, y1=y + LANE - 2, y2=y + LANE - 2, stroke=BORDER))
    part_colors = part_colors or {}
    for lane, step, phase, start, end, waited, nbytes, *part in spans:
        part = part[0] if part else ""
        y = TOP + lane * LANE + 3
        tip = f"{workers[lane]} · step {step} · {phase}{f' ({part})' if part else ''} {1000 * (end - start):.2f} ms"
        if waited >= 0:
            tip += f" · waits for {workers[waited]}"
        if nbytes:
            tip += f" · {nbytes:,} bytes"
        outline = {"stroke": INK, "stroke_width": 1.5} if selected and step == selected else {}
        body.append(
            element(
                "rect",
                None,
                element("title", tip),
                x=f"{x(start):.2f}",
                y=y,
                width=f"{max((end - start) * scale, 0.5):.2f}",
                height=LANE - 8,
                fill=part_colors.get(part) or colors.get(phase, "#8c959f"),
                **outline,
            )
        )
        if waited >= 0 and waited != lane:
            y2 = TOP + waited * LANE + LANE / 2
            body.append(
                element(
                    "line",
                    x1=f"{x(end):.2f}",
                    y1=y + (LANE - 8) / 2,
                    x2=f"{x(end):.2f}",
                    y2=y2,
                    stroke="#cf222e",
                    stroke_width=1,
                    marker_end="url(#wb-arrow)",
                )
            )
    legend_y = TOP + LANE * len(workers) + 18
    cursor = LABEL
    parts = {s[7] for s in spans if len(s) > 7 and s[7]}
    legend = {**colors, **{part: color for part, color in part_colors.items() if part in parts}}
    for phase, color in legend.items():
        body.append(element("rect", x=cursor, y=legend_y - 9, width=10, height=10, fill=color))
        body.append(element("text", phase, x=cursor + 14, y=legend_y, fill=MUTED))
        cursor += 24 + 7 * len(phase)
    body.append(element("text", f"{hi - lo:.3g} s shown", x=LABEL + WIDTH - 80, y=legend_y, fill=MUTED))
    return document(LABEL + WIDTH + 20, height, body, f"{title}: {len(workers)} workers{steps}")
