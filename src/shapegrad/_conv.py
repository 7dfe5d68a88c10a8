"""2-d convolution and pooling via im2col, written against the primitives.

Layouts follow PyTorch: input ``[N, C, H, W]`` (NCHW), weight ``[O, C, kh, kw]``
(OIHW). Patches are built from PAD + one strided SLICE per kernel offset +
CONCAT, so the whole op is layout primitives plus one EINSUM (convolution) or
one reduction (pooling); both interpreters and every backend reuse it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shapegrad.dtypes import DTypeError
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

IntPair = int | tuple[int, int]


def _pair(op: str, name: str, value: IntPair, minimum: int) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(not isinstance(v, int) or v < minimum for v in pair):
        raise ValueError(
            f"{op}: {name} must be an int >= {minimum} or a pair of them, got {value!r}"
        )
    return pair[0], pair[1]


def _check_nchw(op: str, x: Tensor) -> None:
    if x.ndim != 4:
        raise ShapeError(op, f"input must be [N, C, H, W], got {fmt(x.shape)}")


def _out_size(
    op: str, x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]
) -> tuple[int, int]:
    padded = (x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1])
    if padded[0] < kernel[0] or padded[1] < kernel[1]:
        raise ShapeError(
            op,
            f"kernel {fmt(kernel)} is larger than the padded input {fmt(padded)} "
            f"(x is {fmt(x.shape)}, padding {padding})",
        )
    return (padded[0] - kernel[0]) // stride[0] + 1, (padded[1] - kernel[1]) // stride[1] + 1


def _patches(
    x: Tensor,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    out: tuple[int, int],
    fill: float,
) -> Tensor:
    """``[N, C, kh * kw, Ho, Wo]``: for each kernel offset, the input pixels it touches."""
    n, c = x.shape[0], x.shape[1]
    (ph, pw), (sh, sw), (ho, wo) = padding, stride, out
    xp = p.pad(x, [0, 0, ph, pw], [0, 0, ph, pw], value=fill)
    pieces = []
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            stops = [n, c, i + sh * (ho - 1) + 1, j + sw * (wo - 1) + 1]
            piece = p.slice_(xp, [0, 0, i, j], stops, [1, 1, sh, sw])
            pieces.append(p.reshape(piece, [n, c, 1, ho, wo]))
    return p.concat(pieces, axis=2)


def conv2d(
    x: Tensor, w: Tensor, bias: Tensor | None = None, stride: IntPair = 1, padding: IntPair = 0
) -> Tensor:
    """2-d cross-correlation like ``torch.nn.functional.conv2d`` (no dilation or groups).

    Args:
        x: input ``[N, C, H, W]``.
        w: weight ``[O, C, kh, kw]``.
        bias: optional ``[O]``.
        stride: int or ``(sh, sw)``.
        padding: zero padding, int or ``(ph, pw)``, on both sides.
    Returns:
        ``[N, O, Ho, Wo]`` with ``Ho = (H + 2 ph - kh) // sh + 1``.
    Example:
        >>> sg.conv2d(sg.ones((1, 3, 5, 5)), sg.ones((2, 3, 3, 3)), padding=1).shape
        (1, 2, 5, 5)
    """
    _check_nchw("conv2d", x)
    if w.ndim != 4:
        raise ShapeError("conv2d", f"weight must be [O, C, kh, kw], got {fmt(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ShapeError(
            "conv2d",
            f"input channels disagree: x is {fmt(x.shape)}, w is {fmt(w.shape)} "
            f"({x.shape[1]} != {w.shape[1]})",
        )
    if x.dtype != w.dtype:
        raise DTypeError(f"conv2d: x is {x.dtype} but w is {w.dtype}; cast one with .astype()")
    kernel = (w.shape[2], w.shape[3])
    strides = _pair("conv2d", "stride", stride, 1)
    pads = _pair("conv2d", "padding", padding, 0)
    out = _out_size("conv2d", x, kernel, strides, pads)
    cols = _patches(x, kernel, strides, pads, out, 0.0)
    cols = p.reshape(cols, [x.shape[0], x.shape[1], *kernel, *out])
    y = p.einsum("nckluv,ockl->nouv", cols, w)
    if bias is None:
        return y
    if bias.shape != (w.shape[0],):
        raise ShapeError(
            "conv2d",
            f"bias must be [{w.shape[0]}] for weight {fmt(w.shape)}, got {fmt(bias.shape)}",
        )
    return y + p.broadcast_in_dim(bias, y.shape, (1,))


def _pool_setup(
    op: str, x: Tensor, kernel_size: IntPair, stride: IntPair | None, padding: IntPair
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    _check_nchw(op, x)
    kernel = _pair(op, "kernel_size", kernel_size, 1)
    strides = kernel if stride is None else _pair(op, "stride", stride, 1)
    pads = _pair(op, "padding", padding, 0)
    if pads[0] > kernel[0] // 2 or pads[1] > kernel[1] // 2:
        raise ValueError(f"{op}: padding {pads} must be at most half the kernel {kernel}")
    return kernel, strides, pads, _out_size(op, x, kernel, strides, pads)


def _tiles(
    x: Tensor,
    kernel: tuple[int, int],
    padding: tuple[int, int],
    out: tuple[int, int],
    fill: float,
) -> Tensor:
    """``[N, C, Ho, kh, Wo, kw]``: the windows of a pooling whose stride is its kernel.

    Non-overlapping windows tile the (padded, cropped) input, so they are a reshape of
    it, a view: no strided slices, and a backward pass that is elementwise instead of
    the strided slices' interleaving scatter (pads and div/mod indexing per window).
    """
    n, c = x.shape[0], x.shape[1]
    (ph, pw), (kh, kw), (ho, wo) = padding, kernel, out
    if ph or pw:
        x = p.pad(x, [0, 0, ph, pw], [0, 0, ph, pw], value=fill)
    if x.shape[2] != ho * kh or x.shape[3] != wo * kw:
        x = p.slice_(x, [0, 0, 0, 0], [n, c, ho * kh, wo * kw], [1, 1, 1, 1])
    return p.reshape(x, [n, c, ho, kh, wo, kw])


def _lowest(x: Tensor) -> float:
    """The dtype's lowest finite value: a padding that never wins and never trips check_numerics."""
    numpy_dtype: Any = x.dtype.numpy
    info: Any = np.finfo(numpy_dtype) if x.dtype.is_float else np.iinfo(numpy_dtype)
    return float(info.min)


def max_pool2d(
    x: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0
) -> Tensor:
    """Max over ``kernel_size`` windows of ``[N, C, H, W]`` (PyTorch semantics, stride = kernel).

    Padding uses the dtype's lowest finite value (never a winner, never Inf);
    tied maxima share the gradient evenly.
    Example:
        >>> sg.max_pool2d(sg.ones((1, 1, 4, 4)), 2).shape
        (1, 1, 2, 2)
    """
    kernel, strides, pads, out = _pool_setup("max_pool2d", x, kernel_size, stride, padding)
    if strides == kernel:
        return p.reduce_max(_tiles(x, kernel, pads, out, _lowest(x)), [3, 5])
    cols = _patches(x, kernel, strides, pads, out, _lowest(x))
    return p.reduce_max(cols, [2])


def avg_pool2d(
    x: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0
) -> Tensor:
    """Mean over ``kernel_size`` windows of ``[N, C, H, W]`` (stride defaults to the kernel).

    Zero padding counts towards the mean, like PyTorch's ``count_include_pad=True``.
    Example:
        >>> sg.avg_pool2d(sg.ones((1, 1, 4, 4)), 2).shape
        (1, 1, 2, 2)
    """
    kernel, strides, pads, out = _pool_setup("avg_pool2d", x, kernel_size, stride, padding)
    if strides == kernel:
        total = p.reduce_sum(_tiles(x, kernel, pads, out, 0.0), [3, 5])
    else:
        total = p.reduce_sum(_patches(x, kernel, strides, pads, out, 0.0), [2])
    return total / float(kernel[0] * kernel[1])
