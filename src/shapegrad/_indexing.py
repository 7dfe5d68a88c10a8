"""NumPy indexing for Tensor (``x[...]``), built from SLICE, GATHER, RESHAPE and PERMUTE.

Supported: ints (negative count from the end), slices with any step (a negative
step is a gather with reversed positions), ``None``/``np.newaxis``, one
``Ellipsis``, and integer index arrays (Tensors, NumPy arrays, lists) anywhere,
broadcast together with NumPy's placement rule: when the advanced indices
(arrays, and ints among them) are adjacent their broadcast dims replace them in
place, otherwise they go first. Boolean masks have a data-dependent shape and
are refused with a pointer to ``sg.where``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shapegrad.dtypes import int32, int64
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, broadcast_shapes, fmt
from shapegrad.tensor import Tensor


def _is_array_index(item: Any) -> bool:
    return isinstance(item, Tensor | np.ndarray | list)


def _is_int(item: Any) -> bool:
    return isinstance(item, int | np.integer) and not isinstance(item, bool)


def index(x: Tensor, index: Any) -> Tensor:
    """``x[index]`` with NumPy semantics (see the module docstring)."""
    items = list(index) if isinstance(index, tuple) else [index]
    for item in items:
        if not (
            item is None
            or item is Ellipsis
            or isinstance(item, slice)
            or _is_int(item)
            or _is_array_index(item)
        ):
            raise TypeError(
                f"unsupported index {item!r} ({type(item).__name__}); use ints, slices, None, "
                "..., or integer arrays"
            )
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(
            "index", f"too many indices ({n_real}) for a tensor of shape {fmt(x.shape)}"
        )
    advanced = any(_is_array_index(i) for i in items)
    # NumPy's placement rule looks at the index as written: an Ellipsis (even one that
    # expands to no axes), a slice or None between advanced indices separates them.
    written = [k for k, i in enumerate(items) if _is_array_index(i) or (advanced and _is_int(i))]
    adjacent = written == list(range(written[0], written[-1] + 1)) if written else True
    at = next((k for k, i in enumerate(items) if i is Ellipsis), len(items))
    items[at : at + 1] = [slice(None)] * (x.ndim - n_real)  # also pads a missing '...' at the end

    # Pass 1: slices, ints (when no arrays) and None; array positions keep their axis whole.
    starts, stops, steps, reversed_axes = [], [], [], []
    out_shape: list[int] = []  # the shape after pass 1, one entry per kept item
    kept: list[Any] = []  # per entry of out_shape: None (new/sliced axis) or the array index
    axis = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            kept.append(None)
            continue
        size = x.shape[axis]
        if isinstance(item, slice):
            lo, hi, st = item.indices(size)
            if st < 0:  # take the positions explicitly, reversed order
                positions = list(range(lo, hi, st))
                reversed_axes.append((len(out_shape), positions))
                lo, hi, st = 0, size, 1
                length = size
            else:
                hi = max(hi, lo)
                length = max(0, -(-(hi - lo) // st))
            starts.append(lo)
            stops.append(hi)
            steps.append(st)
            out_shape.append(length)
            kept.append(None)
        elif _is_int(item) and not advanced:
            i = _check_int(int(item), size, axis, x)
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
        else:  # an array index (or an int among arrays): keep the whole axis for pass 2
            starts.append(0)
            stops.append(size)
            steps.append(1)
            out_shape.append(size)
            kept.append(item)
        axis += 1
    y = p.reshape(p.slice_(x, starts, stops, steps), out_shape)
    for position, positions in reversed_axes:
        order = p.constant(np.asarray(positions, dtype=np.int32), int32, like=x)
        y = p.gather(y, order, position)
    if not advanced:
        return y
    return _gather_advanced(y, kept, x, adjacent)


def _check_int(i: int, size: int, axis: int, x: Tensor) -> int:
    if not -size <= i < size:
        raise IndexError(
            f"index {i} is out of bounds for axis {axis} with size {size} (shape {fmt(x.shape)})"
        )
    return i % size


def _index_tensor(item: Any, size: int, axis: int, x: Tensor, like: Tensor) -> Tensor:
    """An int32 (or int64) index tensor with negative entries wrapped (checked now when
    concrete)."""
    if isinstance(item, Tensor):
        if item.dtype.name == "bool":
            raise TypeError(
                "boolean mask indexing has a data-dependent shape; use sg.where(mask, x, 0) instead"
            )
        if item.dtype.is_float:
            raise TypeError(f"index arrays must be integers, got {item.dtype}")
        # int64 stays int64 (indices beyond 2**31); uint8 widens exactly to int32
        idx = item if item.dtype in (int32, int64) else p.cast(item, int32)
        if not idx.is_traced:
            values = idx.numpy()
            if values.size and (values.min() < -size or values.max() >= size):
                raise IndexError(
                    f"index out of range [{-size}, {size}) for axis {axis} of shape {fmt(x.shape)}"
                )
        return p.where(idx < 0, idx + size, idx)
    array = np.asarray(item)
    if array.dtype == np.bool_:
        raise TypeError(
            "boolean mask indexing has a data-dependent shape; use sg.where(mask, x, 0) instead"
        )
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"index arrays must be integers, got {array.dtype} values {item!r}")
    if array.size and (array.min() < -size or array.max() >= size):
        raise IndexError(
            f"index {array.tolist()} out of range [{-size}, {size}) for axis {axis} of shape "
            f"{fmt(x.shape)}"
        )
    kind = int32 if size <= 2**31 else int64  # in range: an axis beyond 2**31 needs int64
    wrapped = np.where(array < 0, array + size, array).astype(kind.numpy)
    return p.constant(wrapped, kind, like=like)


def _gather_advanced(y: Tensor, kept: list[Any], x: Tensor, adjacent: bool) -> Tensor:
    """Pass 2: the array indices of ``kept`` (one per axis of ``y``) as one flat gather."""
    adv = [k for k, item in enumerate(kept) if item is not None]
    rest = [k for k in range(y.ndim) if k not in adv]
    indices = [_index_tensor(kept[k], y.shape[k], k, x, y) for k in adv]
    batch = broadcast_shapes("index", *[i.shape for i in indices])
    flat = None
    stride = 1
    for k, idx in zip(reversed(adv), reversed(indices), strict=True):
        term = p.broadcast_to(idx, batch, "index")
        term = term * stride if stride != 1 else term
        flat = term if flat is None else flat + term
        stride *= y.shape[k]
    assert flat is not None
    moved = p.permute(y, adv + rest)
    merged = p.reshape(moved, [stride, *[y.shape[k] for k in rest]])
    out = p.gather(merged, flat, 0)  # shape: batch + rest
    if not adjacent or adv[0] == 0:
        return out
    # NumPy puts adjacent advanced dims where the first advanced index was.
    nb = len(batch)
    before = adv[0]  # rest axes that precede the advanced block
    perm = [*range(nb, nb + before), *range(nb), *range(nb + before, out.ndim)]
    return p.permute(out, perm)
