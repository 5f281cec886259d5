"""The playground's pictures: the decision boundary as a PNG (NumPy and zlib alone), the loss chart as SVG."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from workbench import datasets
from workbench.widgets.playground.model import PlaygroundModel

NEGATIVE = np.array([245, 147, 34], dtype=float)  # label 0, orange
POSITIVE = np.array([8, 119, 189], dtype=float)  # label 1, blue
WHITE = np.array([255, 255, 255], dtype=float)


def boundary_image(model: PlaygroundModel, size: int = 300, resolution: int = 60, show_test: bool = False):
    """An RGB image (uint8, size x size) of the decision boundary with the data points on it."""
    p = model.predict_grid(resolution)[..., None]
    # light tints away from 0.5, white on the boundary; colored per cell, then scaled up
    colors = WHITE + (np.where(p > 0.5, POSITIVE, NEGATIVE) - WHITE) * (np.abs(2.0 * p - 1.0) * 0.6)
    cells = (np.arange(size) * resolution) // size
    image = colors[np.ix_(cells, cells)]
    parts = [(model.data.x_train, model.data.y_train, WHITE)]
    if show_test:
        parts.append((model.data.x_test, model.data.y_test, np.zeros(3)))
    for x, y, outline in parts:
        _draw_points(image, x, y, outline)
    return image.round().astype(np.uint8)


def _draw_points(image: np.ndarray, x: np.ndarray, y: np.ndarray, outline: np.ndarray, radius: float = 3.0) -> None:
    """Discs of the class colors with an ``outline`` ring, all points at once."""
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
    fill = np.broadcast_to(np.where(y[:, None, None] == 1, POSITIVE, NEGATIVE), (*py.shape, 3))
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


def loss_svg(history: list[dict[str, float]], width: int = 300, height: int = 90, max_points: int = 300) -> str:
    """An SVG of the training (dark) and test (orange) loss against the step."""
    lines = []
    if history:
        stride = max(1, -(-len(history) // max_points))
        shown = history[::stride] if history[-1] is history[::stride][-1] else [*history[::stride], history[-1]]
        steps = np.array([r["step"] for r in shown], dtype=float)
        values = {key: np.array([r[key] for r in shown], dtype=float) for key in ("train_loss", "test_loss")}
        finite = np.concatenate([v[np.isfinite(v)] for v in values.values()])
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        span = max(steps[-1] - steps[0], 1.0)
        for key, color in [("test_loss", "#f59322"), ("train_loss", "#333333")]:
            xs = (steps - steps[0]) / span * (width - 2) + 1
            ys = height - 1 - np.nan_to_num(values[key], nan=top, posinf=top).clip(0, top) / top * (height - 2)
            points = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(xs, ys))
            lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" class="wb-playground-loss">'
        f'<rect width="{width}" height="{height}" fill="#fafafa" stroke="#ddd"/>{"".join(lines)}</svg>'
    )
