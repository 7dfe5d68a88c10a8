"""Terminal plots with no dependencies: line charts in Braille dots, decision boundaries in cells.

Each function returns a string (print it). Colour is ANSI and optional: with
``color=False`` the output is plain text, identical on every terminal.
A PNG version of the same figures is available through :func:`save_png` when
matplotlib is installed.

Example:
    >>> print(line_chart([3.0, 2.0, 1.5, 1.2, 1.1], width=10, height=3, title="loss"))
    ... # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

# Braille cell = 2 columns x 4 rows of dots; bit of the dot at (column, row) in U+2800 + bits.
_BRAILLE_BASE = 0x2800
_BRAILLE_BITS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))

# Per class: marker for data points, ANSI colour of points, ANSI background of the region.
_MARKERS = "ox+#%@&$"
_POINT_COLORS = (27, 160, 28, 130, 90, 30, 94, 240)
_REGION_COLORS = (153, 217, 151, 223, 183, 159, 230, 252)
_REGION_PLAIN = " .:-=~^'"  # region fill without colour, one character per class
_RESET = "\x1b[0m"


def use_color(stream: Any = None) -> bool:
    """True when ``stream`` (default stdout) is a terminal and ``NO_COLOR`` is unset."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and "NO_COLOR" not in os.environ


def format_number(value: float) -> str:
    """A short label for an axis tick: 4 significant digits, scientific when tiny or huge.

    Example:
        >>> format_number(0.000123), format_number(12.5), format_number(0.0)
        ('1.23e-04', '12.5', '0')
    """
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.2e}"
    return f"{value:.4g}"


# --- line charts ----------------------------------------------------------------------


class BrailleCanvas:
    """A ``width`` x ``height`` character grid with 2x4 addressable dots per character.

    Dot coordinates are ``(column, row)`` with row 0 at the top.
    """

    def __init__(self, width: int, height: int) -> None:
        if width < 1 or height < 1:
            raise ValueError(f"canvas needs a positive size, got {width}x{height}")
        self.width, self.height = width, height
        self.cells = [[0] * width for _ in range(height)]

    @property
    def dot_width(self) -> int:
        return 2 * self.width

    @property
    def dot_height(self) -> int:
        return 4 * self.height

    def set(self, column: int, row: int) -> None:
        """Light one dot (coordinates outside the canvas are ignored)."""
        if 0 <= column < self.dot_width and 0 <= row < self.dot_height:
            self.cells[row // 4][column // 2] |= _BRAILLE_BITS[column % 2][row % 4]

    def line(self, c0: int, r0: int, c1: int, r1: int) -> None:
        """Light the dots of the straight segment between two dots (both ends included)."""
        steps = max(abs(c1 - c0), abs(r1 - r0), 1)
        for k in range(steps + 1):
            self.set(round(c0 + (c1 - c0) * k / steps), round(r0 + (r1 - r0) * k / steps))

    def is_set(self, column: int, row: int) -> bool:
        return bool(self.cells[row // 4][column // 2] & _BRAILLE_BITS[column % 2][row % 4])

    def rows(self) -> list[str]:
        """The canvas as text lines (an empty cell is a blank Braille pattern)."""
        return ["".join(chr(_BRAILLE_BASE + bits) for bits in row) for row in self.cells]


def _value_range(values: Sequence[float], log_y: bool, y_min: float | None) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v) and (v > 0 or not log_y)]
    if not finite:
        raise ValueError(
            "line_chart: no finite values to plot" + (" (log scale needs > 0)" if log_y else "")
        )
    lo, hi = min(finite), max(finite)
    if y_min is not None and not log_y:
        lo = min(lo, y_min)
    if log_y:
        lo, hi = math.log10(lo), math.log10(hi)
    if hi == lo:  # a flat series: centre it in a band of +-1 (or +-10% of its magnitude)
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return lo, hi


def line_chart(
    values: Sequence[float],
    *,
    width: int = 60,
    height: int = 10,
    title: str = "",
    x_label: str = "step",
    log_y: bool = False,
    y_min: float | None = None,
) -> str:
    """Plot a series as a connected Braille line with labelled axes.

    Point ``i`` of ``n`` is placed at dot column ``round(i * (2*width - 1) / (n - 1))``;
    the largest value is on the top dot row, the smallest on the bottom one.
    Non-finite values (and non-positive ones with ``log_y``) leave a gap.

    Args:
        values: the series (e.g. loss per step).
        width: plot width in characters (2 dots each).
        height: plot height in characters (4 dots each).
        title: printed above the chart.
        x_label: name of the horizontal axis.
        log_y: logarithmic vertical axis.
        y_min: extend the vertical axis down to this value (e.g. 0 for a loss);
            ignored with ``log_y``.
    Returns:
        the chart as a multi-line string.
    Example:
        >>> chart = line_chart([1.0, 0.5, 0.25], width=8, height=2, title="loss")
        >>> chart.splitlines()[0]
        'loss'
    """
    if not values:
        raise ValueError("line_chart: the series is empty")
    lo, hi = _value_range(values, log_y, y_min)
    canvas = BrailleCanvas(width, height)
    n = len(values)

    def dot(i: int, v: float) -> tuple[int, int] | None:
        if not math.isfinite(v) or (log_y and v <= 0):
            return None
        y = math.log10(v) if log_y else v
        column = round(i * (canvas.dot_width - 1) / max(n - 1, 1))
        row = round((hi - y) / (hi - lo) * (canvas.dot_height - 1))
        return column, row

    previous: tuple[int, int] | None = None
    for i, v in enumerate(values):
        current = dot(i, v)
        if current is not None:
            if previous is not None:
                canvas.line(*previous, *current)
            else:
                canvas.set(*current)
        previous = current
    return _frame(canvas.rows(), lo, hi, n, title, x_label, log_y)


def _frame(
    rows: list[str], lo: float, hi: float, n: int, title: str, x_label: str, log_y: bool
) -> str:
    """Add the y tick labels (top/bottom), a left axis, a bottom axis and x tick labels."""
    top = format_number(10**hi if log_y else hi)
    bottom = format_number(10**lo if log_y else lo)
    margin = max(len(top), len(bottom))
    lines = [title] if title else []
    for k, row in enumerate(rows):
        label = top if k == 0 else bottom if k == len(rows) - 1 else ""
        lines.append(f"{label:>{margin}} ┤{row}")
    width = len(rows[0])
    lines.append(" " * margin + " └" + "─" * width)
    last = str(max(n - 1, 0))
    room = width - 1 - len(last)
    # keep a blank on both sides of the axis name so the tick labels stay separate words
    name = f" {x_label} ".center(room) if room >= len(x_label) + 2 else " " * max(room, 1)
    axis = "0" + name + last
    lines.append(" " * (margin + 2) + axis + (" (log y)" if log_y else ""))
    return "\n".join(lines)


# --- decision boundaries ----------------------------------------------------------------


@dataclass(frozen=True)
class Extent:
    """The plotted rectangle of the plane: ``x`` in [x_min, x_max], ``y`` in [y_min, y_max]."""

    x_min: float
    x_max: float
    y_min: float
    y_max: float

    @staticmethod
    def around(points: npt.NDArray[Any], margin: float = 0.1) -> Extent:
        """The bounding box of ``points`` (n, 2) grown by ``margin`` of its size on every side."""
        lo, hi = points.min(axis=0).astype(float), points.max(axis=0).astype(float)
        pad = (hi - lo) * margin + 1e-9
        return Extent(lo[0] - pad[0], hi[0] + pad[0], lo[1] - pad[1], hi[1] + pad[1])

    def cell_centers(self, width: int, height: int) -> npt.NDArray[np.float32]:
        """Centres of a ``height`` x ``width`` grid of cells, row-major from the top, shape (h*w, 2)."""
        xs = self.x_min + (np.arange(width) + 0.5) * (self.x_max - self.x_min) / width
        ys = self.y_max - (np.arange(height) + 0.5) * (self.y_max - self.y_min) / height
        gx, gy = np.meshgrid(xs, ys)
        return np.stack([gx.ravel(), gy.ravel()], axis=1).astype(np.float32)

    def cell_of(self, points: npt.NDArray[Any], width: int, height: int) -> npt.NDArray[np.int64]:
        """(row, column) of the cell holding each point, shape (n, 2); clipped to the grid."""
        column = np.floor((points[:, 0] - self.x_min) / (self.x_max - self.x_min) * width)
        row = np.floor((self.y_max - points[:, 1]) / (self.y_max - self.y_min) * height)
        cells = np.stack([row, column], axis=1).astype(np.int64)
        return np.clip(cells, 0, [height - 1, width - 1])


def decision_boundary(
    classify: Callable[[npt.NDArray[np.float32]], npt.ArrayLike],
    points: npt.NDArray[Any],
    labels: npt.NDArray[Any],
    *,
    width: int = 64,
    height: int = 24,
    title: str = "",
    color: bool = False,
) -> str:
    """Draw the regions a classifier assigns to the plane, with the data points on top.

    Each character cell is filled with the class ``classify`` gives its centre
    (plain: ``' '`` class 0, ``'.'`` class 1, ...; colour: a pale background).
    A cell holding data points shows the marker of their class (``o``, ``x``,
    ``+``, ...) or ``*`` when it holds several classes.

    Args:
        classify: maps cell centres, float32 (m, 2), to integer classes (m,).
        points: the data, shape (n, 2).
        labels: integer class of each point, shape (n,).
        width, height: size of the grid in characters.
        title: printed above the plot.
        color: use ANSI colours (see :func:`use_color`).
    Returns:
        the plot as a multi-line string, with a legend line at the end.
    Example:
        >>> pts = np.array([[0.0, 0.0], [1.0, 1.0]])
        >>> text = decision_boundary(lambda c: c[:, 0] > 0.5, pts, np.array([0, 1]), width=4, height=2)
        >>> text.splitlines()[1:3]
        ['│  .x│', '│o ..│']
    """
    points = np.asarray(points)
    labels = np.asarray(labels).astype(np.int64)
    if points.ndim != 2 or points.shape[1] != 2 or len(points) != len(labels):
        raise ValueError(
            f"decision_boundary: need points (n, 2) and labels (n,), got {points.shape} and {labels.shape}"
        )
    extent = Extent.around(points)
    regions = np.asarray(classify(extent.cell_centers(width, height))).astype(np.int64)
    regions = regions.reshape(height, width)
    marks = _point_marks(extent.cell_of(points, width, height), labels, width, height)
    lines = [title] if title else []
    lines.append("┌" + "─" * width + "┐")
    for r in range(height):
        cells = [_cell(int(regions[r, c]), int(marks[r, c]), color) for c in range(width)]
        lines.append("│" + _join_styled(cells) + "│")
    lines.append("└" + "─" * width + "┘")
    classes = sorted(set(labels.tolist()) | set(regions.ravel().tolist()))
    legend = "  ".join(
        f"{_MARKERS[k % len(_MARKERS)]} class {k} (region '{_REGION_PLAIN[k % len(_REGION_PLAIN)]}')"
        if not color
        else f"{_MARKERS[k % len(_MARKERS)]} class {k}"
        for k in classes
    )
    lines.append(legend + "   * mixed cell")
    return "\n".join(lines)


def _point_marks(
    cells: npt.NDArray[np.int64], labels: npt.NDArray[np.int64], width: int, height: int
) -> npt.NDArray[np.int64]:
    """Per cell: -1 no point, k all points of class k, -2 points of several classes."""
    marks = np.full((height, width), -1, dtype=np.int64)
    for (r, c), k in zip(cells.tolist(), labels.tolist(), strict=True):
        if marks[r, c] == -1:
            marks[r, c] = k
        elif marks[r, c] != k:
            marks[r, c] = -2
    return marks


def _cell(region: int, mark: int, color: bool) -> tuple[str, str]:
    """(ANSI style, character) of one cell; the style is empty without colour."""
    if mark == -1:
        char = _REGION_PLAIN[region % len(_REGION_PLAIN)] if not color else " "
    else:
        char = "*" if mark == -2 else _MARKERS[mark % len(_MARKERS)]
    if not color:
        return "", char
    style = f"\x1b[48;5;{_REGION_COLORS[region % len(_REGION_COLORS)]}m"
    if mark >= 0:
        style += f"\x1b[1;38;5;{_POINT_COLORS[mark % len(_POINT_COLORS)]}m"
    elif mark == -2:
        style += "\x1b[1;38;5;0m"
    return style, char


def _join_styled(cells: list[tuple[str, str]]) -> str:
    """Concatenate cells, emitting an escape sequence only where the style changes."""
    out, current = [], ""
    for style, char in cells:
        if style != current:
            out.append(_RESET + style if current else style)
            current = style
        out.append(char)
    if current:
        out.append(_RESET)
    return "".join(out)


# --- PNG (optional matplotlib) -------------------------------------------------------------


def save_png(
    path: str,
    curves: dict[str, Sequence[float]],
    classify: Callable[[npt.NDArray[np.float32]], npt.ArrayLike] | None = None,
    points: npt.NDArray[Any] | None = None,
    labels: npt.NDArray[Any] | None = None,
) -> None:
    """Save the same figures as a PNG: one panel per curve, plus the decision boundary if given.

    Args:
        path: output file.
        curves: panel title -> series (e.g. ``{"loss": losses, "learning rate": lrs}``).
        classify, points, labels: as for :func:`decision_boundary` (all three or none).
    Raises:
        ImportError: matplotlib is not installed.
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError as error:
        raise ImportError("--plot-png needs matplotlib: pip install matplotlib") from error
    matplotlib.use("Agg")  # never open a window; this only writes a file
    plt = importlib.import_module("matplotlib.pyplot")
    boundary = classify is not None and points is not None and labels is not None
    panels = len(curves) + (1 if boundary else 0)
    figure, axes = plt.subplots(1, panels, figsize=(4.5 * panels, 4))
    axes = np.atleast_1d(axes)
    for ax, (name, series) in zip(axes, curves.items(), strict=False):
        ax.plot(np.arange(len(series)), np.asarray(series, dtype=float))
        ax.set_title(name)
        ax.set_xlabel("step")
    if boundary:
        assert classify is not None and points is not None and labels is not None
        _png_boundary(axes[-1], classify, np.asarray(points), np.asarray(labels))
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _png_boundary(
    ax: Any,
    classify: Callable[[npt.NDArray[np.float32]], npt.ArrayLike],
    points: npt.NDArray[Any],
    labels: npt.NDArray[Any],
) -> None:
    extent = Extent.around(points)
    size = 200
    regions = np.asarray(classify(extent.cell_centers(size, size))).reshape(size, size)
    ax.imshow(
        regions,
        extent=(extent.x_min, extent.x_max, extent.y_min, extent.y_max),
        cmap="coolwarm",
        alpha=0.3,
        aspect="auto",
    )
    ax.scatter(
        points[:, 0], points[:, 1], c=labels, cmap="coolwarm", s=8, edgecolors="k", linewidths=0.2
    )
    ax.set_title("decision boundary")
