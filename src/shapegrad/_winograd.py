"""Winograd minimal filtering F(2x2, 3x3) for stride-1 3x3 convolutions (Lavin & Gray 2016).

Each 2x2 block of outputs is computed from the 4x4 input tile around it as
``A^T [(G g G^T) * (B^T d B)] A``: 16 elementwise products per tile and channel pair
instead of 36, i.e. 2.25x fewer multiply-adds in the channel contraction, which is
where a convolution with many channels spends its time. Summed over input channels,
the 16 products become 16 independent matrix products ``(tiles x Cin) @ (Cin x Cout)``.

Everything is written with the primitives (PERMUTE, PAD, strided SLICE, add/sub,
CONCAT, RESHAPE and one batched EINSUM), so the ordinary VJP rules differentiate it
(the input and weight gradients get the same 2.25x), and eager mode, the compiled
backends and every renderer get it without a line of their own. The transforms use
the matrices' structure (entries 0, +-1, +-1/2) as adds and subtracts instead of
small constant matrix products: fewer operations, and nothing for fusion to undo.

Layout: the tile products want channels innermost, so the input is permuted to NHWC
once; each of the 16 transformed inputs ``V`` is ``[N, th, tw, Cin]``, transformed
filters ``U`` are ``[Cout, Cin]`` and their products ``M`` ``[N, th, tw, Cout]``; all
three products of a training step (forward, input and weight gradients) are plain
GEMMs on these layouts. Odd output sizes pad the input to whole tiles and crop the result.

float32 error: the transforms add at most 4 terms with coefficients 1 or 1/2, so the
error grows by a small constant factor over im2col's (measured in the tests).
"""

from __future__ import annotations

from shapegrad.ops import prims as p
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


def _input_rows(r: list[Tensor]) -> list[Tensor]:
    """``B^T d`` along one axis: B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]]."""
    return [r[0] - r[2], r[1] + r[2], r[2] - r[1], r[1] - r[3]]


def _filter_rows(g: list[Tensor]) -> list[Tensor]:
    """``G g`` along one axis: G = [[1,0,0],[1/2,1/2,1/2],[1/2,-1/2,1/2],[0,0,1]]."""
    even = (g[0] + g[2]) * 0.5
    odd = g[1] * 0.5
    return [g[0], even + odd, even - odd, g[2]]


def _output_rows(m: list[Tensor]) -> list[Tensor]:
    """``A^T m`` along one axis: A^T = [[1,1,1,0],[0,1,-1,-1]]."""
    return [m[0] + m[1] + m[2], m[1] - m[2] - m[3]]


def _transform_input(x: Tensor, padding: tuple[int, int], tiles: tuple[int, int]) -> list[Tensor]:
    """16 tensors ``[N, th, tw, C]``: entry ``4k + l`` of ``B^T d B`` of every 4x4 tile."""
    h, w = x.shape[2], x.shape[3]
    th, tw = tiles
    ph, pw = padding
    # NHWC so that each tile's channel vector is contiguous for the products.
    xh = p.permute(x, [0, 2, 3, 1])
    # Pad to exactly 2 * tiles + 2 rows/columns: the user's padding, plus one extra
    # row/column at the bottom/right when the output size is odd (cropped at the end).
    high = (2 * th + 2 - h - ph, 2 * tw + 2 - w - pw)
    xh = p.pad(xh, [0, ph, pw, 0], [0, high[0], high[1], 0])
    rows = _input_rows([_take(xh, 1, a, th, 2) for a in range(4)])
    return [col for row in rows for col in _input_rows([_take(row, 2, b, tw, 2) for b in range(4)])]


def _transform_filter(w: Tensor) -> list[Tensor]:
    """16 tensors ``[O, C]``: entry ``4k + l`` of ``G g G^T`` of every 3x3 filter."""
    o, c = w.shape[0], w.shape[1]
    rows = _filter_rows([_take(w, 2, a, 1, 1) for a in range(3)])
    return [
        p.reshape(col, [o, c])
        for row in rows
        for col in _filter_rows([_take(row, 3, b, 1, 1) for b in range(3)])
    ]


def _transform_output(parts: list[Tensor], out: tuple[int, int]) -> Tensor:
    """``[N, O, Ho, Wo]`` from the 16 products ``[N, th, tw, O]``: ``A^T m A``, then crop."""
    n, th, tw, o = parts[0].shape
    # Rows (over k of 4k + l) for each column l, then the columns of each output row.
    by_col = [_output_rows([parts[4 * k + col] for k in range(4)]) for col in range(4)]
    out_rows = []
    for a in range(2):
        ya = _output_rows([by_col[col][a] for col in range(4)])
        pieces = [p.reshape(y, [n, th, 1, tw, 1, o]) for y in ya]
        out_rows.append(p.concat(pieces, axis=4))
    # [N, th, 2, tw, 2, O] interleaves the 2x2 output blocks: a reshape away from NHWC.
    y = p.reshape(p.concat(out_rows, axis=2), [n, 2 * th, 2 * tw, o])
    y = p.slice_(y, [0, 0, 0, 0], [n, out[0], out[1], o], [1, 1, 1, 1])
    return p.permute(y, [0, 3, 1, 2])


def winograd_conv2d(x: Tensor, w: Tensor, padding: tuple[int, int]) -> Tensor:
    """``conv2d(x, w, stride=1, padding=padding)`` for a ``[O, C, 3, 3]`` weight, no bias.

    The caller (``_conv.conv2d``) has checked shapes and dtypes.
    """
    ho, wo = x.shape[2] + 2 * padding[0] - 2, x.shape[3] + 2 * padding[1] - 2
    tiles = ((ho + 1) // 2, (wo + 1) // 2)
    v = _transform_input(x, padding, tiles)
    u = _transform_filter(w)
    # 16 separate products rather than one batched product over a stacked axis: the
    # stacking CONCAT and the SLICEs taking it apart would turn, in the backward pass,
    # into sums of 16 padded pieces (selects on every element) around every product.
    m = [p.einsum("nijc,oc->nijo", vi, ui) for vi, ui in zip(v, u, strict=True)]
    return _transform_output(m, (ho, wo))
