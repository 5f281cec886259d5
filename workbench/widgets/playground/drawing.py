"""The playground's pictures: the decision boundary and each neuron's heat map as PNG (NumPy and zlib
alone), the network and the loss chart as SVG.

Colours are TensorFlow Playground's: orange for negative values (label 0), blue for positive
ones (label 1), white in between.
"""

from __future__ import annotations

import base64
import html
import struct
import zlib

import numpy as np

from workbench import datasets
from workbench.widgets.playground.model import PlaygroundModel

NEGATIVE = np.array([245, 147, 34], dtype=float)  # label 0, orange
POSITIVE = np.array([8, 119, 189], dtype=float)  # label 1, blue
WHITE = np.array([255, 255, 255], dtype=float)


def signed_colors(values: np.ndarray, strength: float = 1.0) -> np.ndarray:
    """RGB (float) of values in [-1, 1]: orange below 0, blue above, white at 0 (``strength``: how
    strong the colour of -1 and 1 is). Looked up in a table of 511 shades, so whole images are quick."""
    levels = np.linspace(-1.0, 1.0, 511)[:, None]
    table = WHITE + (np.where(levels > 0, POSITIVE, NEGATIVE) - WHITE) * (np.abs(levels) * strength)
    index = np.rint((np.clip(np.nan_to_num(values), -1.0, 1.0) + 1.0) * 255.0).astype(np.intp)
    return table[index]


def upsample(grid: np.ndarray, size: int) -> np.ndarray:
    """A square grid of cell values resized to ``size`` x ``size`` pixels by bilinear interpolation
    between cell centers (a smooth picture, not blocks)."""
    n = grid.shape[0]
    at = np.clip((np.arange(size) + 0.5) * n / size - 0.5, 0, n - 1)
    lo = np.floor(at).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    t = at - lo
    rows = grid[lo] * (1 - t)[:, None] + grid[hi] * t[:, None]
    return rows[:, lo] * (1 - t)[None, :] + rows[:, hi] * t[None, :]


def output_grid(model: PlaygroundModel, resolution: int) -> np.ndarray:
    """The model's output over the grid on one scale, [-1, 1]: 2p - 1 for a classifier's probability."""
    p = model.predict_grid(resolution)
    return np.clip(p if model.options.problem == "regression" else 2.0 * p - 1.0, -1.0, 1.0)


def boundary_image(model: PlaygroundModel, size: int = 300, resolution: int = 60, show_test: bool = False):
    """An RGB image (uint8, size x size) of the model's output (the decision boundary, for a
    classifier) with the data points on it, coloured by label or value."""
    image = signed_colors(upsample(output_grid(model, resolution), size), 0.6)
    regression = model.options.problem == "regression"
    parts = [(model.data.x_train, model.data.y_train, WHITE)]
    if show_test:
        parts.append((model.data.x_test, model.data.y_test, np.zeros(3)))
    for x, y, outline in parts:
        fill = signed_colors(y) if regression else np.where(y[:, None] == 1, POSITIVE, NEGATIVE)
        _draw_points(image, x, fill, outline)
    return image.round().astype(np.uint8)


def _draw_points(
    image: np.ndarray, x: np.ndarray, colors: np.ndarray, outline: np.ndarray, radius: float = 3.0
) -> None:
    """Discs of ``colors`` (one RGB per point) with an ``outline`` ring, all points at once."""
    size = image.shape[0]
    lo, hi = datasets.DOMAIN
    cols = (x[:, 0] - lo) / (hi - lo) * size
    rows = (hi - x[:, 1]) / (hi - lo) * size
    r = int(np.ceil(radius)) + 1
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1].reshape(2, 1, -1)
    py, px = rows.astype(int)[:, None] + dy, cols.astype(int)[:, None] + dx  # (points, pixels of a stamp)
    dist = np.hypot(py + 0.5 - rows[:, None], px + 0.5 - cols[:, None])
    inside = (py >= 0) & (py < size) & (px >= 0) & (px < size)
    ring = inside & (dist > radius) & (dist <= radius + 1)
    disc = inside & (dist <= radius)
    fill = np.broadcast_to(colors[:, None, :], (*py.shape, 3))
    image[py[ring], px[ring]] = outline
    image[py[disc], px[disc]] = fill[disc]


def png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB uint8 image (height, width, 3), written with zlib alone."""
    height, width, _ = image.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], axis=1)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    data = zlib.compress(rows.tobytes(), 1)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def loss_svg(history: list[dict[str, float]], width: int = 300, height: int = 110, max_points: int = 300) -> str:
    """An SVG chart of the training (dark) and test (orange) loss against the step: axes with the
    first and last step and the loss range, and a legend."""
    left, right, top, bottom = 40, 6, 16, 18
    plot_w, plot_h = width - left - right, height - top - bottom
    parts = [f'<rect width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>']
    labels = {"x0": "0", "x1": "step", "y0": "0", "y1": ""}
    if history:
        stride = max(1, -(-len(history) // max_points))
        shown = history[::stride] if history[-1] is history[::stride][-1] else [*history[::stride], history[-1]]
        steps = np.array([r["step"] for r in shown], dtype=float)
        values = {key: np.array([r[key] for r in shown], dtype=float) for key in ("train_loss", "test_loss")}
        finite = np.concatenate([v[np.isfinite(v)] for v in values.values()])
        top_value = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        span = max(steps[-1] - steps[0], 1.0)
        labels = {"x0": f"{steps[0]:.0f}", "x1": f"step {steps[-1]:,.0f}", "y0": "0", "y1": f"{top_value:.3g}"}
        for key, color in [("test_loss", "#f59322"), ("train_loss", "#333333")]:
            xs = left + (steps - steps[0]) / span * plot_w
            ys = (
                top
                + plot_h
                - np.nan_to_num(values[key], nan=top_value, posinf=top_value).clip(0, top_value) / top_value * plot_h
            )
            points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs, ys))
            parts.append(
                f'<polyline class="wb-loss-line" data-series="{key}" fill="none" stroke="{color}" '
                f'stroke-width="1.5" points="{points}"/>'
            )
    axis = 'stroke="#999" stroke-width="1"'
    parts += [
        f'<line class="wb-axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" {axis}/>',
        f'<line class="wb-axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" {axis}/>',
        _text(left - 4, top + 8, labels["y1"], "end"),
        _text(left - 4, top + plot_h, labels["y0"], "end"),
        _text(left, height - 4, labels["x0"], "start"),
        _text(left + plot_w, height - 4, labels["x1"], "end"),
        _text(4, 11, "loss", "start"),
    ]
    for i, (label, color) in enumerate([("train", "#333333"), ("test", "#f59322")]):
        x = left + plot_w - 110 + i * 58
        parts.append(
            f'<g class="wb-legend-item"><line x1="{x}" y1="8" x2="{x + 14}" y2="8" stroke="{color}" '
            f'stroke-width="2"/>{_text(x + 18, 11, f"{label} loss", "start")}</g>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="wb-playground-loss" '
        f'font-family="sans-serif" font-size="10">{"".join(parts)}</svg>'
    )


def _text(x: float, y: float, text: str, anchor: str) -> str:
    return f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="{anchor}" fill="#555">{html.escape(text)}</text>'


# -- the network: features -> neurons -> output, each a heat map, edges by weight ------------------

COLUMN_W, NEURON, ROW_H, HEADER = 110, 40, 50, 18  # a column per layer; neuron squares; their spacing


def heat_map_uri(grid: np.ndarray, scale: float | None = None) -> str:
    """A data URI of a small PNG of ``grid`` coloured on the signed scale (divided by ``scale``,
    by default its largest absolute value when that exceeds 1)."""
    if scale is None:
        scale = max(float(np.max(np.abs(grid))) if grid.size else 1.0, 1.0)
    image = signed_colors(np.nan_to_num(grid) / scale).round().astype(np.uint8)
    return "data:image/png;base64," + base64.b64encode(png(image)).decode("ascii")


def network_svg(model: PlaygroundModel, resolution: int = 20) -> str:
    """The network as TensorFlow Playground draws it: a column of input features, one per hidden
    layer and the output, each neuron a heat map of what it computes over the plane, and every
    weight an edge coloured by its sign (blue positive, orange negative), as thick as it is large."""
    grids = model.neuron_grids(resolution)
    columns = [grids["features"], *[list(layer) for layer in grids["layers"]], [grids["output"]]]
    names = [list(model.options.features), *[[f"{i + 1}" for i in range(len(c))] for c in columns[1:-1]], ["output"]]
    weights = model.weight_values()
    height = HEADER + max(len(c) for c in columns) * ROW_H + 6
    width = len(columns) * COLUMN_W
    center = [
        [(k * COLUMN_W + COLUMN_W / 2, HEADER + j * ROW_H + NEURON / 2) for j in range(len(c))]
        for k, c in enumerate(columns)
    ]
    largest = max((float(np.max(np.abs(w))) for w in weights if w.size), default=1.0) or 1.0
    parts = []
    for k, w in enumerate(weights):
        for i, j in np.ndindex(w.shape):
            (x0, y0), (x1, y1) = center[k][i], center[k + 1][j]
            x0, x1 = x0 + NEURON / 2, x1 - NEURON / 2
            mid = (x0 + x1) / 2
            value = float(w[i, j])
            color = "#0877bd" if value > 0 else "#f59322"
            thickness = 0.5 + 5.5 * abs(value) / largest
            parts.append(
                f'<path class="wb-weight" data-layer="{k}" data-from="{i}" data-to="{j}" data-sign="{"+" if value > 0 else "-"}" '
                f'd="M{x0:.1f},{y0:.1f} C{mid:.1f},{y0:.1f} {mid:.1f},{y1:.1f} {x1:.1f},{y1:.1f}" fill="none" '
                f'stroke="{color}" stroke-width="{thickness:.2f}" stroke-opacity="0.8"><title>weight {value:.3f}</title></path>'
            )
    titles = ["features", *[f"layer {k}" for k in range(1, len(columns) - 1)], "output"]
    for k, (column, title) in enumerate(zip(columns, titles)):
        parts.append(_text(k * COLUMN_W + COLUMN_W / 2, 11, title, "middle"))
        kind = "feature" if k == 0 else "output" if k == len(columns) - 1 else "neuron"
        scale = 1.0 if kind == "output" else None
        for j, grid in enumerate(column):
            x, y = center[k][j][0] - NEURON / 2, center[k][j][1] - NEURON / 2
            parts.append(
                f'<g class="wb-{kind}" data-layer="{k}" data-index="{j}"><title>{html.escape(names[k][j])}</title>'
                f'<image x="{x:.0f}" y="{y:.0f}" width="{NEURON}" height="{NEURON}" preserveAspectRatio="none" '
                f'href="{heat_map_uri(grid, scale)}"/><rect x="{x:.0f}" y="{y:.0f}" width="{NEURON}" height="{NEURON}" '
                f'fill="none" stroke="#888"/></g>'
            )
            if kind == "feature":
                parts.append(_text(x - 3, y + NEURON / 2 + 3, names[k][j], "end"))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 40}" height="{height}" viewBox="-40 0 {width + 40} {height}" '
        f'class="wb-playground-network" font-family="sans-serif" font-size="10">{"".join(parts)}</svg>'
    )
