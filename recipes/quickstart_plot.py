"""The quickstart's figure: training reward and validation accuracy per step, as a PNG.

matplotlib draws it when installed (it is not in requirements-cpu.txt: the CPU stack stays lean).
Without it, a ~100-line fallback draws the same two curves on a fixed [0, 1] grid and writes the PNG
with zlib alone (no Pillow): axes, grid lines every 0.25, training reward in blue, validation
accuracy in orange with dots, and the numbers at both ends of each curve in a 3×5 pixel digit font.
"""

from __future__ import annotations

import struct
import zlib

BLUE, ORANGE, GREY, BLACK, WHITE = (31, 119, 180), (255, 127, 14), (220, 220, 220), (0, 0, 0), (255, 255, 255)

# 3×5 digits (and '.', '%'), rows top to bottom, 3 bits per row
_FONT = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7), "4": (5, 5, 7, 1, 1),
    "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1), "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7),
    ".": (0, 0, 0, 0, 2), "%": (5, 1, 2, 4, 5),
}


def png_bytes(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (rows of (r, g, b)), filter type 0 on every row."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


class Canvas:
    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.px = [[WHITE] * width for _ in range(height)]

    def dot(self, x: int, y: int, color, r: int = 0) -> None:
        for dy in range(-r, r + 1):
            for dx in range(-r, r + 1):
                if 0 <= x + dx < self.w and 0 <= y + dy < self.h:
                    self.px[y + dy][x + dx] = color

    def line(self, x0, y0, x1, y1, color) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(n + 1):
            self.dot(round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n), color)

    def text(self, x: int, y: int, s: str, color=BLACK, scale: int = 2) -> None:
        for ch in s:
            for row, bits in enumerate(_FONT.get(ch, (0,) * 5)):
                for col in range(3):
                    if bits >> (2 - col) & 1:
                        for sy in range(scale):
                            for sx in range(scale):
                                self.dot(x + col * scale + sx, y + row * scale + sy, color)
            x += 4 * scale


def _builtin_png(path: str, reward, val) -> None:
    w, h, left, right, top, bottom = 640, 400, 50, 20, 20, 40
    c = Canvas(w, h)
    steps = [s for s, _ in reward] + [s for s, _ in val]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    hi = hi if hi > lo else lo + 1
    sx = lambda s: round(left + (s - lo) / (hi - lo) * (w - left - right))  # noqa: E731
    sy = lambda v: round(h - bottom - max(0.0, min(1.0, v)) * (h - top - bottom))  # noqa: E731
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        c.line(left, sy(frac), w - right, sy(frac), GREY)
        c.text(4, sy(frac) - 5, f"{frac:.2f}")
    c.line(left, top, left, h - bottom, BLACK)
    c.line(left, h - bottom, w - right, h - bottom, BLACK)
    c.text(left, h - bottom + 8, str(lo))
    c.text(w - right - 8 * len(str(hi)), h - bottom + 8, str(hi))
    for points, color, r in ((reward, BLUE, 0), (val, ORANGE, 2)):
        for (s0, v0), (s1, v1) in zip(points, points[1:]):
            c.line(sx(s0), sy(v0), sx(s1), sy(v1), color)
        for s, v in points:
            c.dot(sx(s), sy(v), color, r)
        if points:  # first and last value, as percentages, next to the curve
            c.text(sx(points[0][0]) + 4, sy(points[0][1]) - 14, f"{points[0][1] * 100:.0f}%", color)
            c.text(sx(points[-1][0]) - 40, sy(points[-1][1]) - 14, f"{points[-1][1] * 100:.0f}%", color)
    with open(path, "wb") as f:
        f.write(png_bytes(c.px))


def write_curves_png(path: str, reward: list, val: list, title: str = "") -> str:
    """Write the figure; returns the backend used ("matplotlib" or "builtin")."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _builtin_png(path, reward, val)
        return "builtin"
    fig, ax = plt.subplots(figsize=(7, 4))
    if reward:
        ax.plot(*zip(*reward), color="tab:blue", label="training reward (mean)")
    if val:
        ax.plot(*zip(*val), "o-", color="tab:orange", label="validation accuracy (greedy)")
    ax.set(xlabel="step", ylabel="score", ylim=(0, 1), title=title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"


GREEN = (44, 160, 44)


def _builtin_panels(path: str, panels: list) -> None:
    """Panels stacked vertically, each with its own y range; series as (label, points, color)."""
    w, panel_h, left, right, top, bottom = 640, 220, 50, 20, 16, 30
    c = Canvas(w, panel_h * len(panels))
    steps = [s for _, _, series in panels for _, pts, _ in series for s, _ in pts]
    lo, hi = (min(steps), max(steps)) if steps else (0, 1)
    hi = hi if hi > lo else lo + 1
    sx = lambda s: round(left + (s - lo) / (hi - lo) * (w - left - right))  # noqa: E731
    for k, (_, (y0, y1), series) in enumerate(panels):
        base = k * panel_h
        sy = lambda v: round(base + panel_h - bottom - (min(max(v, y0), y1) - y0) / (y1 - y0) * (panel_h - top - bottom))  # noqa: E731
        for frac in (0.0, 0.5, 1.0):
            v = y0 + frac * (y1 - y0)
            c.line(left, sy(v), w - right, sy(v), GREY)
            c.text(4, sy(v) - 5, f"{v:.1f}")
        c.line(left, base + top, left, base + panel_h - bottom, BLACK)
        for _, points, color in series:
            for (s0, v0), (s1, v1) in zip(points, points[1:]):
                c.line(sx(s0), sy(v0), sx(s1), sy(v1), color)
            for s, v in points:
                c.dot(sx(s), sy(v), color, 1)
    c.text(left, len(panels) * panel_h - bottom + 8, str(lo))
    c.text(w - right - 8 * len(str(hi)), len(panels) * panel_h - bottom + 8, str(hi))
    with open(path, "wb") as f:
        f.write(png_bytes(c.px))


def write_panels_png(path: str, panels: list, title: str = "") -> str:
    """Stacked panels sharing the step axis: ``panels`` = [(y label, (y min, y max), [(label, [(step, value)],
    (r, g, b)), ...]), ...]. Returns the backend used ("matplotlib" or "builtin")."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _builtin_panels(path, panels)
        return "builtin"
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.6 * len(panels)), sharex=True)
    for ax, (ylabel, ylim, series) in zip(list(axes) if len(panels) > 1 else [axes], panels):
        for label, points, color in series:
            if points:
                ax.plot(*zip(*points), "o-" if len(points) < 30 else "-", color=[c / 255 for c in color], label=label,
                        markersize=3)
        ax.set(ylabel=ylabel, ylim=ylim)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    axes_list = list(axes) if len(panels) > 1 else [axes]
    axes_list[0].set_title(title)
    axes_list[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return "matplotlib"
