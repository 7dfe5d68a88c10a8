"""Tensor's operators and op-mirroring methods, installed onto :class:`Tensor` from above.

Names are NumPy's; PyTorch's spellings are accepted where they mean the same (``dim=``,
``keepdim=``, ``view``, ``flatten(1)``, ``dim()``, ``numel()``, ``swapaxes``, ``expand``,
``clamp``, the casts ``float() double() half() bfloat16() int() long() bool() byte()``)
and refused with the shapegrad spelling where PyTorch's meaning differs (``x.size()``,
``x.max(dim=)``, ``x.var(dim=)`` without ``ddof``, ``x.transpose(0, 1)`` on a 3-d tensor,
``x.view(dtype)``).

``tensor.py`` sits below the primitives and the functional ops (which build Tensors) and
only declares these for the type checker; they are defined here, as a subclass so that
mypy checks each definition against its declaration, and copied onto ``Tensor`` when this
module is imported (by the package's ``__init__``, before any tensor exists).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import FunctionType
from typing import Any

import numpy as np

from shapegrad import _composites, _indexing, _sorting
from shapegrad import functional as _F
from shapegrad.dtypes import (
    DType,
    DTypeLike,
    as_dtype,
    bfloat16,
    bool_,
    float16,
    float32,
    float64,
    int32,
    int64,
    uint8,
)
from shapegrad.ops import prims as _p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt, normalize_axis
from shapegrad.tensor import Tensor

Axis = int | Sequence[int] | None


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
        order = _axes_arg("transpose", axes)
        if order is not None and len(order) == 2 and self.ndim > 2 and len(axes) == 2:
            a, b = order
            raise ShapeError(
                "transpose",
                f"NumPy's x.transpose takes all {self.ndim} axes of {fmt(self.shape)}, got 2; "
                f"to swap two axes as PyTorch's transpose({a}, {b}) does, use "
                f"x.swapaxes({a}, {b})",
            )
        return _F.transpose(self, order)

    def swapaxes(self, axis1: int, axis2: int) -> Tensor:
        """Exchange two axes (NumPy's ``swapaxes``; PyTorch's ``transpose(a, b)``)."""
        order = list(range(self.ndim))
        a = normalize_axis("swapaxes", axis1, self.ndim)
        b = normalize_axis("swapaxes", axis2, self.ndim)
        order[a], order[b] = order[b], order[a]
        return _F.transpose(self, order)

    def permute(self, *axes: int | Sequence[int]) -> Tensor:
        """PyTorch's name: ``x.permute(0, 2, 1)`` or ``x.permute((0, 2, 1))``."""
        order = _axes_arg("permute", axes)
        if order is None or len(order) != self.ndim:
            raise ShapeError("permute", f"needs {self.ndim} axes for {fmt(self.shape)}, got {axes}")
        return _F.transpose(self, order)

    def squeeze(self, axis: int | Sequence[int] | None = None, *, dim: int | None = None) -> Tensor:
        return _F.squeeze(self, axis, dim=dim)

    def expand_dims(self, axis: int | Sequence[int]) -> Tensor:
        return _F.expand_dims(self, axis)

    def unsqueeze(self, dim: int) -> Tensor:
        return _F.expand_dims(self, dim)

    def clip(self, a_min: Any = None, a_max: Any = None) -> Tensor:
        return _F.clip(self, a_min, a_max)

    def reshape(self, *shape: int | Sequence[int]) -> Tensor:
        target = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        return _F.reshape(self, target)  # type: ignore[arg-type]

    def view(self, *shape: int | Sequence[int] | DTypeLike) -> Tensor:
        """PyTorch's ``x.view(2, -1)``: a reshape (layout ops copy nothing in compiled code).

        A dtype argument (NumPy's and PyTorch's bit reinterpretation) is refused: shapegrad
        has no bit casts; ``x.astype(dtype)`` converts values.
        """
        if len(shape) == 1 and isinstance(shape[0], str | DType | type | np.dtype):
            raise TypeError(
                f"view({shape[0]!r}) reinterprets bits in NumPy and PyTorch, which shapegrad "
                "does not do; use x.astype(dtype) to convert values, or x.view(*shape) / "
                "x.reshape(*shape) for a new shape"
            )
        return self.reshape(*shape)  # type: ignore[arg-type]

    def dim(self) -> int:
        """PyTorch's name for ``ndim``."""
        return self.ndim

    def numel(self) -> int:
        """PyTorch's name for ``size`` (the number of elements)."""
        return math.prod(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (NumPy's ``size``).

        An int that refuses PyTorch's ``x.size()`` / ``x.size(1)`` with the shapegrad
        spelling (``x.shape``), rather than "'int' object is not callable".
        """
        return _ElementCount(math.prod(self.aval.shape))

    def contiguous(self) -> Tensor:
        """PyTorch's ``contiguous()``: shapegrad tensors have no strides, so ``self``."""
        return self

    def expand(self, *sizes: int | Sequence[int]) -> Tensor:
        """PyTorch's ``x.expand(4, -1, 3)``: ``broadcast_to`` with -1 keeping a size."""
        target = _axes_arg("expand", sizes) or ()
        lead = len(target) - self.ndim
        if lead < 0:
            raise ShapeError("expand", f"needs at least {self.ndim} sizes for {fmt(self.shape)}, got {sizes}")
        shape = [self.shape[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(target)]
        return _p.broadcast_to(self, shape, "expand")

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:
        """PyTorch's name for :meth:`clip`."""
        return _F.clip(self, min, max)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """All axes into one (NumPy's ``flatten()``), or PyTorch's ``x.flatten(1)``: the
        axes ``start_dim..end_dim`` into one."""
        if self.ndim == 0:
            return _F.reshape(self, (1,))
        start = normalize_axis("flatten", start_dim, self.ndim)
        end = normalize_axis("flatten", end_dim, self.ndim)
        if start > end:
            raise ShapeError("flatten", f"start_dim {start_dim} comes after end_dim {end_dim} in {fmt(self.shape)}")
        merged = math.prod(self.shape[start : end + 1])
        return _F.reshape(self, (*self.shape[:start], merged, *self.shape[end + 1 :]))

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return _p.broadcast_to(self, shape)

    # Reductions take NumPy's axis=/keepdims= or PyTorch's dim=/keepdim= (see functional.py).

    def sum(
        self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
    ) -> Tensor:
        return _F.sum(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def mean(
        self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
    ) -> Tensor:
        return _F.mean(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def max(
        self, axis: Axis = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None
    ) -> Tensor:
        return _F.max(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def min(
        self, axis: Axis = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None
    ) -> Tensor:
        return _F.min(self, axis, keepdims, dim=dim, keepdim=keepdim)

    def var(
        self,
        axis: Axis = None,
        keepdims: bool = False,
        ddof: int | None = None,
        *,
        dim: Axis = None,
        keepdim: bool | None = None,
        correction: int | None = None,
    ) -> Tensor:
        return _F.var(self, axis, keepdims, ddof, dim=dim, keepdim=keepdim, correction=correction)

    def argmax(
        self,
        axis: int = -1,
        keepdims: bool = False,
        *,
        dim: int | None = None,
        keepdim: bool | None = None,
        dtype: DTypeLike = "int32",
    ) -> Tensor:
        return _F.argmax(self, axis, keepdims, dim=dim, keepdim=keepdim, dtype=dtype)

    def sort(
        self, axis: int = -1, descending: bool = False, *, dim: int | None = None, stable: bool = True
    ) -> Tensor:
        return _sorting.sort(self, axis, descending, dim=dim, stable=stable)

    def argsort(
        self, axis: int = -1, descending: bool = False, *, dim: int | None = None, stable: bool = True
    ) -> Tensor:
        return _sorting.argsort(self, axis, descending, dim=dim, stable=stable)

    def topk(
        self, k: int, axis: int = -1, largest: bool = True, sorted: bool = True, *, dim: int | None = None
    ) -> tuple[Tensor, Tensor]:
        return _sorting.topk(self, k, axis, largest, sorted, dim=dim)

    def any(self) -> Tensor:
        return _composites.any(self)

    def all(self) -> Tensor:
        return _composites.all(self)

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

    def softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
        return _F.softmax(self, axis, dim=dim)

    def log_softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor:
        return _F.log_softmax(self, axis, dim=dim)

    def logsumexp(
        self, axis: Axis = None, keepdims: bool = False, *, dim: Axis = None, keepdim: bool | None = None
    ) -> Tensor:
        return _F.logsumexp(self, axis, keepdims, dim=dim, keepdim=keepdim)


class _CastMethods(Tensor):
    """PyTorch's cast methods, each ``astype`` (differentiable float -> float). A class of
    their own: in a class body their names would shadow ``float``/``int``/``bool`` in the
    annotations after them (see ``tensor._CastMethods``)."""

    __slots__ = ()

    def float(self) -> Tensor:
        """``x.astype(sg.float32)`` (PyTorch's ``x.float()``)."""
        return _p.cast(self, float32)

    def double(self) -> Tensor:
        """``x.astype(sg.float64)``."""
        return _p.cast(self, float64)

    def half(self) -> Tensor:
        """``x.astype(sg.float16)``."""
        return _p.cast(self, float16)

    def bfloat16(self) -> Tensor:
        """``x.astype(sg.bfloat16)``."""
        return _p.cast(self, bfloat16)

    def int(self) -> Tensor:
        """``x.astype(sg.int32)`` (floats truncate toward zero)."""
        return _p.cast(self, int32)

    def long(self) -> Tensor:
        """``x.astype(sg.int64)``."""
        return _p.cast(self, int64)

    def bool(self) -> Tensor:
        """``x.astype(sg.bool_)``: True where ``x`` is non-zero."""
        return _p.cast(self, bool_)

    def byte(self) -> Tensor:
        """``x.astype(sg.uint8)`` (PyTorch's byte is unsigned)."""
        return _p.cast(self, uint8)


class _ElementCount(int):
    """``Tensor.size``: an int (NumPy's element count) that explains PyTorch's ``size()``."""

    __slots__ = ()

    def __call__(self, dim: int | None = None) -> Any:
        spelling = "x.shape" if dim is None else f"x.shape[{dim}]"
        raise TypeError(
            f"x.size is NumPy's element count here ({int(self)}), not PyTorch's size(): "
            f"use {spelling}{' (or x.numel() for the count)' if dim is None else ''}"
        )


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
    for name, value in [*vars(_TensorMethods).items(), *vars(_CastMethods).items()]:
        function = value.fget if isinstance(value, property) else value
        if isinstance(function, FunctionType):
            function.__qualname__ = f"Tensor.{name}"  # what tracebacks and help() show
            setattr(Tensor, name, value)


_install()
