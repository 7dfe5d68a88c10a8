"""1-d convolution and up/down-sampling (issue 25), composites over conv2d and gathers.

``conv1d`` is conv2d on a height-1 image. ``interpolate`` follows
``torch.nn.functional.interpolate``: source positions are computed on the host from the
static sizes (float64) and become int32 gather tables and blend weights, so the op is two
gathers and a blend per spatial axis in every interpreter and backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shapegrad._composites import flip
from shapegrad._conv import conv2d
from shapegrad._fused import eager_kernel
from shapegrad.dtypes import DTypeError, int32
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor


def _positive_int(op: str, name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{op}: {name} must be an int >= {minimum}, got {value!r}")
    return value


@eager_kernel("conv1d")
def conv1d(
    x: Tensor, w: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0
) -> Tensor:
    """1-d cross-correlation like ``torch.nn.functional.conv1d`` (no dilation or groups).

    ``x [N, C, L]``, ``w [O, C, K]``, ``bias [O]``; returns ``[N, O, (L + 2p - K) // s + 1]``.
    Example:
        >>> sg.conv1d(sg.ones((2, 3, 8)), sg.ones((4, 3, 3)), padding=1).shape
        (2, 4, 8)
    """
    x, w = p.as_tensor(x, "conv1d"), p.as_tensor(w, "conv1d")
    if x.ndim != 3:
        raise ShapeError("conv1d", f"input must be [N, C, L], got {fmt(x.shape)}")
    if w.ndim != 3:
        raise ShapeError("conv1d", f"weight must be [O, C, K], got {fmt(w.shape)}")
    stride = _positive_int("conv1d", "stride", stride, 1)
    padding = _positive_int("conv1d", "padding", padding, 0)
    n, c, length = x.shape
    o, _, k = w.shape
    image = p.reshape(x, [n, c, 1, length])
    kernel = p.reshape(w, [o, w.shape[1], 1, k])
    out = conv2d(image, kernel, bias, stride=(1, stride), padding=(0, padding))
    return p.reshape(out, [n, o, out.shape[-1]])


MODES = ("nearest", "bilinear", "linear")


def _out_sizes(
    op: str,
    spatial: tuple[int, ...],
    size: int | Sequence[int] | None,
    scale_factor: float | Sequence[float] | None,
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Output sizes and the source-per-output scale of each spatial axis (PyTorch's: the
    given ``1 / scale_factor``, else ``in / out``)."""
    k = len(spatial)
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * k if isinstance(size, int) else tuple(size)
        if len(sizes) != k or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes
        ):
            raise ValueError(f"{op}: size must be {k} int(s) >= 1, got {size!r}")
        return sizes, tuple(i / o for i, o in zip(spatial, sizes, strict=True))
    assert scale_factor is not None
    factors = (scale_factor,) * k if isinstance(scale_factor, int | float) else tuple(scale_factor)
    if len(factors) != k or any(
        isinstance(f, bool) or not isinstance(f, int | float) or not f > 0 or math.isinf(f)
        for f in factors
    ):
        raise ValueError(
            f"{op}: scale_factor must be {k} finite number(s) > 0, got {scale_factor!r}"
        )
    sizes = tuple(math.floor(i * f) for i, f in zip(spatial, factors, strict=True))
    if any(s < 1 for s in sizes):
        raise ShapeError(
            op, f"scale_factor {scale_factor!r} shrinks {fmt(spatial)} to {fmt(sizes)}"
        )
    return sizes, tuple(1.0 / f for f in factors)


def _index(x: Tensor, index: np.ndarray, axis: int) -> Tensor:
    return p.gather(x, p.constant(index.astype(np.int32), int32, like=x), axis)


def _nearest_axis(x: Tensor, axis: int, out: int, scale: float) -> Tensor:
    n = x.shape[axis]
    src = np.minimum(np.floor(np.arange(out) * scale).astype(np.int64), n - 1)
    return _index(x, src, axis)


def _linear_axis(x: Tensor, axis: int, out: int, scale: float, align_corners: bool) -> Tensor:
    n = x.shape[axis]
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        src = dst * ((n - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), n - 1)
    high = np.minimum(low + 1, n - 1)
    frac = src - low
    shape = [1] * x.ndim
    shape[axis] = out
    weight = p.constant(frac.reshape(shape), x.dtype, like=x)
    a, b = _index(x, low, axis), _index(x, high, axis)
    return a + (b - a) * weight


def interpolate(
    x: Tensor,
    size: int | Sequence[int] | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
) -> Tensor:
    """Resize the spatial axes of ``x [N, C, *spatial]`` like ``torch.nn.functional.interpolate``.

    ``mode``: ``"nearest"`` (any number of spatial axes; source ``floor(dst * scale)``),
    ``"linear"`` (``[N, C, L]``) or ``"bilinear"`` (``[N, C, H, W]``), with PyTorch's
    ``align_corners=False`` convention by default (half-pixel centres, clamped at the
    border). Give ``size`` or ``scale_factor``; ``scale`` is ``1 / scale_factor`` when that
    is given, else ``in / out``, as in PyTorch.
    Example:
        >>> sg.interpolate(sg.ones((1, 2, 3, 4)), scale_factor=2).shape
        (1, 2, 6, 8)
    """
    x = p.as_tensor(x, "interpolate")
    if mode not in MODES:
        raise ValueError(f"interpolate: mode must be one of {MODES}, got {mode!r}")
    wanted_rank = {"linear": 3, "bilinear": 4}.get(mode)
    if x.ndim < 3 or (wanted_rank is not None and x.ndim != wanted_rank):
        need = (
            "[N, C, *spatial]"
            if wanted_rank is None
            else ("[N, C, L]" if wanted_rank == 3 else "[N, C, H, W]")
        )
        raise ShapeError("interpolate", f"mode={mode!r} needs input {need}, got {fmt(x.shape)}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError("interpolate: align_corners only applies to the linear modes")
    if mode != "nearest" and not x.dtype.is_float:
        raise DTypeError(f"interpolate: mode={mode!r} needs a float tensor, got {x.dtype}")
    if any(d == 0 for d in x.shape[2:]):
        raise ShapeError("interpolate", f"spatial axes of {fmt(x.shape)} must be non-empty")
    sizes, scales = _out_sizes("interpolate", x.shape[2:], size, scale_factor)
    for axis, (out, scale) in enumerate(zip(sizes, scales, strict=True), start=2):
        if mode == "nearest":
            x = _nearest_axis(x, axis, out, scale)
        else:
            x = _linear_axis(x, axis, out, scale, bool(align_corners))
    return x


def upsample(x: Tensor, scale_factor: float | Sequence[float] = 2, mode: str = "nearest") -> Tensor:
    """``interpolate(x, scale_factor=scale_factor, mode=mode)`` (``nn.Upsample``'s defaults).

    Example:
        >>> sg.upsample(sg.ones((1, 1, 2, 2))).shape
        (1, 1, 4, 4)
    """
    return interpolate(x, scale_factor=scale_factor, mode=mode)


def _dilate(x: Tensor, stride: tuple[int, int]) -> Tensor:
    """``[N, C, H, W]`` with ``s - 1`` zeros between neighbours: ``[N, C, (H-1)sh+1, (W-1)sw+1]``."""
    n, c, h, w = x.shape
    sh, sw = stride
    if (sh, sw) == (1, 1):
        return x
    spread = p.pad(p.reshape(x, [n, c, h, 1, w, 1]), [0] * 6, [0, 0, 0, sh - 1, 0, sw - 1])
    grid = p.reshape(spread, [n, c, h * sh, w * sw])
    return p.slice_(grid, [0, 0, 0, 0], [n, c, (h - 1) * sh + 1, (w - 1) * sw + 1], [1, 1, 1, 1])


def _pad_or_crop(x: Tensor, low: tuple[int, int], high: tuple[int, int]) -> Tensor:
    """Pad the last two axes by ``low``/``high`` (negative amounts crop)."""
    starts = [0, 0, -min(low[0], 0), -min(low[1], 0)]
    stops = [x.shape[0], x.shape[1], x.shape[2] + min(high[0], 0), x.shape[3] + min(high[1], 0)]
    x = p.slice_(x, starts, stops, [1, 1, 1, 1])
    pos_low = [0, 0, max(low[0], 0), max(low[1], 0)]
    pos_high = [0, 0, max(high[0], 0), max(high[1], 0)]
    return p.pad(x, pos_low, pos_high)


@eager_kernel("conv_transpose2d")
def conv_transpose2d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, int] = 1,
    padding: int | tuple[int, int] = 0,
    output_padding: int | tuple[int, int] = 0,
) -> Tensor:
    """Transposed 2-d convolution like ``torch.nn.functional.conv_transpose2d`` (no groups
    or dilation): the gradient of ``conv2d`` with respect to its input.

    ``x [N, Cin, H, W]``, ``w [Cin, Cout, kh, kw]`` (PyTorch's layout), ``bias [Cout]``;
    returns ``[N, Cout, (H - 1) sh - 2 ph + kh + oph, ...]``. Computed as conv2d of the
    stride-dilated, ``k - 1 - p``-padded input with the flipped, transposed kernel.
    Example:
        >>> sg.conv_transpose2d(sg.ones((1, 4, 3, 3)), sg.ones((4, 2, 2, 2)), stride=2).shape
        (1, 2, 6, 6)
    """
    op = "conv_transpose2d"
    x, w = p.as_tensor(x, op), p.as_tensor(w, op)
    if x.ndim != 4:
        raise ShapeError(op, f"input must be [N, Cin, H, W], got {fmt(x.shape)}")
    if w.ndim != 4:
        raise ShapeError(op, f"weight must be [Cin, Cout, kh, kw], got {fmt(w.shape)}")
    if w.shape[0] != x.shape[1]:
        raise ShapeError(
            op,
            f"weight {fmt(w.shape)} is [Cin, Cout, kh, kw] with Cin {w.shape[0]}, but the "
            f"input {fmt(x.shape)} has {x.shape[1]} channels",
        )
    s = _pair2(op, "stride", stride, 1)
    pad = _pair2(op, "padding", padding, 0)
    extra = _pair2(op, "output_padding", output_padding, 0)
    if extra[0] >= s[0] or extra[1] >= s[1]:
        raise ValueError(f"{op}: output_padding {extra} must be smaller than stride {s}")
    k = (w.shape[2], w.shape[3])
    out = tuple((x.shape[2 + i] - 1) * s[i] - 2 * pad[i] + k[i] + extra[i] for i in range(2))
    if out[0] < 1 or out[1] < 1:
        raise ShapeError(op, f"padding {pad} leaves no output for {fmt(x.shape)} and kernel {k}")
    low = (k[0] - 1 - pad[0], k[1] - 1 - pad[1])
    high = (low[0] + extra[0], low[1] + extra[1])
    spread = _pad_or_crop(_dilate(x, s), low, high)
    kernel = p.permute(flip(w, (2, 3)), (1, 0, 2, 3))
    return conv2d(spread, kernel, bias)


def _pair2(op: str, name: str, value: int | tuple[int, int], minimum: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(
        isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in pair
    ):
        raise ValueError(
            f"{op}: {name} must be an int >= {minimum} or a pair of them, got {value!r}"
        )
    return pair[0], pair[1]
