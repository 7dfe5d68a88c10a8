"""Tensor constructors (zeros, arange, eye, seeded rand/randn) and dropout.

All are built from the source primitives (CONSTANT, IOTA, RANDOM), so they
behave the same under every interpreter. Random numbers come from the
counter-based ``RANDOM`` primitive: the same ``seed`` gives the same bits
eagerly and in every compiled backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shapegrad.dtypes import (
    DTypeLike,
    Int32OverflowError,
    as_dtype,
    check_fits,
    float32,
    float64,
    int32,
    int64,
    uint8,
)
from shapegrad.ops import prims
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

ShapeLike = int | Sequence[int]


def _shape(op: str, shape: ShapeLike) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ShapeError(op, f"negative dimension in shape {fmt(dims)}")
    return dims


def full(
    shape: ShapeLike, fill_value: float | int | bool, dtype: DTypeLike | None = None
) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (dtype inferred from it when None).

    Example:
        >>> sg.full((2, 3), 7.0).shape
        (2, 3)
    """
    if dtype is None:
        dtype = (
            "bool"
            if isinstance(fill_value, bool)
            else "int32"
            if isinstance(fill_value, int)
            else "float32"
        )
    return prims.full(_shape("full", shape), fill_value, as_dtype(dtype))


def zeros(shape: ShapeLike, dtype: DTypeLike = float32) -> Tensor:
    """A tensor of zeros. Example: ``sg.zeros((2, 3)).sum().item() == 0.0``."""
    return prims.full(_shape("zeros", shape), 0, as_dtype(dtype))


def ones(shape: ShapeLike, dtype: DTypeLike = float32) -> Tensor:
    """A tensor of ones. Example: ``sg.ones(4).sum().item() == 4.0``."""
    return prims.full(_shape("ones", shape), 1, as_dtype(dtype))


def zeros_like(x: Tensor, dtype: DTypeLike | None = None) -> Tensor:
    """Zeros with the shape (and dtype, unless given) of ``x``, on ``x``'s interpreter."""
    return prims.full(x.shape, 0, as_dtype(dtype) if dtype is not None else x.dtype, like=x)


def ones_like(x: Tensor, dtype: DTypeLike | None = None) -> Tensor:
    """Ones with the shape (and dtype, unless given) of ``x``, on ``x``'s interpreter."""
    return prims.full(x.shape, 1, as_dtype(dtype) if dtype is not None else x.dtype, like=x)


def arange(
    start: float, stop: float | None = None, step: float = 1, dtype: DTypeLike | None = None
) -> Tensor:
    """Evenly spaced values in ``[start, stop)`` like ``np.arange``.

    The dtype is int32 when every argument is an int, float32 otherwise. int32 values
    never wrap: a range reaching outside int32 raises
    :class:`~shapegrad.dtypes.Int32OverflowError` (pass ``dtype="float64"`` for it).
    Example:
        >>> sg.arange(2, 8, 2).tolist()
        [2, 4, 6]
    """
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    integral = all(isinstance(v, int) for v in (start, stop, step))
    target = as_dtype(dtype) if dtype is not None else (int32 if integral else float32)
    # The count: exact for ints of any size (a float division rounds beyond 2**53).
    exact = -((int(start) - int(stop)) // int(step)) if integral else 0
    n = max(0, exact if integral else math.ceil((stop - start) / step))
    last = start + (n - 1) * step
    if target == int32 and n and not all(-(2**31) <= v < 2**31 for v in (start, last)):
        raise Int32OverflowError(
            f"arange: int32 values from {start} to {last} do not fit in "
            f"int32 ({-(2**31)}..{2**31 - 1}); they would wrap around (use dtype=sg.int64)"
        )
    if target in (int64, uint8) and n:
        for v in (start, last):
            check_fits(v, target.numpy, "arange")
    # Count in int32 (exact), do the affine map in float64 when needed (int64 values in
    # int64, exact), then cast once.
    work = target if integral and target in (int32, int64) else float64
    values = prims.iota((n,), 0, work)
    if step != 1:
        values = values * step
    if start != 0:
        values = values + start
    return prims.cast(values, target)


def eye(n: int, m: int | None = None, k: int = 0, dtype: DTypeLike = float32) -> Tensor:
    """Identity-like matrix ``[n, m]`` with ones on diagonal ``k`` (``np.eye``).

    Example:
        >>> sg.eye(2).tolist()
        [[1.0, 0.0], [0.0, 1.0]]
    """
    shape = _shape("eye", (n, n if m is None else m))
    rows = prims.iota(shape, 0, int32)
    cols = prims.iota(shape, 1, int32)
    on_diagonal = prims.binary(Prim.EQ, rows + k if k else rows, cols)
    return prims.cast(on_diagonal, as_dtype(dtype))


def rand(shape: ShapeLike, seed: int = 0, dtype: DTypeLike = float32) -> Tensor:
    """Uniform samples in ``[0, 1)`` from the counter-based RANDOM primitive (reproducible;
    ``seed`` is an int in ``[0, 2**32)``).

    Example:
        >>> bool((sg.rand((3,), seed=1) == sg.rand((3,), seed=1)).all())
        True
    """
    from shapegrad.random import check_seed  # the RANDOM primitive keeps 32 bits of it

    return prims.random_uniform(_shape("rand", shape), check_seed(seed, "rand"), as_dtype(dtype))


def _box_muller(u: Tensor, n: int) -> Tensor:
    """Standard normals from ``2 * n`` uniforms: sqrt(-2 log(1 - u1)) * cos(2 pi u2)."""
    u1 = prims.slice_(u, [0], [n], [1])
    u2 = prims.slice_(u, [n], [2 * n], [1])
    radius = prims.unary(Prim.SQRT, prims.unary(Prim.LOG, 1.0 - u1) * -2.0)  # 1 - u1 is in (0, 1]
    return radius * prims.unary(Prim.COS, u2 * (2.0 * math.pi))


def randn(shape: ShapeLike, seed: int = 0, dtype: DTypeLike = float32) -> Tensor:
    """Standard normal samples (Box-Muller over RANDOM uniforms), reproducible from ``seed``.

    Computed in float64 and cast, so float16/float32 samples are correctly rounded.
    Example:
        >>> sg.randn((2, 3), seed=0).shape
        (2, 3)
    """
    from shapegrad.random import check_seed

    dims = _shape("randn", shape)
    seed = check_seed(seed, "randn")
    n = 1
    for d in dims:
        n *= d
    uniforms = prims.random_uniform((2 * n,), seed, float64)
    return prims.cast(prims.reshape(_box_muller(uniforms, n), dims), as_dtype(dtype))


def dropout(x: Tensor, p: float, seed: int | Tensor, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Args:
        x: floating-point input.
        p: drop probability in ``[0, 1]``.
        seed: a key from :func:`shapegrad.random.key` (an int32 ``[2]`` tensor, which can
            be a traced input: new key per step, no retrace), or a Python int (baked
            into a compiled graph: the same mask on every call).
        training: when False, return ``x`` unchanged.
    Example:
        >>> sg.dropout(sg.ones(4), 0.0, seed=0).tolist()
        [1.0, 1.0, 1.0, 1.0]
        >>> key = sg.random.key(0)
        >>> sg.dropout(sg.ones(1000), 0.5, sg.random.fold_in(key, 3)).sum().item() > 0
        True
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    if isinstance(seed, Tensor):
        from shapegrad import random

        if not random.is_key(seed):
            raise TypeError(
                f"dropout: seed must be a Python int or a key (int32[2] from sg.random.key), "
                f"got a {seed.aval} tensor"
            )
        u = random.uniform(seed, x.shape, float64)
        keep = prims.binary(Prim.LE, p, u)
    else:
        from shapegrad.random import check_seed

        seed = check_seed(seed, "dropout")
        keep = prims.binary(Prim.LE, p, prims.random_uniform(x.shape, seed, x.dtype, like=x))
    return prims.where(keep, x * (1.0 / (1.0 - p)), 0.0)
