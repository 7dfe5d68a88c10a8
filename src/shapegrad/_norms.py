"""Layer, batch and group normalisation as composites (re-exported by functional.py).

Both take channels on axis 1 (``[N, C, ...]``, PyTorch's layout) and run
eagerly and compiled unchanged. Batch norm is pure: it returns the updated
running statistics instead of mutating them, so a compiled step can carry
them as state.
"""

from __future__ import annotations

import builtins
import math
import numbers
from collections.abc import Sequence

from shapegrad._fused import eager_kernel
from shapegrad.ops import prims as p
from shapegrad.ops.eager import tensor
from shapegrad.shapes import ShapeError, fmt, normalize_axes
from shapegrad.tensor import Tensor

# Below functional.py (which re-exports these): the ops they need are Tensor methods.


def _channel_param(op: str, name: str, param: Tensor | None, x: Tensor) -> None:
    if param is not None and param.shape != (x.shape[1],):
        raise ShapeError(
            op, f"{name} must be [{x.shape[1]}] for input {fmt(x.shape)}, got {fmt(param.shape)}"
        )


def _per_channel(param: Tensor, x: Tensor) -> Tensor:
    return p.broadcast_in_dim(param, x.shape, (1,))


def check_setting(op: str, name: str, value: object, low: float, high: float) -> float:
    """``value`` as a float when it is a finite real number in ``[low, high]``; else a
    ValueError naming the op, the value and the valid range (before any op runs)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
        if math.isfinite(number) and low <= number <= high:
            return number
    valid = f">= {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"
    raise ValueError(f"{op}: {name} must be a finite number {valid}, got {value!r}")


@eager_kernel("layer_norm")
def layer_norm(
    x: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    axis: int | Sequence[int] = -1,
) -> Tensor:
    """Normalise over ``axis`` to zero mean / unit (population) variance, then scale and shift.

    ``weight``/``bias`` have the shape of the normalised axes (``[d]`` for ``axis=-1``).
    Example:
        >>> sg.layer_norm(sg.ones((4, 8)), sg.ones(8), sg.zeros(8)).shape
        (4, 8)
    """
    x = x if isinstance(x, Tensor) else tensor(x)
    axes = normalize_axes("layer_norm", axis, x.ndim)
    eps = check_setting("layer_norm", "eps", eps, 0.0, math.inf)
    # Two-pass moments of data shifted by each row's first element (gradient-free; it
    # cancels in x - mean(x)): a constant row is exactly 0 in every summation order, so
    # eager and compiled agree, and the mean loses less to cancellation.
    first = [builtins.min(d, 1) if a in axes else d for a, d in enumerate(x.shape)]
    x = x - p.slice_(x, [0] * x.ndim, first, [1] * x.ndim).detach()
    centered = x - x.mean(axis=axes, keepdims=True)
    variance = (centered * centered).mean(axis=axes, keepdims=True)
    y = centered / (variance + eps).sqrt()
    param_shape = tuple(x.shape[a] for a in axes)
    for name, param in (("weight", weight), ("bias", bias)):
        if param is None:
            continue
        if param.shape != param_shape:
            raise ShapeError(
                "layer_norm",
                f"{name} must be {fmt(param_shape)} for x {fmt(x.shape)} over axes {axes}, "
                f"got {fmt(param.shape)}",
            )
        spread = p.broadcast_in_dim(param, x.shape, axes)
        y = y * spread if name == "weight" else y + spread
    return y


def batch_norm(
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor,
    running_var: Tensor,
    training: bool,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch normalisation over every axis but the channel axis 1.

    Training: normalise with the batch mean and (biased) variance and return the
    running statistics moved towards the batch's by ``momentum`` (the variance
    update uses the unbiased estimate, as PyTorch does). Evaluation: normalise with
    the running statistics and return them unchanged.

    Args:
        x: ``[N, C, *spatial]``.
        weight, bias: ``[C]`` scale and shift, or None.
        running_mean, running_var: ``[C]``.
        training: use batch statistics (and update the running ones).
    Returns:
        ``(y, new_running_mean, new_running_var)``.
    Example:
        >>> x = sg.tensor([[1.0, 2.0], [3.0, 6.0]])
        >>> y, m, v = sg.batch_norm(x, None, None, sg.zeros(2), sg.ones(2), training=True)
        >>> [round(a, 3) for a in y.numpy()[0].tolist() + m.tolist() + v.tolist()]
        [-1.0, -1.0, 0.2, 0.4, 1.1, 1.7]
    """
    momentum = check_setting("batch_norm", "momentum", momentum, 0.0, 1.0)
    eps = check_setting("batch_norm", "eps", eps, 0.0, math.inf)
    if x.ndim < 2:
        raise ShapeError("batch_norm", f"input must be [N, C, ...], got {fmt(x.shape)}")
    for name, param in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
        _channel_param("batch_norm", name, param, x)
    axes = tuple(a for a in range(x.ndim) if a != 1)
    if training:
        count = x.size // x.shape[1]
        mean = x.mean(axis=axes)
        centered = x - _per_channel(mean, x)
        var = (centered * centered).mean(axis=axes)
        unbiased = var * (count / max(count - 1, 1))
        new_mean = (1.0 - momentum) * running_mean + momentum * mean.detach()
        new_var = (1.0 - momentum) * running_var + momentum * unbiased.detach()
    else:
        mean, var = running_mean, running_var
        centered = x - _per_channel(mean, x)
        new_mean, new_var = running_mean, running_var
    y = centered / _per_channel((var + eps).sqrt(), x)
    if weight is not None:
        y = y * _per_channel(weight, x)
    if bias is not None:
        y = y + _per_channel(bias, x)
    return y, new_mean, new_var


@eager_kernel("group_norm")
def group_norm(
    x: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Group normalisation (Wu & He): channels split into ``num_groups`` groups, each
    normalised over its channels and all spatial positions, per sample.

    Args:
        x: ``[N, C, *spatial]`` with ``C`` divisible by ``num_groups``.
        weight, bias: ``[C]`` or None.
    Example:
        >>> sg.group_norm(sg.ones((2, 4, 3)), 2).shape
        (2, 4, 3)
    """
    eps = check_setting("group_norm", "eps", eps, 0.0, math.inf)
    if x.ndim < 2:
        raise ShapeError("group_norm", f"input must be [N, C, ...], got {fmt(x.shape)}")
    n, c = x.shape[0], x.shape[1]
    if num_groups < 1 or c % num_groups:
        raise ShapeError(
            "group_norm", f"{c} channels of {fmt(x.shape)} do not split into {num_groups} groups"
        )
    _channel_param("group_norm", "weight", weight, x)
    _channel_param("group_norm", "bias", bias, x)
    grouped = x.reshape((n, num_groups, -1))
    y = layer_norm(grouped, eps=eps, axis=-1).reshape(x.shape)
    if weight is not None:
        y = y * _per_channel(weight, x)
    if bias is not None:
        y = y + _per_channel(bias, x)
    return y
