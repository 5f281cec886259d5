"""Writing SVG as text: elements, numbers as the views show them, and a line chart.

The static pictures of the views (:mod:`workbench.widgets.snapshots`) are built
from these, so a saved notebook shows them without a kernel or a browser script.

>>> element("rect", width=4, height=2, fill="#fff")
'<rect width="4" height="2" fill="#fff"/>'
>>> element("text", "a < b", x=1)
'<text x="1">a &lt; b</text>'
"""

from __future__ import annotations

import html
import re
import math

FONT = "-apple-system, BlinkMacSystemFont, 'Segoe UI', Helvetica, Arial, sans-serif"
INK, MUTED, BORDER, AXIS = "#1f2328", "#656d76", "#d0d7de", "#8c959f"
COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#bf3989")


def _attr(name: str) -> str:
    return name.rstrip("_").replace("_", "-")


_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffe\uffff]")


def xml_text(text: str) -> str:
    r"""``text`` escaped for XML, its control characters (which XML 1.0 cannot hold) shown as ``\xNN``.

    >>> xml_text("a<b\x07")
    'a&lt;b\\x07'
    """
    return html.escape(_NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text))


def element(tag: str, text: str | None = None, *children: str, **attrs) -> str:
    """One SVG element: ``text`` is escaped, ``children`` are SVG already; ``stroke_width=`` writes
    ``stroke-width``, ``class_=`` writes ``class``; attributes that are None are left out."""
    parts = "".join(f' {_attr(k)}="{xml_text(str(v))}"' for k, v in attrs.items() if v is not None)
    inner = (xml_text(text) if text is not None else "") + "".join(children)
    return f"<{tag}{parts}>{inner}</{tag}>" if inner else f"<{tag}{parts}/>"


def document(width: float, height: float, body: list[str], label: str) -> str:
    """A standalone SVG document with a white background; ``label`` is its accessible title."""
    width, height = math.ceil(width), math.ceil(height)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{html.escape(FONT)}" font-size="12" '
        f'class="wb-snapshot" role="img" aria-label="{xml_text(label)}">'
        + element("title", label)
        + element("rect", width=width, height=height, fill="#ffffff")
        + "".join(body)
        + "</svg>"
    )


def number(v) -> str:
    """A value as the views print it: compact when large, scientific when tiny, '–' when missing."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "–"
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e4:
        for limit, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
            if a >= limit:
                return f"{v / limit:.1f}".rstrip("0").rstrip(".") + suffix
    if a < 1e-3:
        return f"{v:.2e}"
    return f"{v:.0f}" if a >= 100 else f"{v:.3f}" if a >= 1 else f"{v:.4f}"


def duration(seconds) -> str:
    """Seconds as '4.2 s', '3 min 5 s' or '2 h 10 min'."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "–"
    if seconds < 60:
        return f"{seconds:.{1 if seconds < 10 else 0}f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min {round(seconds % 60)} s"
    return f"{minutes // 60} h {minutes % 60} min"


def line_chart(
    x: float,
    y: float,
    label: str,
    series: list[tuple[list, str, bool]],
    x_max=None,
    x_label: str = "step",
    width: int = 260,
    height: int = 130,
    zero: bool = False,
    ticks=None,
) -> str:
    """A chart at (x, y) of ``series``: (points [[x, y], ...], color, dashed) each; the first series'
    last value is in the label. ``zero`` starts the value axis at 0; ``ticks`` labels those x values
    (a ``(value, label)`` pair writes its own label)."""
    left, right, top, bottom = 44, 8, 18, 18 if ticks is None else 28
    points = [p for pts, _, _ in series for p in pts if _finite(p[1])]
    first = [p for p in (series[0][0] if series else []) if _finite(p[1])]
    title = f"{label}: {number(first[-1][1])}" if first and ticks is None else label
    body = [element("text", title, x=left, y=12)]
    if points:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        x0, x1 = min(xs), max([*xs, x_max or 0])
        y0, y1 = (0.0 if zero else min(ys)), max(ys) * (1.1 if zero else 1.0)
        if y0 == y1:
            y0, y1 = y0 - (abs(y0) * 0.1 or 1), y1 + (abs(y1) * 0.1 or 1)

        def sx(v):
            return left + (0.5 if x1 == x0 else (v - x0) / (x1 - x0)) * (width - left - right)

        def sy(v):
            return top + (1 - (v - y0) / (y1 - y0)) * (height - top - bottom)

        axis = {"stroke": AXIS, "stroke_width": 1}
        body += [
            element("line", x1=left, y1=height - bottom, x2=width - right, y2=height - bottom, **axis),
            element("line", x1=left, y1=top, x2=left, y2=height - bottom, **axis),
            element("text", number(y1), x=left - 4, y=top + 8, text_anchor="end", fill=MUTED),
            element("text", number(y0), x=left - 4, y=height - bottom, text_anchor="end", fill=MUTED),
        ]
        if ticks is None:
            body.append(
                element("text", f"{x_label} {round(x1)}", x=width - right, y=height - 4, text_anchor="end", fill=MUTED)
            )
        else:
            body += [
                element("text", str(text), x=f"{sx(t):.1f}", y=height - bottom + 12, text_anchor="middle", fill=MUTED)
                for t, text in (t if isinstance(t, tuple) else (t, t) for t in ticks)
            ]
            body.append(
                element("text", x_label, x=(left + width - right) / 2, y=height - 3, text_anchor="middle", fill=MUTED)
            )
        for pts, color, dashed in series:
            pts = [p for p in pts if _finite(p[1])]
            if pts:
                d = " ".join(f"{'L' if i else 'M'} {sx(a):.1f} {sy(b):.1f}" for i, (a, b) in enumerate(pts))
                body.append(
                    element(
                        "path",
                        d=d,
                        fill="none",
                        stroke=color,
                        stroke_width=1.5,
                        stroke_dasharray="5 4" if dashed else None,
                        class_="wb-line",
                    )
                )
    return element("g", None, *body, transform=f"translate({x},{y})", class_="wb-chart", data_curve=label)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
