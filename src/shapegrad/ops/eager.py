"""The eager interpreter: NumPy runs each primitive at once; a hidden tape records it.

Recording happens only while gradients are enabled and some input is
*tracked* (a leaf created by ``sg.grad`` or the output of a recorded op), so
plain inference pays nothing for autodiff.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.ops import reference
from shapegrad.ops.protocol import SOURCES, Attrs, AVal, Prim, infer_aval
from shapegrad.shapes import describe_caller
from shapegrad.tensor import Tensor


@dataclass(slots=True)
class TapeNode:
    """How an eager tensor was made: enough to apply its VJP rule."""

    prim: Prim
    inputs: tuple[Tensor, ...]
    attrs: Attrs


class _State(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.check_numerics = False
        self.grad_depth = 0


STATE = _State()


class EagerOps:
    """NumPy execution with tape recording. The process-wide instance is ``EAGER``."""

    priority = 0
    name = "eager"

    def apply(self, prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor:
        if prim is Prim.STOP_GRADIENT:
            (x,) = inputs
            return Tensor(self, x._payload, x.aval)
        aval = infer_aval(prim, [t.aval for t in inputs], attrs)
        arrays = [t._payload for t in inputs]
        if any(not isinstance(a, np.ndarray) for a in arrays):
            raise TypeError(f"{prim.value}: eager op received a traced tensor")
        with np.errstate(all="ignore"):
            value = reference.evaluate(prim, arrays, attrs, aval.dtype)
        if STATE.check_numerics and aval.dtype.is_float and not np.all(np.isfinite(value)):
            raise FloatingPointError(
                f"check_numerics: {prim.value} produced non-finite values "
                f"(output {aval}, inputs {', '.join(str(t.aval) for t in inputs)}){describe_caller()}"
            )
        out = Tensor(self, value, aval)
        if (
            STATE.grad_enabled
            and prim not in SOURCES
            and any(t._leaf or t._tape is not None for t in inputs)
        ):
            out._tape = TapeNode(prim, tuple(inputs), dict(attrs))
        return out

    # --- hooks used by the shared autodiff -------------------------------------------

    def producer(self, t: Tensor) -> tuple[Prim, Sequence[Tensor], Attrs] | None:
        node = t._tape
        return None if node is None else (node.prim, node.inputs, node.attrs)

    def identity(self, t: Tensor) -> Any:
        return id(t)

    def make_leaf(self, t: Tensor) -> Tensor:
        if STATE.grad_enabled and (t._leaf or t._tape is not None):
            # Nested grad: an identity node keeps the leaf connected to the outer trace;
            # the inner backward stops at it (it is a leaf there), the outer one passes through.
            leaf = self.apply(Prim.RESHAPE, [t], {"shape": t.shape})
        else:
            leaf = Tensor(self, t._payload, t.aval)
        leaf._leaf = True
        return leaf

    def release(self, tensors: Sequence[Tensor]) -> None:
        """Free the tape behind ``tensors`` after a backward pass (outermost level only)."""
        if STATE.grad_depth <= 1:
            for t in tensors:
                t._tape = None
                t._leaf = False


EAGER = EagerOps()


def tensor(value: Any, dtype: Any = None) -> Tensor:
    """Make an eager tensor from a NumPy array, nested lists or a scalar.

    Args:
        value: array-like data (copied).
        dtype: ``sg.float32`` (default for Python floats), ``"float64"``, ``np.int32``, ...
    Returns:
        An eager :class:`Tensor`.
    Example:
        >>> sg.tensor([[1, 2], [3, 4]], dtype="float32").shape
        (2, 2)
    """
    from shapegrad.dtypes import as_dtype, infer_dtype, to_numpy

    if isinstance(value, Tensor):
        value = value.numpy()
    target = as_dtype(dtype) if dtype is not None else infer_dtype(value)
    array = to_numpy(value, target.numpy, copy=True, what="sg.tensor")
    return Tensor(EAGER, array, AVal(tuple(array.shape), target))


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Within this block eager ops are not recorded (no gradients flow through them)."""
    previous = STATE.grad_enabled
    STATE.grad_enabled = False
    try:
        yield
    finally:
        STATE.grad_enabled = previous


@contextlib.contextmanager
def check_numerics() -> Iterator[None]:
    """Raise FloatingPointError at the first eager op that produces NaN or Inf, naming it."""
    previous = STATE.check_numerics
    STATE.check_numerics = True
    try:
        yield
    finally:
        STATE.check_numerics = previous
