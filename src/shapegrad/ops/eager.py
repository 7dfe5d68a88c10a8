"""The eager interpreter: NumPy runs each primitive at once; a hidden tape records it.

Recording happens only while gradients are enabled and some input is
*tracked* (a leaf created by ``sg.grad`` or the output of a recorded op), so
plain inference pays nothing for autodiff.

Native kernels (``ops/kernels.py``): a SCAN asks the installed kernel provider for a
compiled kernel before its NumPy rule runs; composites marked ``_fused.eager_kernel`` ask
it above this module. NumPy (``reference.py``) stays the reference and the fallback.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shapegrad.dtypes import ALL_DTYPES, DType, bool_
from shapegrad.ops import kernels, prims, reference
from shapegrad.ops.protocol import (
    COMPARISON,
    FLOAT_ONLY_UNARY,
    LAYOUT,
    SOURCES,
    UNARY,
    Attrs,
    AVal,
    Prim,
    infer_aval,
)
from shapegrad.shapes import Shape, describe_caller
from shapegrad.tensor import TapeNode, Tensor


class _State(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.check_numerics = False
        self.grad_depth = 0
        # True inside ``quiet()`` (the backward walk): NumPy's floating-point warnings are
        # already off, so ops skip their own errstate.
        self.quiet = False


STATE = _State()
_SCALAR_DTYPES: dict[type, DType] = {d.numpy.type: d for d in ALL_DTYPES}

# NumPy ufuncs of the elementwise primitives (DIV on integers is ``reference``'s C-style
# division). Comparisons, max/min, neg/abs and integer arithmetic never raise NumPy's
# floating-point flags, so only float arithmetic pays for an errstate.
_UFUNCS: dict[Prim, Any] = {
    **reference.UNARY,
    **reference.BINARY,
    Prim.DIV: np.divide,
    Prim.WHERE: reference.select,
}
_NEVER_FLAGS = COMPARISON | {Prim.MAX, Prim.MIN, Prim.NEG, Prim.ABS, Prim.WHERE}
# Index maps and selections: no arithmetic, so no floating-point flags either.
_NO_ARITHMETIC = LAYOUT | SOURCES | {Prim.REDUCE_MAX, Prim.GATHER, Prim.STOP_GRADIENT, Prim.ARGSORT}
_AVALS: dict[tuple[Shape, str], AVal] = {}
# Primitives that run as one native kernel when a provider is installed (``ops/kernels.py``):
# SCAN, whose NumPy rule is a Python loop over its body's primitives (a layer loop's
# forward and its VJP, itself a SCAN). Operands of these dtypes only, the largest of at
# least KERNEL_MIN_ELEMENTS (below it, as for composites, NumPy is no slower).
_KERNEL_PRIMS = frozenset({Prim.SCAN})
_KERNEL_DTYPES = frozenset({"float32", "float64", "int32", "bool"})
KERNEL_MIN_ELEMENTS = 2048


def _aval(shape: Shape, dtype: DType) -> AVal:
    """A shared AVal per (shape, dtype): eager ops make many and never mutate them."""
    key = (shape, dtype.name)
    aval = _AVALS.get(key)
    if aval is None:
        if len(_AVALS) > 4096:
            _AVALS.clear()
        aval = _AVALS[key] = AVal(shape, dtype)
    return aval


@np.errstate(all="ignore")
def _quiet_call(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with NumPy's floating-point warnings off (inf/NaN are values here)."""
    return fn(*args)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """One errstate for a block of eager ops that runs no user code (the backward walk)."""
    previous = STATE.quiet
    STATE.quiet = True
    try:
        with np.errstate(all="ignore"):
            yield
    finally:
        STATE.quiet = previous


class EagerOps:
    """NumPy execution with tape recording. The process-wide instance is ``EAGER``."""

    priority = 0
    name = "eager"

    def apply(self, prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor:
        fn = _UFUNCS.get(prim)
        if fn is not None:
            if prim is Prim.WHERE:
                out = self._where(inputs, attrs)
            else:
                out = self._elementwise(prim, fn, inputs, attrs)
            if out is not None:
                return out
        if prim is Prim.STOP_GRADIENT:
            (x,) = inputs
            return Tensor(self, x._payload, x.aval)
        aval = infer_aval(prim, [t.aval for t in inputs], attrs)
        arrays = [t._payload for t in inputs]
        if any(not isinstance(a, np.ndarray) for a in arrays):
            raise TypeError(f"{prim.value}: eager op received a traced tensor")
        if prim in _KERNEL_PRIMS and not STATE.check_numerics:
            value = _native(prim, inputs, attrs)
            if value is not None:
                return self._finish(prim, value, aval, inputs, attrs)
        if STATE.quiet or prim in _NO_ARITHMETIC:
            value = reference.evaluate(prim, arrays, attrs, aval.dtype)
        else:
            value = _quiet_call(reference.evaluate, prim, arrays, attrs, aval.dtype)
        return self._finish(prim, value, aval, inputs, attrs)

    def _elementwise(
        self, prim: Prim, fn: Any, inputs: Sequence[Tensor], attrs: Attrs
    ) -> Tensor | None:
        """The lean path of unary/binary ops on operands that need no checks beyond
        identity tests; None sends the op down the general path (which raises the
        errors of bad operands)."""
        x = inputs[0]
        aval = x.aval
        a = x._payload
        if type(a) is not np.ndarray:
            return None
        dtype = aval.dtype
        if len(inputs) == 2:
            other = inputs[1]
            o_aval = other.aval
            if o_aval is not aval and (o_aval.shape != aval.shape or o_aval.dtype is not dtype):
                return None
            args: tuple[Any, ...] = (a, other._payload)
            if type(args[1]) is not np.ndarray:
                return None
        else:
            scalars = attrs.get("scalars")
            if scalars is None:
                if prim not in UNARY or (prim in FLOAT_ONLY_UNARY and not dtype.is_float):
                    return None
                args = (a,)
            else:
                if len(scalars) != 2:
                    return None
                first, second = scalars
                s = second if first is None else first
                if type(s) is not dtype.numpy.type:
                    return None
                args = (a, s) if first is None else (s, a)
        if not dtype.is_float:
            if prim is Prim.DIV:
                fn = reference.divide
            value = fn(*args)
        elif STATE.quiet or prim in _NEVER_FLAGS:
            value = fn(*args)
        else:
            value = _quiet_call(fn, *args)
        if prim in COMPARISON:
            aval = _aval(aval.shape, bool_)
        if type(value) is not np.ndarray or value.dtype is not aval.dtype.numpy:
            value = np.asarray(value, dtype=aval.dtype.numpy)
        return self._finish(prim, value, aval, inputs, attrs)

    def _where(self, inputs: Sequence[Tensor], attrs: Attrs) -> Tensor | None:
        """``np.where`` on a bool condition and branches of its shape and one dtype
        (scalar branches of that dtype); anything else goes down the general path."""
        cond = inputs[0].aval
        if cond.dtype is not bool_:
            return None
        scalars = attrs.get("scalars")
        if scalars is None:
            if len(inputs) != 3:
                return None
            a, b = inputs[1].aval, inputs[2].aval
            if a.shape != cond.shape or (
                a is not b and (b.shape != a.shape or b.dtype is not a.dtype)
            ):
                return None
            value = reference.select(inputs[0]._payload, inputs[1]._payload, inputs[2]._payload)
            return self._finish(Prim.WHERE, value, a, inputs, attrs)
        _, sa, sb = scalars
        if sa is not None and sb is not None:
            dtype = _SCALAR_DTYPES.get(type(sa))
            if dtype is None or type(sb) is not type(sa):
                return None
            value = reference.select(inputs[0]._payload, sa, sb)
            out = _aval(cond.shape, dtype)
        else:
            t = inputs[1]
            out = t.aval
            s = sb if sa is None else sa
            if out.shape != cond.shape or type(s) is not out.dtype.numpy.type:
                return None
            if sa is None:
                value = reference.select(inputs[0]._payload, t._payload, s)
            else:
                value = reference.select(inputs[0]._payload, s, t._payload)
        if value.dtype is not out.dtype.numpy:
            value = value.astype(out.dtype.numpy)
        return self._finish(Prim.WHERE, value, out, inputs, attrs)

    def _finish(
        self, prim: Prim, value: Any, aval: AVal, inputs: Sequence[Tensor], attrs: Attrs
    ) -> Tensor:
        """Wrap ``value`` (checked under check_numerics) and record it on the tape."""
        if STATE.check_numerics and aval.dtype.is_float and not np.all(np.isfinite(value)):
            raise FloatingPointError(
                f"check_numerics: {prim.value} produced non-finite values "
                f"(output {aval}, inputs {', '.join(str(t.aval) for t in inputs)}){describe_caller()}"
            )
        out = Tensor(self, value, aval)
        if STATE.grad_enabled and prim not in SOURCES:
            for t in inputs:
                if t._leaf or t._tape is not None:
                    out._tape = TapeNode(prim, tuple(inputs), attrs)
                    break
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


def _native(prim: Prim, inputs: Sequence[Tensor], attrs: Attrs) -> Any:
    """``prim`` on ``inputs`` through the kernel provider, or None (run the NumPy rule)."""
    provider = kernels.provider()
    if provider is None or max(t.size for t in inputs) < KERNEL_MIN_ELEMENTS:
        return None
    if any(t.aval.dtype.name not in _KERNEL_DTYPES for t in inputs):
        return None
    kernel = provider.primitive(prim, [t.aval for t in inputs], attrs)
    if kernel is None or not kernel.single:
        return None
    return kernel.forward([t._payload for t in inputs])[0]


EAGER = EagerOps()
prims.set_default_ops(EAGER)  # ops on plain Python/NumPy values run eagerly


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
