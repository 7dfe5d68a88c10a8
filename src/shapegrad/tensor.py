"""Tensor: a shape, a dtype and an interpreter; operators forward to primitives.

A Tensor never computes anything itself. Its ``_ops`` (the eager NumPy
interpreter or a graph builder) decides what an operation means, so the same
model code runs eagerly and under ``sg.compile``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DType, DTypeLike, as_dtype
from shapegrad.ops.protocol import AVal, Ops, Prim
from shapegrad.shapes import Shape, ShapeError, fmt, normalize_axis

if TYPE_CHECKING:
    from shapegrad.ops.eager import TapeNode


class TraceError(RuntimeError):
    """A traced (compiled) value was used as if it were concrete data."""


class Tensor:
    """An n-dimensional array value. Create eager tensors with :func:`shapegrad.tensor`.

    Example:
        >>> import shapegrad as sg
        >>> x = sg.tensor([[1.0, 2.0], [3.0, 4.0]])
        >>> (x @ x.T).sum().item()
        50.0
    """

    __slots__ = ("__weakref__", "_leaf", "_ops", "_payload", "_tape", "aval")
    __array_priority__ = 1000  # NumPy defers `ndarray + Tensor` to Tensor.__radd__

    def __init__(self, ops: Ops, payload: Any, aval: AVal) -> None:
        self._ops = ops
        self._payload = payload  # np.ndarray for eager tensors, an IR node for graph tensors
        self.aval = aval
        self._tape: TapeNode | None = None
        self._leaf = False

    # --- metadata -------------------------------------------------------------

    @property
    def shape(self) -> Shape:
        return self.aval.shape

    @property
    def dtype(self) -> DType:
        return self.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.aval.shape:
            n *= d
        return n

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def is_traced(self) -> bool:
        """True for a graph (compiled-mode) tensor, which has no data yet."""
        return not isinstance(self._payload, np.ndarray)

    # --- data access (eager only) ---------------------------------------------

    def _concrete(self, what: str) -> npt.NDArray[Any]:
        if self.is_traced:
            raise TraceError(
                f"{what} needs a concrete value, but this tensor {self.aval} is being traced by "
                "sg.compile; keep Python control flow on static values, or use sg.where / return "
                "the value from the compiled function"
            )
        payload: npt.NDArray[Any] = self._payload
        return payload

    def numpy(self) -> npt.NDArray[Any]:
        """The data as a NumPy array (eager tensors only)."""
        return self._concrete(".numpy()")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        array = self._concrete("np.asarray(tensor)")
        return array.astype(dtype) if dtype is not None else array

    def item(self) -> Any:
        array = self._concrete(".item()")
        if array.size != 1:
            raise ValueError(f"item(): tensor has shape {fmt(self.shape)}, not a single element")
        return array.reshape(()).item()

    def tolist(self) -> Any:
        return self._concrete(".tolist()").tolist()

    def __float__(self) -> float:
        return float(self._concrete("float(tensor)").reshape(()))

    def __int__(self) -> int:
        return int(self._concrete("int(tensor)").reshape(()))

    def __bool__(self) -> bool:
        array = self._concrete("bool(tensor) (a Python `if` or `and`/`or` on a tensor)")
        if array.size != 1:
            raise ValueError(
                f"the truth value of a tensor of shape {fmt(self.shape)} is ambiguous; use .any()/.all()"
            )
        return bool(array.reshape(()))

    def __repr__(self) -> str:
        if self.is_traced:
            return f"Tensor(<traced {self.aval}>)"
        body = np.array2string(self._payload, separator=", ", prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype.name})"

    __hash__ = object.__hash__

    # --- conversions ---------------------------------------------------------------

    def astype(self, dtype: DTypeLike) -> Tensor:
        return _p.cast(self, as_dtype(dtype))

    def detach(self) -> Tensor:
        """The same value with no gradient flowing back (alias of ``sg.stop_gradient``)."""
        return _p.stop_gradient(self)

    # --- arithmetic operators ------------------------------------------------------

    def __add__(self, other: Any) -> Tensor:
        return _p.binary(Prim.ADD, self, other)

    def __radd__(self, other: Any) -> Tensor:
        return _p.binary(Prim.ADD, other, self)

    def __sub__(self, other: Any) -> Tensor:
        return _p.binary(Prim.SUB, self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return _p.binary(Prim.SUB, other, self)

    def __mul__(self, other: Any) -> Tensor:
        return _p.binary(Prim.MUL, self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return _p.binary(Prim.MUL, other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return _p.binary(Prim.DIV, self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return _p.binary(Prim.DIV, other, self)

    def __pow__(self, other: Any) -> Tensor:
        if isinstance(other, int | float) and not isinstance(other, bool):
            return _F.pow(self, other)
        return _p.binary(Prim.POW, self, other)

    def __rpow__(self, other: Any) -> Tensor:
        return _p.binary(Prim.POW, other, self)

    def __neg__(self) -> Tensor:
        return _p.unary(Prim.NEG, self)

    def __pos__(self) -> Tensor:
        return self

    def __abs__(self) -> Tensor:
        return _p.unary(Prim.ABS, self)

    def __matmul__(self, other: Any) -> Tensor:
        return _F.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return _F.matmul(_p.coerce(other, self), self)

    # --- comparisons (elementwise, return bool tensors) -----------------------------------

    def __lt__(self, other: Any) -> Tensor:
        return _p.binary(Prim.LT, self, other)

    def __le__(self, other: Any) -> Tensor:
        return _p.binary(Prim.LE, self, other)

    def __gt__(self, other: Any) -> Tensor:
        return _p.binary(Prim.LT, other, self)

    def __ge__(self, other: Any) -> Tensor:
        return _p.binary(Prim.LE, other, self)

    def __eq__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _p.binary(Prim.EQ, self, other)

    def __ne__(self, other: Any) -> Tensor:  # type: ignore[override]
        return _p.binary(Prim.NE, self, other)

    def __invert__(self) -> Tensor:
        return _p.binary(Prim.EQ, self, False)

    # --- indexing ------------------------------------------------------------

    def __getitem__(self, index: Any) -> Tensor:
        return _index(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "shapegrad tensors are immutable; build a new tensor instead "
            "(e.g. sg.where(mask, value, x) or sg.concat)"
        )

    # --- methods mirroring the functional ops ---------------------------------------------

    @property
    def T(self) -> Tensor:
        return _F.transpose(self)

    def transpose(self, *axes: int) -> Tensor:
        return _F.transpose(self, axes if axes else None)

    def permute(self, *axes: int) -> Tensor:
        return _p.permute(self, [normalize_axis("permute", a, self.ndim) for a in axes])

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        target = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return _F.reshape(self, target)  # type: ignore[arg-type]

    def flatten(self) -> Tensor:
        return _F.reshape(self, (-1,))

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return _p.broadcast_to(self, shape)

    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.min(self, axis=axis, keepdims=keepdims)

    def var(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.var(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: int = -1) -> Tensor:
        return _F.argmax(self, axis=axis)

    def any(self) -> Tensor:
        return _F.max(self.astype("int32"), axis=None) > 0

    def all(self) -> Tensor:
        return _F.min(self.astype("int32"), axis=None) > 0

    def exp(self) -> Tensor:
        return _F.exp(self)

    def log(self) -> Tensor:
        return _F.log(self)

    def sqrt(self) -> Tensor:
        return _F.sqrt(self)

    def tanh(self) -> Tensor:
        return _F.tanh(self)

    def sin(self) -> Tensor:
        return _F.sin(self)

    def cos(self) -> Tensor:
        return _F.cos(self)

    def gelu(self) -> Tensor:
        return _F.gelu(self)

    def take(self, indices: Any, axis: int | None = None) -> Tensor:
        return _F.take(self, indices, axis=axis)

    def pad(self, pad_width: Any, constant_values: float = 0.0) -> Tensor:
        return _F.pad(self, pad_width, constant_values=constant_values)

    def sigmoid(self) -> Tensor:
        return _F.sigmoid(self)

    def relu(self) -> Tensor:
        return _F.relu(self)

    def abs(self) -> Tensor:
        return _p.unary(Prim.ABS, self)

    def softmax(self, axis: int = -1) -> Tensor:
        return _F.softmax(self, axis=axis)

    def log_softmax(self, axis: int = -1) -> Tensor:
        return _F.log_softmax(self, axis=axis)

    def logsumexp(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _F.logsumexp(self, axis=axis, keepdims=keepdims)


def _index(x: Tensor, index: Any) -> Tensor:
    """Basic NumPy indexing: ints, slices (positive step), None, Ellipsis, and one int tensor / array."""
    items = list(index) if isinstance(index, tuple) else [index]
    if any(isinstance(i, Tensor | np.ndarray | list) for i in items):
        return _advanced_index(x, items)
    n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(
            "index", f"too many indices ({n_real}) for a tensor of shape {fmt(x.shape)}"
        )
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.ndim - n_real)
    items += [slice(None)] * (x.ndim - n_real)
    starts: list[int] = []
    stops: list[int] = []
    steps: list[int] = []
    out_shape: list[int] = []
    axis = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        size = x.shape[axis]
        if isinstance(item, slice):
            lo, hi, st = item.indices(size)
            if st < 1:
                raise ShapeError(
                    "index",
                    f"negative slice steps are not supported (axis {axis} of {fmt(x.shape)})",
                )
            hi = max(hi, lo)
            starts.append(lo)
            stops.append(hi)
            steps.append(st)
            out_shape.append(max(0, -(-(hi - lo) // st)))
        elif isinstance(item, int | np.integer):
            i = int(item)
            if not -size <= i < size:
                raise ShapeError(
                    "index",
                    f"index {i} is out of bounds for axis {axis} with size {size} (shape {fmt(x.shape)})",
                )
            i %= size
            starts.append(i)
            stops.append(i + 1)
            steps.append(1)
        else:
            raise TypeError(f"unsupported index {item!r}")
        axis += 1
    sliced = _p.slice_(x, starts, stops, steps)
    return _p.reshape(sliced, out_shape)


def _advanced_index(x: Tensor, items: list[Any]) -> Tensor:
    """``x[idx]`` or ``x[:, idx]`` with one integer tensor: a gather along that axis."""
    positions = [k for k, i in enumerate(items) if isinstance(i, Tensor | np.ndarray | list)]
    if len(positions) != 1 or any(
        not (isinstance(i, slice) and i == slice(None))
        for k, i in enumerate(items)
        if k != positions[0]
    ):
        raise TypeError(
            "advanced indexing supports one integer index tensor with ':' elsewhere, e.g. x[idx] or x[:, idx]"
        )
    axis = positions[0]
    idx = items[axis]
    if not isinstance(idx, Tensor):
        idx = _p.constant(np.asarray(idx), "int32", like=x)
    if idx.dtype.name == "bool":
        raise TypeError(
            "boolean mask indexing has a data-dependent shape; use sg.where(mask, x, 0) instead"
        )
    return _p.gather(x, idx, axis)


from shapegrad import functional as _F  # noqa: E402  (Tensor must exist before these import it)
from shapegrad.ops import prims as _p  # noqa: E402
