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
from shapegrad.shapes import Shape, ShapeError, fmt

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
        return _indexing.index(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "shapegrad tensors are immutable; build a new tensor instead "
            "(e.g. sg.where(mask, value, x) or sg.concat)"
        )

    # --- methods mirroring the functional ops ---------------------------------------------

    @property
    def T(self) -> Tensor:
        return _F.transpose(self)

    def transpose(self, *axes: int | Sequence[int] | None) -> Tensor:
        """Permute axes: ``x.transpose(1, 0, 2)``, ``x.transpose((1, 0, 2))`` or reversed."""
        return _F.transpose(self, _axes_arg("transpose", axes))

    def permute(self, *axes: int | Sequence[int]) -> Tensor:
        """PyTorch's name: ``x.permute(0, 2, 1)`` or ``x.permute((0, 2, 1))``."""
        order = _axes_arg("permute", axes)
        if order is None or len(order) != self.ndim:
            raise ShapeError("permute", f"needs {self.ndim} axes for {fmt(self.shape)}, got {axes}")
        return _F.transpose(self, order)

    def squeeze(self, axis: int | Sequence[int] | None = None) -> Tensor:
        return _F.squeeze(self, axis)

    def expand_dims(self, axis: int | Sequence[int]) -> Tensor:
        return _F.expand_dims(self, axis)

    def unsqueeze(self, dim: int) -> Tensor:
        return _F.expand_dims(self, dim)

    def clip(self, a_min: Any = None, a_max: Any = None) -> Tensor:
        return _F.clip(self, a_min, a_max)

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


def _axes_arg(op: str, axes: tuple[Any, ...]) -> tuple[int, ...] | None:
    """Varargs ``(1, 0)``, one sequence ``((1, 0),)``, or nothing / ``(None,)`` (reverse)."""
    if not axes or (len(axes) == 1 and axes[0] is None):
        return None
    if len(axes) == 1 and not isinstance(axes[0], int | np.integer):
        return tuple(int(a) for a in axes[0])
    if not all(isinstance(a, int | np.integer) for a in axes):
        raise TypeError(f"{op}: axes must be ints or one sequence of ints, got {axes!r}")
    return tuple(int(a) for a in axes)


from shapegrad import _indexing  # noqa: E402
from shapegrad import functional as _F  # noqa: E402  (Tensor must exist before these import it)
from shapegrad.ops import prims as _p  # noqa: E402
