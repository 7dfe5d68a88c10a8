"""Terminal plot renderer: decoded dot positions, axis labels, regions and markers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from shapegrad import plot

# Unicode Braille patterns: dots 1,2,3,7 are the left column top to bottom, 4,5,6,8 the right.
_DOT_BIT = {(0, 0): 0, (0, 1): 1, (0, 2): 2, (1, 0): 3, (1, 1): 4, (1, 2): 5, (0, 3): 6, (1, 3): 7}


def decode(chart: str, width: int, height: int) -> set[tuple[int, int]]:
    """Lit dots (column, row) of the Braille block of a line chart (independent of plot.py)."""
    body = [line.split("┤", 1)[1] for line in chart.splitlines() if "┤" in line]
    assert len(body) == height and all(len(row) == width for row in body)
    dots = set()
    for r, row in enumerate(body):
        for c, char in enumerate(row):
            bits = ord(char) - 0x2800
            assert 0 <= bits < 256
            for (dc, dr), bit in _DOT_BIT.items():
                if bits >> bit & 1:
                    dots.add((2 * c + dc, 4 * r + dr))
    return dots


def test_line_chart_places_every_point_exactly() -> None:
    # 16 points on a 16x16 dot grid: value 15 - i belongs at column i, row i (a diagonal)
    chart = plot.line_chart([15.0 - i for i in range(16)], width=8, height=4, title="loss")
    assert chart.splitlines()[0] == "loss"
    assert decode(chart, 8, 4) == {(i, i) for i in range(16)}
    rows = chart.splitlines()
    assert rows[1].lstrip().startswith("15 ┤") and rows[4].lstrip().startswith("0 ┤")
    assert rows[-1].split() == ["0", "15"]  # 8 columns leave no room for the axis name
    wide = plot.line_chart([1.0, 2.0], width=20, height=2, x_label="epoch")
    assert wide.splitlines()[-1].split() == ["0", "epoch", "1"]


def test_line_chart_connects_sparse_points_and_leaves_gaps_for_nan() -> None:
    values = [0.0, 3.0, math.nan, 3.0]  # 4 points over 8 dot columns: x at 0, 2.33, 4.67, 7
    dots = decode(plot.line_chart(values, width=4, height=1), 4, 1)
    # the segment from (0, row 3) to (2, row 0) is drawn; nothing between the NaN's neighbours
    assert {(0, 3), (2, 0), (7, 0)} <= dots
    assert any(c == 1 for c, _ in dots)
    assert not any(c in (4, 5, 6) for c, _ in dots)


def test_line_chart_flat_and_log_series() -> None:
    flat = plot.line_chart([0.1] * 10, width=5, height=2)
    assert {r for _, r in decode(flat, 5, 2)} == {4}  # centred: row round(0.5 * 7)
    assert "0.11" in flat and "0.09" in flat
    log = plot.line_chart([1.0, 10.0, 100.0], width=2, height=1, log_y=True)
    assert decode(log, 2, 1) >= {(0, 3), (3, 0)}
    assert "(log y)" in log and "100" in log
    with pytest.raises(ValueError, match="empty"):
        plot.line_chart([])


def test_decision_boundary_regions_and_points() -> None:
    points = np.array([[-1.0, -1.0], [1.0, 1.0], [0.9, 0.95], [-0.95, -0.9], [0.92, 0.97]])
    labels = np.array([0, 1, 1, 0, 0])
    text = plot.decision_boundary(
        lambda c: (c[:, 0] > 0).astype(int), points, labels, width=10, height=5, title="b"
    )
    lines = text.splitlines()
    assert lines[0] == "b" and lines[1] == "┌" + "─" * 10 + "┐"
    grid = [line[1:-1] for line in lines[2:7]]
    # the data spans [-1, 1] plus a 10% margin; the split at x = 0 is exactly mid-grid
    for row in grid:
        assert set(row[:5]) <= {" ", "o", "x", "*"} and set(row[5:]) <= {".", "o", "x", "*"}
    assert grid[4][0] == "o"  # both class-0 points near (-1, -1): bottom-left cell
    # cells are 0.24 wide: (0.9, 0.95) class 1 and (0.92, 0.97) class 0 share column 8, row 0
    assert grid[0][8] == "*" and grid[0][9] == "x"
    assert "o class 0" in lines[-1] and "x class 1" in lines[-1]


def test_decision_boundary_colour_keeps_the_characters() -> None:
    points = np.array([[0.0, 0.0], [1.0, 1.0]])
    labels = np.array([0, 1])
    plain = plot.decision_boundary(lambda c: c[:, 0] > 0.5, points, labels, width=6, height=3)
    coloured = plot.decision_boundary(
        lambda c: c[:, 0] > 0.5, points, labels, width=6, height=3, color=True
    )
    assert "\x1b[" in coloured
    import re

    stripped = re.sub(r"\x1b\[[0-9;]*m", "", coloured)
    # without colour, regions are told apart by fill characters; with colour by background
    assert stripped.splitlines()[1:4] == [r.replace(".", " ") for r in plain.splitlines()[1:4]]


def test_decision_boundary_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"points \(n, 2\)"):
        plot.decision_boundary(lambda c: c[:, 0], np.zeros((3, 3)), np.zeros(3))


def test_save_png_writes_an_image(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot-png needs matplotlib")
    path = tmp_path / "out.png"
    points = np.array([[0.0, 0.0], [1.0, 1.0]])
    plot.save_png(
        str(path),
        {"loss": [1.0, 0.5], "lr": [0.1, 0.1]},
        lambda c: c[:, 0] > 0.5,
        points,
        np.array([0, 1]),
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
