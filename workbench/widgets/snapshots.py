"""Static pictures of the views: one function per view, from the state the view syncs to its front end.

Each returns a standalone SVG document. The views put it in their mime bundle
next to the widget (:class:`workbench.widgets._base.Snapshot`), so a notebook
shown without a kernel (GitHub, nbviewer, ``nbconvert --to html``, papermill
outputs) still shows what the view showed.

>>> svg = scaling_svg({"planned": [1, 2], "rows": [{"workers": 1, "samples_per_s": 100.0,
...                    "speedup": 1.0, "efficiency": 1.0}], "status": "running"})
>>> svg.startswith("<svg") and "1 of 2 worker counts" in svg
True
"""

from __future__ import annotations

import base64
import html
import math
import re

from workbench.widgets.statistics import stat_fill
from workbench.widgets.svg import BORDER, COLORS, INK, MUTED, document, duration, element, line_chart

# As the graph view's front end draws them (static/graph_view.js).
KIND_FILL = {
    "placeholder": "#ddf4ff",
    "variable": "#dafbe1",
    "constant": "#eaeef2",
    "update": "#fff1e5",
    "group": "#f6f8fa",
    "scope": "#fbefff",
    "op": "#ffffff",
    "collective": "#ffeff7",
}
KIND_STROKE = {
    "placeholder": "#0969da",
    "variable": "#1a7f37",
    "constant": "#8c959f",
    "update": "#bc4c00",
    "group": "#6e7781",
    "scope": "#8250df",
    "op": "#57606a",
    "collective": "#bf3989",
}
STATE_COLOR = {"waiting": "#afb8c1", "running": "#bf8700", "done": "#1a7f37", "error": "#cf222e"}


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def graph_svg(layout: dict, states: dict, values: dict | None = None, scale: dict | None = None) -> str:
    """The graph view: scope boxes, edges, and each visible node with its op, shape and run state;
    filled by a statistic of the model when ``values`` (visible node to value) and its ``scale`` are given."""
    nodes = layout.get("nodes", [])
    by_id = {n["id"]: n for n in nodes}
    folded = layout.get("collapsed") or []
    params = f" · {layout['parameters']:,} parameters" if layout.get("parameters") else ""
    title = f"graph {layout.get('name', '')} · {len(nodes)} nodes{params}" + (
        f" · {len(folded)} scope{'' if len(folded) == 1 else 's'} folded" if folded else ""
    )
    if values and scale:
        title += f" · colour: {scale.get('title', '')} at step {scale.get('step', '')}"
    top = 24
    body = [element("text", title, x=8, y=16, font_weight="600", fill=INK)]
    for box in layout.get("boxes", []):
        body.append(
            element(
                "rect",
                x=box["x"],
                y=box["y"] + top,
                width=box["w"],
                height=box["h"],
                rx=8,
                fill="rgba(84,174,255,0.06)",
                stroke="#54aeff",
                stroke_dasharray="3 3",
            )
        )
        body.append(
            element("text", f"▾ {box['scope']}", x=box["x"] + 6, y=box["y"] + top + 11, font_size=11, fill="#0550ae")
        )
    for edge in layout.get("edges", []):
        a, b = by_id.get(edge["source"]), by_id.get(edge["target"])
        if a is None or b is None:
            continue
        x1, y1, x2, y2 = a["x"] + a["w"] / 2, a["y"] + a["h"] + top, b["x"] + b["w"] / 2, b["y"] + top
        dy = max((y2 - y1) / 2, 20)
        faint = "scope" in (a.get("kind"), b.get("kind"))
        body.append(
            element(
                "path",
                d=f"M {x1} {y1} C {x1} {y1 + dy}, {x2} {y2 - dy}, {x2} {y2}",
                fill="none",
                stroke="#8c959f",
                stroke_width=1.2,
                opacity=0.35 if faint else None,
                stroke_dasharray="3 3" if edge.get("control") else None,
            )
        )
    fills = {k: stat_fill(v, scale) for k, v in (values or {}).items()} if scale else {}
    body += [_graph_node(n, states.get(n["id"]), top, fills.get(n["id"])) for n in nodes]
    width = max(layout.get("width", 0), 8 * len(title) + 16)
    return document(width, layout.get("height", 0) + top, body, title)


def _graph_node(node: dict, state: str | None, top: float, fill: str | None = None) -> str:
    kind, w, h = node.get("kind", "op"), node["w"], node["h"]
    stroke = STATE_COLOR[state] if state in ("error", "running") else KIND_STROKE.get(kind, "#57606a")
    rx = {"placeholder": h / 2, "variable": 0, "constant": 4}.get(kind, 6)
    shape = element(
        "rect",
        width=w,
        height=h,
        rx=rx,
        fill=fill or KIND_FILL.get(kind, "#fff"),
        stroke=stroke,
        stroke_width=2 if kind == "variable" else 1.4,
        stroke_dasharray="2 2" if kind == "constant" else None,
    )
    if kind == "scope":
        params = node.get("parameters") or 0
        sub = (
            f"{node.get('members', 0)} ops · {params:,} params" if params else f"{node.get('members', 0)} ops · folded"
        )
    elif node.get("value"):
        sub = f"{node['value']} · {node.get('shape') or node.get('dtype', '')}"
    else:
        sub = f"{node.get('type', '')} · {node['shape']}" if node.get("shape") else node.get("type", "")
    parts = [
        shape,
        element("text", _clip(str(node.get("label", node["id"])), 22), x=8, y=16, fill=INK),
        element("text", _clip(sub, 26), x=8, y=31, font_size=10, fill=MUTED),
    ]
    if state:
        parts.append(element("circle", cx=w - 9, cy=9, r=5, fill=STATE_COLOR.get(state, "none")))
    return element(
        "g",
        None,
        *parts,
        transform=f"translate({node['x']},{node['y'] + top})",
        data_id=node["id"],
        data_state=state or "",
    )


def progress_line(state: dict) -> str:
    """The training view's progress text: step, share, elapsed time, ETA, samples/s, replicas."""
    steps, step = state.get("steps") or 0, state.get("step") or 0
    share = min(step / steps, 1.0) if steps else 0.0
    line = f"step {step} / {steps} ({round(100 * share)}%) · {duration(state.get('elapsed'))} elapsed"
    if state.get("status") == "running":
        line += f" · ETA {duration(state.get('eta'))}"
    line += f" · {round(state.get('samples_per_s') or 0):,} samples/s"
    for key, text in (("replicas", "replicas"), ("dropped", "dropped"), ("restarts", "restarts")):
        if state.get(key):
            line += f" · {state[key]} {text}"
    if state.get("start"):
        line += f" · resumed at step {state['start']}"
    if state.get("status") == "failed":
        line += f" · failed at {state.get('error', '')}"
    return line


def training_charts(labels) -> list[dict]:
    """TrainingView's metric charts for curve ``labels`` (in order): each label's chart with its
    colour and its validation curve (``val_<label>``, drawn in the metric's chart; None without one)."""
    labels = list(labels)
    shown = [label for label in labels if not (label.startswith("val_") and label[4:] in labels)]
    return [
        {
            "label": label,
            "color": COLORS[i % len(COLORS)],
            "validation": f"val_{label}" if f"val_{label}" in labels else None,
        }
        for i, label in enumerate(shown)
    ]


def training_svg(title: str, state: dict) -> str:
    """The training view: the progress bar and its text, a chart per curve and samples/s, worker utilization."""
    steps, step = state.get("steps") or 0, state.get("step") or 0
    share = min(step / steps, 1.0) if steps else 0.0
    width = 812
    outcome = state.get("outcome") or state.get("status") or "waiting"
    head = f"{title} · {outcome}" + (f" · batch {state['batch_size']}" if state.get("batch_size") else "")
    bar = {"failed": "#cf222e", "interrupted": "#bf8700", "stopped": "#57606a"}.get(state.get("status"), "#2da44e")
    body = [
        element("text", head, x=8, y=16, font_weight="600", fill=INK),
        element("rect", x=8, y=26, width=width - 16, height=20, rx=4, fill="#f6f8fa", stroke=BORDER),
        element("rect", x=8, y=26, width=f"{(width - 16) * share:.1f}", height=20, rx=4, fill=bar, opacity=0.85),
        element("text", progress_line(state), x=14, y=40, fill=INK, data_status=state.get("status", "")),
    ]
    curves = state.get("curves") or {}
    charts = []
    for chart in state.get("charts") or training_charts(curves):  # a state saved before it listed its charts
        series = [(curves.get(chart["label"]) or [], chart["color"], False)]
        if chart["validation"]:  # a validation curve over its metric's, dashed
            series.append((curves.get(chart["validation"]) or [], "#bc4c00", True))
        charts.append((chart["label"], series))
    charts.append(("samples/s", [(state.get("throughput") or [], "#57606a", False)]))
    for i, (label, series) in enumerate(charts):
        title = f"{label} (dashed: validation)" if len(series) > 1 else label
        body.append(line_chart(8 + (i % 3) * 268, 56 + (i // 3) * 138, title, series, x_max=steps))
    y = 56 + (-(-len(charts) // 3)) * 138
    workers = state.get("workers") or {}
    if workers:
        body.append(element("text", "worker utilization (busy time / training time)", x=8, y=y + 12, fill=MUTED))
        for j, (address, busy) in enumerate(workers.items()):
            row = y + 22 + j * 18
            body += [
                element("rect", x=8, y=row, width=120, height=10, fill="#f6f8fa", stroke=BORDER),
                element("rect", x=8, y=row, width=f"{120 * min(max(busy, 0), 1):.1f}", height=10, fill="#0969da"),
                element("text", f"{100 * busy:.0f}%  {address}", x=136, y=row + 9, fill=INK),
            ]
        y += 26 + 18 * len(workers)
    return document(width, y + 4, body, head)


#: Colours of the predicted curves, by strategy (as static/scaling_view.js draws them).
PREDICTED_COLOR = {"allreduce": "#1a7f37", "parameter_server": "#bc4c00"}
COLOR_NAMES = {"#1a7f37": "green", "#bc4c00": "orange", "#8250df": "purple", "#bf3989": "pink", "#0969da": "blue"}


def _predicted_series(predicted: list[dict], key: str, at) -> list:
    strategies = list(dict.fromkeys(r["strategy"] for r in predicted))
    return [
        (
            [[at(r["workers"]), r[key]] for r in predicted if r["strategy"] == s],
            PREDICTED_COLOR.get(s, COLORS[3 + i % 3]),
            True,
        )
        for i, s in enumerate(strategies)
    ]


def scaling_svg(state: dict) -> str:
    """The scaling view: samples/s and speedup against workers beside the ideal line, and the table;
    with predictions, each strategy's as a dashed continuation (worker counts on a log scale, efficiency
    in place of speedup) and the assumptions under the charts."""
    rows, planned = state.get("rows") or [], state.get("planned") or []
    predicted, assumptions = state.get("predicted") or [], state.get("assumptions") or []
    head = (
        f"scaling study · {state.get('status') or 'waiting'} · {len(rows)} of {len(planned) or len(rows)} worker counts"
    )
    counts = sorted({*planned, *(r["workers"] for r in rows)})
    every = sorted({*counts, *(r["workers"] for r in predicted)})
    at = (lambda n: math.log2(n)) if predicted else (lambda n: n)  # noqa: E731
    ticks = [(at(n), n) for n in every] if predicted else counts
    base = counts[0] if counts else 1
    base_rate = rows[0]["samples_per_s"] if rows and rows[0]["workers"] == base else None
    series = [([[at(r["workers"]), r["samples_per_s"]] for r in rows], "#0969da", False)]
    if base_rate and not predicted:  # with predictions the efficiency chart shows the ideal
        series.append(([[at(n), base_rate * n / base] for n in counts], "#8c959f", True))
    key, label = (
        ("efficiency", "efficiency (dashed: ideal, predicted)") if predicted else ("speedup", "speedup (dashed: ideal)")
    )
    ideal = (lambda n: 1.0) if predicted else (lambda n: n / base)  # noqa: E731
    second = [
        ([[at(r["workers"]), r[key]] for r in rows], "#0969da", False),
        ([[at(n), ideal(n)] for n in every], "#8c959f", True),
    ]
    series += _predicted_series(predicted, "samples_per_s", at)
    second += _predicted_series(predicted, key, at)
    title = "samples/s (dashed: predicted)" if predicted else "samples/s (dashed: ideal)"
    body = [
        element("text", head, x=8, y=16, font_weight="600", fill=INK),
        line_chart(8, 26, title, series, x_label="workers", width=300, height=180, zero=True, ticks=ticks),
        line_chart(316, 26, label, second, x_label="workers", width=300, height=180, zero=True, ticks=ticks),
    ]
    body += _scaling_table(rows, counts, base, predicted)
    lines = _legend(predicted) + [f"assumes {a}" for a in assumptions]
    body += [element("text", line, x=8, y=226 + 16 * i, fill=MUTED) for i, line in enumerate(lines)]
    table_rows = len(counts) + len({(r["workers"], r["strategy"]) for r in predicted if r["workers"] not in counts})
    return document(1010 if predicted else 960, max(212 + 16 * len(lines) + 8, 72 + 18 * table_rows), body, head)


def _legend(predicted: list[dict]) -> list[str]:
    strategies = list(dict.fromkeys(r["strategy"] for r in predicted))
    colors = [COLOR_NAMES.get(PREDICTED_COLOR.get(s, COLORS[3 + i % 3]), "") for i, s in enumerate(strategies)]
    return [f"predicted, dashed: {', '.join(f'{s} ({c})' for s, c in zip(strategies, colors))}"] if strategies else []


def _scaling_table(rows: list[dict], counts: list[int], base: int, predicted: list[dict]) -> list[str]:
    columns = (
        (("workers", 0), ("samples/s", 140), ("speedup", 210), ("ideal", 270), ("efficiency", 320))
        if predicted
        else (("workers", 0), ("samples/s", 60), ("speedup", 140), ("ideal", 205), ("efficiency", 255))
    )
    body = [element("text", name, x=632 + dx, y=44, font_weight="600", fill=INK) for name, dx in columns]
    by_count = {r["workers"]: r for r in rows}
    lines = []
    for n in counts:
        r = by_count.get(n)
        lines.append(
            (
                [n, f"{r['samples_per_s']:,.0f}", f"{r['speedup']:.2f}×", f"{n / base:.2f}×", f"{r['efficiency']:.0%}"]
                if r
                else [n, "…", "…", f"{n / base:.2f}×", "…"],
                INK,
            )
        )
    for r in predicted:
        if r["workers"] not in counts:
            cells = [
                f"{r['workers']} {r['strategy']}",
                f"{r['samples_per_s']:,.0f}",
                f"{r['speedup']:.2f}×",
                f"{r['workers'] / base:.2f}×",
                f"{r['efficiency']:.0%}",
            ]
            lines.append((cells, PREDICTED_COLOR.get(r["strategy"], MUTED)))
    for i, (cells, color) in enumerate(lines):
        body += [element("text", str(c), x=632 + dx, y=64 + 18 * i, fill=color) for c, (_, dx) in zip(cells, columns)]
    return body


def _bytes(n) -> str:
    if not n:
        return "–"
    units, i = ["B", "KiB", "MiB", "GiB", "TiB"], 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n:.{0 if n >= 10 else 1}f} {units[i]}"


def cluster_svg(info: dict | None, message: str = "") -> str:
    """The cluster view: scheduler, totals, the dashboard link (or why there is none), the workers."""
    if not info:
        text = message or "no default cluster"
        return document(max(300, 7 * len(text) + 16), 28, [element("text", text, x=8, y=18, fill=INK)], text)
    workers = info.get("workers") or []
    if info.get("closed"):
        state = info["closed"] if isinstance(info["closed"], str) else "closed"
        head = f"Dask cluster {info.get('scheduler', '')} · {state}"
        body = [element("text", head, x=8, y=16, font_weight="600", fill=INK)]
        body += [element("text", message, x=8, y=36, fill=MUTED)] if message else []
        return document(max(420, 7 * max(len(head), len(message)) + 16), 48, body, head)
    total = {k: sum(w.get(k) or 0 for w in workers) for k in ("threads", "memory", "gpus")}
    head = (
        f"Dask cluster {info.get('scheduler', '')} · {len(workers)} workers · {total['threads']} threads · "
        f"{_bytes(total['memory'])}" + (f" · {total['gpus']} GPUs" if total["gpus"] else "")
    )
    lines = [message] if message else []
    if info.get("dashboard"):
        lines.append(f"dashboard: {info['dashboard']}")
    if info.get("workbench_page"):
        lines.append(f"training page: {info['workbench_page']}")
    if info.get("dashboard_note"):
        lines.append(info["dashboard_note"])
    body = [element("text", head, x=8, y=16, font_weight="600", fill=INK)]
    body += [element("text", line, x=8, y=36 + 16 * i, fill=MUTED) for i, line in enumerate(lines)]
    y = 40 + 16 * len(lines)
    columns = (("worker", 0), ("address", 90), ("threads", 330), ("memory", 400), ("GPUs", 480))
    body += [element("text", name, x=8 + dx, y=y + 12, font_weight="600", fill=INK) for name, dx in columns]
    for i, w in enumerate(workers):
        cells = [
            w.get("name", ""),
            w.get("address", ""),
            w.get("threads", ""),
            _bytes(w.get("memory")),
            w.get("gpus", 0),
        ]
        body += [
            element("text", _clip(str(c), 34), x=8 + dx, y=y + 30 + 18 * i, fill=INK)
            for c, (_, dx) in zip(cells, columns)
        ]
    width = max(560, 7 * max(len(head), *(len(line) for line in lines or [""])) + 16)
    return document(width, y + 20 + 18 * len(workers), body, head)


def playground_svg(image_png: bytes, image_size: int, curves_svg: str, status_html: str, network_svg: str = "") -> str:
    """The playground's plots: the network (when drawn), the decision boundary image, the loss
    curves and the status line."""
    status = html.unescape(re.sub(r"<br\s*/?>", "\n", re.sub(r"<(?!br)[^>]*>", "", status_html)))
    lines = [line for line in status.split("\n") if line.strip()]
    left = _svg_width(network_svg) + 12 if network_svg else 0
    body = [re.sub(r"^<svg ", '<svg x="0" y="0" ', network_svg)] if network_svg else []
    if image_png:
        href = "data:image/png;base64," + base64.b64encode(image_png).decode("ascii")
        body.append(element("image", href=href, x=left, y=0, width=image_size, height=image_size))
    if curves_svg:
        body.append(re.sub(r"^<svg ", f'<svg x="{left}" y="{image_size + 8}" ', curves_svg))
    top = max(image_size + _svg_height(curves_svg), _svg_height(network_svg))
    body += [
        element("text", line, x=0, y=top + 26 + 16 * i, fill="#c00" if i else INK, font_family="monospace")
        for i, line in enumerate(lines)
    ]
    width = max(left + image_size, 7.5 * max((len(line) for line in lines), default=0))
    return document(width, top + 34 + 16 * len(lines), body, lines[0] if lines else "playground")


def _svg_width(svg: str) -> int:
    match = re.search(r'width="(\d+)', svg)
    return int(float(match.group(1))) if match else 0


def _svg_height(svg: str) -> int:
    match = re.search(r'height="(\d+)', svg)
    return int(match.group(1)) if match else 0
