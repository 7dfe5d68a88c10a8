"""Tensor: a shape, a dtype and an interpreter; operators forward to primitives.

A Tensor never computes anything itself. Its ``_ops`` (the eager NumPy
interpreter or a graph builder) decides what an operation means, so the same
model code runs eagerly and under ``sg.compile``.

This module sits below the primitives and the functional ops that build Tensors:
the operators and op-mirroring methods are declared here for the type checker and
defined in ``_tensor_methods.py``, which installs them when the package is imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DType, DTypeLike
from shapegrad.ops.protocol import Attrs, AVal, Prim
from shapegrad.shapes import Shape, fmt


class Ops(Protocol):
    """An interpreter of primitives. ``apply`` is the single entry point."""

    def apply(self, prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor:
        """Run (eager) or record (graph) ``prim`` on ``inputs``; shapes are checked first."""
        ...


class TapeNode:
    """How an eager tensor was made: enough to apply its VJP rule (a slots record, no
    validation: the op was checked before it ran). Written by the eager interpreter
    (``ops/eager.py``), read by ``autodiff.py``."""

    __slots__ = ("attrs", "inputs", "prim")

    def __init__(self, prim: Prim, inputs: tuple[Tensor, ...], attrs: Attrs) -> None:
        self.prim = prim
        self.inputs = inputs
        self.attrs = attrs


class TraceError(RuntimeError):
    """A traced (compiled) value was used as if it were concrete data."""


class _CastMethods:
    """PyTorch's cast methods, declared for the type checker (``_tensor_methods`` defines
    them). A class of their own: in Tensor's body their names would shadow the builtins
    ``float``/``int``/``bool`` in every annotation after them."""

    __slots__ = ()

    if TYPE_CHECKING:

        def float(self) -> Tensor: ...
        def double(self) -> Tensor: ...
        def half(self) -> Tensor: ...
        def bfloat16(self) -> Tensor: ...
        def int(self) -> Tensor: ...
        def long(self) -> Tensor: ...
        def bool(self) -> Tensor: ...
        def byte(self) -> Tensor: ...


class Tensor(_CastMethods):
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

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        """The slices along the first axis, as ``for row in x`` in NumPy and PyTorch (and
        declared, so type checkers accept it: Python's fallback through ``__getitem__``
        works at run time but is invisible to them)."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

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

    def __pos__(self) -> Tensor:
        return self

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            "shapegrad tensors are immutable; build a new tensor instead "
            "(e.g. sg.where(mask, value, x) or sg.concat)"
        )

    # --- operators and methods: declared here, defined in ``shapegrad/_tensor_methods.py``
    # (above the functional ops they forward to), which installs them on this class when
    # the package is imported: Tensor stays below the ops that build Tensors.

    if TYPE_CHECKING:

        # --- conversions ---------------------------------------------------------------
        def astype(self, dtype: DTypeLike) -> Tensor: ...
        def detach(self) -> Tensor: ...

        # --- arithmetic operators ------------------------------------------------------
        def __add__(self, other: Any) -> Tensor: ...
        def __radd__(self, other: Any) -> Tensor: ...
        def __sub__(self, other: Any) -> Tensor: ...
        def __rsub__(self, other: Any) -> Tensor: ...
        def __mul__(self, other: Any) -> Tensor: ...
        def __rmul__(self, other: Any) -> Tensor: ...
        def __truediv__(self, other: Any) -> Tensor: ...
        def __rtruediv__(self, other: Any) -> Tensor: ...
        def __pow__(self, other: Any) -> Tensor: ...
        def __rpow__(self, other: Any) -> Tensor: ...
        def __neg__(self) -> Tensor: ...
        def __abs__(self) -> Tensor: ...
        def __matmul__(self, other: Any) -> Tensor: ...
        def __rmatmul__(self, other: Any) -> Tensor: ...

        # --- comparisons (elementwise, return bool tensors) -----------------------------------
        def __lt__(self, other: Any) -> Tensor: ...
        def __le__(self, other: Any) -> Tensor: ...
        def __gt__(self, other: Any) -> Tensor: ...
        def __ge__(self, other: Any) -> Tensor: ...
        def __eq__(self, other: Any) -> Tensor: ...  # type: ignore[override]
        def __ne__(self, other: Any) -> Tensor: ...  # type: ignore[override]
        def __invert__(self) -> Tensor: ...

        # --- indexing ------------------------------------------------------------
        def __getitem__(self, index: Any) -> Tensor: ...

        # --- methods mirroring the functional ops ---------------------------------------------
        @property
        def T(self) -> Tensor: ...
        def transpose(self, *axes: int | Sequence[int] | None) -> Tensor: ...
        def swapaxes(self, axis1: int, axis2: int) -> Tensor: ...
        def permute(self, *axes: int | Sequence[int]) -> Tensor: ...
        def squeeze(
            self, axis: int | Sequence[int] | None = None, *, dim: int | None = None
        ) -> Tensor: ...
        def expand_dims(self, axis: int | Sequence[int]) -> Tensor: ...
        def unsqueeze(self, dim: int) -> Tensor: ...
        def clip(self, a_min: Any = None, a_max: Any = None) -> Tensor: ...
        def reshape(self, *shape: int | Sequence[int]) -> Tensor: ...
        def view(self, *shape: int | Sequence[int] | DTypeLike) -> Tensor: ...
        @property
        def size(self) -> int: ...  # the element count (an int that explains torch's size())
        def dim(self) -> int: ...
        def numel(self) -> int: ...
        def contiguous(self) -> Tensor: ...
        def expand(self, *sizes: int | Sequence[int]) -> Tensor: ...
        def clamp(self, min: Any = None, max: Any = None) -> Tensor: ...
        def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor: ...
        def broadcast_to(self, shape: Sequence[int]) -> Tensor: ...
        # reductions: NumPy's axis=/keepdims= or PyTorch's dim=/keepdim= (see functional.py)
        def sum(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            *,
            dim: int | Sequence[int] | None = None,
            keepdim: bool | None = None,
        ) -> Tensor: ...
        def mean(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            *,
            dim: int | Sequence[int] | None = None,
            keepdim: bool | None = None,
        ) -> Tensor: ...
        def max(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            *,
            dim: Any = None,
            keepdim: bool | None = None,
        ) -> Tensor: ...
        def min(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            *,
            dim: Any = None,
            keepdim: bool | None = None,
        ) -> Tensor: ...
        def var(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            ddof: int | None = None,
            *,
            dim: int | Sequence[int] | None = None,
            keepdim: bool | None = None,
            correction: int | None = None,
        ) -> Tensor: ...
        def argmax(
            self,
            axis: int = -1,
            keepdims: bool = False,
            *,
            dim: int | None = None,
            keepdim: bool | None = None,
            dtype: DTypeLike = "int32",
        ) -> Tensor: ...
        def sort(
            self,
            axis: int = -1,
            descending: bool = False,
            *,
            dim: int | None = None,
            stable: bool = True,
        ) -> Tensor: ...
        def argsort(
            self,
            axis: int = -1,
            descending: bool = False,
            *,
            dim: int | None = None,
            stable: bool = True,
        ) -> Tensor: ...
        def topk(
            self,
            k: int,
            axis: int = -1,
            largest: bool = True,
            sorted: bool = True,
            *,
            dim: int | None = None,
        ) -> tuple[Tensor, Tensor]: ...
        def any(self) -> Tensor: ...
        def all(self) -> Tensor: ...
        def exp(self) -> Tensor: ...
        def log(self) -> Tensor: ...
        def sqrt(self) -> Tensor: ...
        def tanh(self) -> Tensor: ...
        def sin(self) -> Tensor: ...
        def cos(self) -> Tensor: ...
        def gelu(self) -> Tensor: ...
        def take(self, indices: Any, axis: int | None = None) -> Tensor: ...
        def pad(self, pad_width: Any, constant_values: float = 0.0) -> Tensor: ...
        def sigmoid(self) -> Tensor: ...
        def relu(self) -> Tensor: ...
        def abs(self) -> Tensor: ...
        def softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor: ...
        def log_softmax(self, axis: int = -1, *, dim: int | None = None) -> Tensor: ...
        def logsumexp(
            self,
            axis: int | Sequence[int] | None = None,
            keepdims: bool = False,
            *,
            dim: int | Sequence[int] | None = None,
            keepdim: bool | None = None,
        ) -> Tensor: ...
