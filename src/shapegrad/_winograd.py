"""Winograd minimal filtering F(2x2, 3x3) for stride-1 3x3 convolutions (Lavin & Gray 2016).

Each 2x2 block of outputs is computed from the 4x4 input tile around it as
``A^T [(G g G^T) * (B^T d B)] A``: 16 elementwise products per tile and channel pair
instead of 36, i.e. 2.25x fewer multiply-adds in the channel contraction, which is
where a convolution with many channels spends its time. Summed over input channels,
the 16 products become 16 independent matrix products ``(tiles x Cin) @ (Cin x Cout)``.

Everything is written with the primitives (PERMUTE, PAD, unit-stride SLICE, RESHAPE,
add/sub and 16 EINSUMs), so the ordinary VJP rules differentiate it (the input and
weight gradients get the same 2.25x), and eager mode, the compiled backends and every
renderer get it without a line of their own. Each transformed entry is one signed sum
of the few tile entries it needs (the matrices hold only 0, +-1, +-1/2): fewer
operations than small constant matrix products, no intermediate buffers, and VJPs
that are again plain elementwise sums and pads.

Cost: the transforms are memory passes over tensors 16/4 = 4x the size of the
input/output (linear in channels), the saving is in the products (quadratic), so it
pays only for wide layers; ``_conv.WINOGRAD_MIN_CHANNELS`` is the measured crossover.

Layout: the tile products want the tiles of all images contiguous, so the input is
permuted to CNHW once (an outer-axis swap: whole rows move); each of the 16
transformed inputs ``V`` is ``[Cin, N, th, tw]``, transformed filters ``U`` are
``[Cout, Cin]`` and their products ``M`` ``[Cout, N, th, tw]``; all three products of
a training step (forward, input and weight gradients) are plain GEMMs on these
layouts. Odd output sizes pad the input to whole tiles and crop the result.

float32 error: the input transform adds 4 terms, the output transform 9, the filter
transform 9 with weights 1/4, so the error is a small constant factor over im2col's
(the tests bound it by 32 ulps of the sum of |terms|).
"""

from __future__ import annotations

import functools

from shapegrad.ir import Graph
from shapegrad.ops import prims as p
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal
from shapegrad.tensor import Tensor


def _take(x: Tensor, axis: int, start: int, count: int, step: int) -> Tensor:
    """``count`` entries of ``x`` along ``axis`` from ``start`` every ``step``."""
    starts = [0] * x.ndim
    stops = list(x.shape)
    steps = [1] * x.ndim
    starts[axis] = start
    stops[axis] = start + step * (count - 1) + 1
    steps[axis] = step
    return p.slice_(x, starts, stops, steps)


# F(2x2, 3x3) transforms (Lavin & Gray 2016): Y = A^T [(G g G^T) * (B^T d B)] A.
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))


def _signed_sum(terms: list[tuple[int, Tensor]]) -> Tensor:
    """``sum(sign * t)`` for signs +-1, as adds and subtracts (a + term first: no negation)."""
    terms = sorted(terms, key=lambda st: -st[0])
    sign, total = terms[0]
    if sign < 0:
        total = -total
    for sign, t in terms[1:]:
        total = total + t if sign > 0 else total - t
    return total


def _two_sided(mat: tuple[tuple[int, ...], ...], tile: list[list[Tensor]]) -> list[Tensor]:
    """``(mat @ tile @ mat^T)`` entries, row-major, each straight from the tile's entries.

    Every entry is one elementwise sum of its few nonzero terms (4 for B^T, 9 for A^T),
    with no row-transformed intermediate: fusion then reads the tile views directly
    instead of materializing a buffer per row combination.
    """
    out = []
    for row_k in mat:
        for row_l in mat:
            terms = [
                (ck * cl, tile[a][b])
                for a, ck in enumerate(row_k)
                if ck
                for b, cl in enumerate(row_l)
                if cl
            ]
            out.append(_signed_sum(terms))
    return out


def _filter_rows(g: list[Tensor]) -> list[Tensor]:
    """``G g`` along one axis: G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]]."""
    even = (g[0] + g[2]) * 0.5
    odd = g[1] * 0.5
    return [g[0], even + odd, even - odd, g[2]]


def _transform_input(x: Tensor, padding: tuple[int, int], tiles: tuple[int, int]) -> list[Tensor]:
    """16 tensors ``[C, N, th, tw]``: entry ``4k + l`` of ``B^T d B`` of every 4x4 tile."""
    h, w = x.shape[2], x.shape[3]
    th, tw = tiles
    ph, pw = padding
    # CNHW: (N, th, tw) contiguous makes each product one GEMM, and swapping
    # the two outer axes moves whole image rows (cheap, unlike a channels-last transpose).
    xc = p.permute(x, [1, 0, 2, 3])
    # Pad to exactly 2 * tiles + 2 rows/columns: the user's padding, plus one extra
    # row/column at the bottom/right when the output size is odd (cropped at the end).
    high = (2 * th + 2 - h - ph, 2 * tw + 2 - w - pw)
    xc = p.pad(xc, [0, 0, ph, pw], [0, 0, high[0], high[1]])
    # Row 2i + a of tile row i is row i + a // 2 of parity a % 2: as a [.., th + 1, 2,
    # tw + 1, 2] view the tile entries are unit-stride slices, whose VJP is a plain pad
    # (a stride-2 slice's VJP interleaves, with div/mod indexing per element).
    c, n = xc.shape[0], xc.shape[1]
    xc = p.reshape(xc, [c, n, th + 1, 2, tw + 1, 2])

    def entry(a: int, b: int) -> Tensor:
        rows = _take(_take(xc, 2, a // 2, th, 1), 3, a % 2, 1, 1)
        return p.reshape(_take(_take(rows, 4, b // 2, tw, 1), 5, b % 2, 1, 1), [c, n, th, tw])

    tile = [[entry(a, b) for b in range(4)] for a in range(4)]
    return _two_sided(_BT, tile)


def _transform_filter(w: Tensor) -> list[Tensor]:
    """16 tensors ``[O, C]``: entry ``4k + l`` of ``G g G^T`` of every 3x3 filter."""
    o, c = w.shape[0], w.shape[1]
    rows = _filter_rows([_take(w, 2, a, 1, 1) for a in range(3)])
    return [
        p.reshape(col, [o, c])
        for row in rows
        for col in _filter_rows([_take(row, 3, b, 1, 1) for b in range(3)])
    ]


def _transform_output(entries: list[Tensor], out: tuple[int, int]) -> Tensor:
    """``[N, O, Ho, Wo]`` from the 16 products ``[O, N, th, tw]``: ``A^T m A``, then crop."""
    o, n, th, tw = entries[0].shape
    ys = _two_sided(_AT, [entries[4 * k : 4 * k + 4] for k in range(4)])
    total: Tensor | None = None
    for i, y in enumerate(ys):
        a, b = divmod(i, 2)
        # Output (2i + a, 2j + b) of tile (i, j): zero-pad to [.., th, 2, tw, 2] and
        # add, so the interleave is a sum of pads (its VJP: unit-stride slices).
        y = p.reshape(y, [o, n, th, 1, tw, 1])
        y = p.pad(y, [0, 0, 0, a, 0, b], [0, 0, 0, 1 - a, 0, 1 - b])
        total = y if total is None else total + y
    assert total is not None
    y = p.reshape(total, [o, n, 2 * th, 2 * tw])
    y = p.slice_(y, [0, 0, 0, 0], [o, n, out[0], out[1]], [1, 1, 1, 1])
    return p.permute(y, [1, 0, 2, 3])


def winograd_conv2d(x: Tensor, w: Tensor, padding: tuple[int, int]) -> Tensor:
    """``conv2d(x, w, stride=1, padding=padding)`` for a ``[O, C, 3, 3]`` weight, no bias.

    The caller (``_conv.conv2d``) has checked shapes and dtypes.
    """
    ho, wo = x.shape[2] + 2 * padding[0] - 2, x.shape[3] + 2 * padding[1] - 2
    tiles = ((ho + 1) // 2, (wo + 1) // 2)
    v = _transform_input(x, padding, tiles)
    u = _transform_filter(w)
    # 16 separate products [O, C] @ [C, N * th * tw], not one batched product over a
    # stacked axis: every transform entry is then its own elementwise expression, while
    # slicing a stacked M makes its VJP a sum of 16 zero pads (a select chain on every
    # element of the gradient). Measured (C, 1 thread): 1.1-1.5x faster than batched.
    m = [p.einsum("oc,cnij->onij", ui, vi) for ui, vi in zip(u, v, strict=True)]
    return _transform_output(m, (ho, wo))


@functools.lru_cache(maxsize=64)
def winograd_graph(x: AVal, w: AVal, padding: tuple[int, int]) -> Graph:
    """:func:`winograd_conv2d` as a graph with inputs ``x`` and ``w`` (a template that the
    compiler's ``choose_conv_algorithm`` stage instantiates in place of an im2col product)."""
    ops = GraphOps()
    xt, wt = ops.add_input("x", x), ops.add_input("w", w)
    y = winograd_conv2d(xt, wt, padding)
    return Graph(list(ops.inputs), [ops.lift_value(y)], ops.table)
