"""Tensor's operators and op-mirroring methods, installed onto :class:`Tensor` from above.

``tensor.py`` sits below the primitives and the functional ops (which build Tensors) and
only declares these for the type checker; they are defined here, as a subclass so that
mypy checks each definition against its declaration, and copied onto ``Tensor`` when this
module is imported (by the package's ``__init__``, before any tensor exists).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import FunctionType
from typing import Any

import numpy as np

from shapegrad import _indexing
from shapegrad import functional as _F
from shapegrad.dtypes import DTypeLike, as_dtype
from shapegrad.ops import prims as _p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor


class _TensorMethods(Tensor):
    """Never instantiated: a namespace whose functions become ``Tensor``'s."""

    __slots__ = ()

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


def _install() -> None:
    for name, value in vars(_TensorMethods).items():
        function = value.fget if isinstance(value, property) else value
        if isinstance(function, FunctionType):
            function.__qualname__ = f"Tensor.{name}"  # what tracebacks and help() show
            setattr(Tensor, name, value)


_install()
