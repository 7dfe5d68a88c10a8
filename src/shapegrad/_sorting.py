"""Sorting: ``sort``, ``argsort`` and ``topk``, written once over the ``ARGSORT`` primitive.

``ARGSORT`` (``ops/protocol.py``) gives the int32 positions of a *stable* sort along one
axis, or only its first ``k``: ties keep their order, and NaN counts as the largest value
(last in an ascending sort, first in a descending one and in ``topk(largest=True)``), as
``torch.sort(stable=True)`` orders them and ``np.sort`` does ascending. The values are a
gather of those positions, so their gradient is that gather's: the cotangent scattered
back to the positions it came from (the positions themselves are not differentiable).

PyTorch spellings: ``argsort(dim=)`` and ``topk(dim=)`` mean what ours do and are
accepted; ``sort(dim=)`` is refused with our spelling, because ``torch.sort`` returns
(values, indices) where ``sg.sort`` returns the values (``np.sort``).
"""

from __future__ import annotations

import builtins
import math

import numpy as np

from shapegrad.functional import _no_torch_dim, _torch_axis
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, fmt, normalize_axis
from shapegrad.tensor import Tensor

_MAX_FLAT = (1 << 31) - 1  # the gather of the values indexes the flattened rows in int32


def argsort(
    x: Tensor, axis: int = -1, descending: bool = False, *, dim: int | None = None, stable: bool = True
) -> Tensor:
    """Positions (int32) that sort ``x`` along ``axis``; stable: ties keep their order.

    ``np.argsort(x, axis, kind="stable")``, or with ``descending`` the largest first (ties
    still in their original order, as ``torch.argsort(descending=True, stable=True)``).
    NaN sorts as the largest value. PyTorch's ``dim=`` is accepted for ``axis=``, and its
    ``stable=`` (the sort is stable either way: also a valid unstable order). Not
    differentiable.

    Example:
        >>> sg.argsort(sg.tensor([3.0, 1.0, 2.0, 1.0])).tolist()
        [1, 3, 2, 0]
    """
    x = p.as_tensor(x, "argsort")
    del stable  # always stable
    axis = _axis("argsort", x, _torch_axis("argsort", axis, dim, default=-1))
    return p.argsort(x, axis, descending)


def sort(
    x: Tensor, axis: int = -1, descending: bool = False, *, dim: int | None = None, stable: bool = True
) -> Tensor:
    """``x`` sorted along ``axis`` (``np.sort``; largest first with ``descending``).

    Stable (``stable=`` is accepted and changes nothing), NaN last ascending and first
    descending. The gradient goes back to the position each value came from. ``dim=`` is
    refused: ``torch.sort(dim=)`` returns
    (values, indices); use ``sg.sort(x, axis=...)`` and ``sg.argsort`` (or ``sg.topk``
    with ``k`` the axis size).

    Example:
        >>> sg.sort(sg.tensor([[3.0, 1.0, 2.0]]), descending=True).tolist()
        [[3.0, 2.0, 1.0]]
    """
    x = p.as_tensor(x, "sort")
    _no_torch_dim(
        "sort", dim, f"torch.sort returns (values, indices): use sg.sort(x, axis={dim!r}) for "
        f"the values and sg.argsort(x, axis={dim!r}) for the indices",
    )
    del stable  # always stable
    axis = _axis("sort", x, axis)
    return take_along_axis(x, p.argsort(x, axis, descending), axis, "sort")


def topk(
    x: Tensor,
    k: int,
    axis: int = -1,
    largest: bool = True,
    sorted: bool = True,
    *,
    dim: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (or smallest, ``largest=False``) elements along ``axis`` and their
    positions: ``(values, indices)`` like ``torch.topk``, indices int32.

    Results are always in sorted order (``sorted=False`` allows any order, so this one
    too); among equal values the earlier position comes first; NaN counts as the largest
    value. ``k`` may be 0 up to the axis size. PyTorch's ``dim=`` is accepted for
    ``axis=``. The values' gradient goes back to the positions they came from.

    Example:
        >>> values, indices = sg.topk(sg.tensor([1.0, 5.0, 3.0, 5.0]), 2)
        >>> values.tolist(), indices.tolist()
        ([5.0, 5.0], [1, 3])
    """
    x = p.as_tensor(x, "topk")
    axis = _axis("topk", x, _torch_axis("topk", axis, dim, default=-1))
    n = x.shape[axis]
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 <= k <= n:
        raise ShapeError(
            "topk", f"k={k!r} must be an int from 0 to {n}, the size of dimension {axis} of "
            f"{fmt(x.shape)}",
        )
    del sorted  # always sorted: a valid answer whatever was asked
    indices = p.argsort(x, axis, largest, int(k))
    return take_along_axis(x, indices, axis, "topk"), indices


def take_along_axis(x: Tensor, indices: Tensor, axis: int, op: str = "take_along_axis") -> Tensor:
    """``np.take_along_axis`` for ``indices`` shaped like ``x`` outside ``axis`` (in range):
    one flat ``GATHER`` of the rows laid end to end, so the gradient is one scatter."""
    moved = [d for d in range(x.ndim) if d != axis] + [axis]
    back = [0] * x.ndim
    for new, old in enumerate(moved):
        back[old] = new
    last = axis == x.ndim - 1
    rows_x = x if last else p.permute(x, moved)
    rows_i = indices if last else p.permute(indices, moved)
    n, k = x.shape[axis], indices.shape[axis]
    lead = rows_i.shape[:-1]
    count = math.prod(lead)
    if count * builtins.max(n, 1) > _MAX_FLAT:
        raise ShapeError(
            op, f"{fmt(x.shape)} has more than {_MAX_FLAT} elements (its values are gathered "
            "by int32 positions)",
        )
    flat_x = p.reshape(rows_x, [count * n])
    flat_i = p.reshape(rows_i, [count, k])
    starts = p.iota([count, k], 0, flat_i.dtype, like=flat_i) * n
    values = p.gather(flat_x, flat_i + starts, 0)
    values = p.reshape(values, [*lead, k])
    return values if last else p.permute(values, back)


def _axis(op: str, x: Tensor, axis: int) -> int:
    if x.ndim == 0:
        raise ShapeError(op, f"needs a tensor with an axis to sort along, got a scalar {fmt(x.shape)}")
    return normalize_axis(op, axis, x.ndim)

