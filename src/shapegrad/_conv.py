"""2-d convolution and pooling via im2col, written against the primitives.

Layouts follow PyTorch: input ``[N, C, H, W]`` (NCHW), weight ``[O, C, kh, kw]``
(OIHW). Patches are built from PAD + one strided SLICE per kernel offset +
CONCAT, so the whole op is layout primitives plus one EINSUM (convolution) or
one reduction (pooling); both interpreters and every backend reuse it.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from shapegrad._fused import eager_kernel
from shapegrad._winograd import winograd_conv2d
from shapegrad.dtypes import DTypeError
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

IntPair = int | tuple[int, int]
# The im2col product: patches [N, C, kh*kw, Ho, Wo] times the weight [O, C, kh*kw].
CONV_SPEC = "nckuv,ock->nouv"


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


ALGORITHMS = ("auto", "im2col", "winograd")

# Winograd F(2x2, 3x3) pays off once both channel counts reach this: its tile transforms
# are memory passes linear in channels, the products it shrinks 2.25x are quadratic.
# Measured with benchmarks/winograd_threshold.py (C, forward + both gradients,
# interleaved, loaded machine), im2col time / winograd time:
#   1 thread, batch 64, 28x28: 0.49 at 16x32, 0.58 at 32x32, 0.87-1.07 at 64x64,
#     1.04-1.05 at 96x96, 1.10-1.14 at 128x128; batch 32, 14x14: 1.19 at 64, 1.47 at 128;
#   2 threads, batch 64, 28x28: 0.39 at 16x32, 0.60 at 64x64, 0.97 at 128x128;
#     batch 32, 14x14: 0.67 at 64, 1.24 at 128, 1.38 at 256.
# 128 is where it is faster or even in every run. "auto" is decided after tracing, by the
# backend's Target (``Target.winograd_min_channels``, the ``choose_conv_algorithm`` loop
# stage): no target turns the rule on yet (at two threads 128 channels measured 0.97, no
# gain; Core ML cannot take Winograd's rank-6 tiles, and the ANE backend has no Target).
WINOGRAD_MIN_CHANNELS = 128


def _choose_algorithm(algorithm: str, x: Tensor, w: Tensor, stride: tuple[int, int]) -> str:
    """``"winograd"``, ``"im2col"`` or ``"auto"`` (im2col, marked for the Target to decide)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"conv2d: algorithm must be one of {', '.join(map(repr, ALGORITHMS))}, "
            f"got {algorithm!r}"
        )
    fits = w.shape[2:] == (3, 3) and stride == (1, 1) and x.dtype.is_float
    if algorithm == "winograd" and not fits:
        raise ValueError(
            "conv2d: algorithm='winograd' needs a 3x3 float weight and stride 1, got weight "
            f"{fmt(w.shape)} ({w.dtype}), stride {stride}; use 'im2col' or 'auto'"
        )
    if algorithm == "auto" and not fits:
        return "im2col"  # nothing for a Target to choose
    return algorithm


@eager_kernel("conv2d")
def conv2d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair = 0,
    algorithm: str = "auto",
) -> Tensor:
    """2-d cross-correlation like ``torch.nn.functional.conv2d`` (no dilation or groups).

    Args:
        x: input ``[N, C, H, W]``.
        w: weight ``[O, C, kh, kw]``.
        bias: optional ``[O]``.
        stride: int or ``(sh, sw)``.
        padding: zero padding, int or ``(ph, pw)``, on both sides.
        algorithm: ``"im2col"`` (patches + one product), ``"winograd"`` (F(2x2, 3x3):
            2.25x fewer multiply-adds; 3x3 float weights and stride 1 only; float32
            results differ from im2col by a few ulps times the transform constants) or
            ``"auto"`` (im2col, unless the compiling backend's Target picks Winograd for
            the product: ``Target.winograd_min_channels``, off on every backend for now,
            as Winograd gained nothing at two threads and its rank-6 tiles do not lower
            to Core ML). Both are differentiated by the same VJP rules.
    Returns:
        ``[N, O, Ho, Wo]`` with ``Ho = (H + 2 ph - kh) // sh + 1``.
    Example:
        >>> sg.conv2d(sg.ones((1, 3, 5, 5)), sg.ones((2, 3, 3, 3)), padding=1).shape
        (1, 2, 5, 5)
    """
    x, w = p.as_tensor(x, "conv2d"), p.as_tensor(w, "conv2d")
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
    if min(kernel) < 1:
        raise ShapeError(
            "conv2d",
            f"kernel must be at least 1x1, got {kernel[0]}x{kernel[1]} in w {fmt(w.shape)}",
        )
    strides = _pair("conv2d", "stride", stride, 1)
    pads = _pair("conv2d", "padding", padding, 0)
    out = _out_size("conv2d", x, kernel, strides, pads)
    chosen = _choose_algorithm(algorithm, x, w, strides)
    if chosen == "winograd":
        y = winograd_conv2d(x, w, pads)
    else:
        # One patch axis (kh * kw) on both sides: the concatenated patches feed the
        # product as they are; splitting it into (kh, kw) made the C backend copy them
        # into a packed buffer first (a whole extra pass, ~2 ms of a ~19 ms CNN step).
        cols = _patches(x, kernel, strides, pads, out, 0.0)
        w_flat = p.reshape(w, [w.shape[0], w.shape[1], kernel[0] * kernel[1]])
        # "auto": the product says so (``conv="auto"``); a compiling backend's Target may
        # rewrite it into Winograd (``compiler/conv_algorithm.py``). Eager code runs it as
        # it is: Winograd's ~100 small ops, one NumPy call each, measured 3.5-7x slower.
        marks: dict[str, Any] = {"conv": "auto"} if chosen == "auto" else {}
        y = p.bind(Prim.EINSUM, [cols, w_flat], None, spec=CONV_SPEC, **marks)
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
    """``[N*C, Ho, kh, Wo, kw]``: the windows of a pooling whose stride is its kernel
    (batch and channels merged: rank 5, the most Core ML takes).

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
    return p.reshape(x, [n * c, ho, kh, wo, kw])


def _lowest(x: Tensor) -> float:
    """The dtype's lowest finite value: a padding that never wins and never trips check_numerics."""
    numpy_dtype: Any = x.dtype.numpy
    info: Any = ml_dtypes.finfo(numpy_dtype) if x.dtype.is_float else np.iinfo(numpy_dtype)
    return float(info.min)


@eager_kernel("max_pool2d")
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
    x = p.as_tensor(x, "max_pool2d")
    kernel, strides, pads, out = _pool_setup("max_pool2d", x, kernel_size, stride, padding)
    if strides == kernel:
        pooled = p.reduce_max(_tiles(x, kernel, pads, out, _lowest(x)), [2, 4])
        return p.reshape(pooled, [x.shape[0], x.shape[1], *out])
    cols = _patches(x, kernel, strides, pads, out, _lowest(x))
    return p.reduce_max(cols, [2])


@eager_kernel("avg_pool2d")
def avg_pool2d(
    x: Tensor, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0
) -> Tensor:
    """Mean over ``kernel_size`` windows of ``[N, C, H, W]`` (stride defaults to the kernel).

    Zero padding counts towards the mean, like PyTorch's ``count_include_pad=True``.
    Example:
        >>> sg.avg_pool2d(sg.ones((1, 1, 4, 4)), 2).shape
        (1, 1, 2, 2)
    """
    x = p.as_tensor(x, "avg_pool2d")
    kernel, strides, pads, out = _pool_setup("avg_pool2d", x, kernel_size, stride, padding)
    if strides == kernel:
        total = p.reduce_sum(_tiles(x, kernel, pads, out, 0.0), [2, 4])
        total = p.reshape(total, [x.shape[0], x.shape[1], *out])
    else:
        total = p.reduce_sum(_patches(x, kernel, strides, pads, out, 0.0), [2])
    return total / float(kernel[0] * kernel[1])
