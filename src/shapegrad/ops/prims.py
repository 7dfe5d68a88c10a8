"""Typed wrappers that bind one primitive each, plus the dispatch rule ``bind``.

Every higher layer (Tensor operators, VJP rules, functional ops) builds on
these. ``bind`` picks the interpreter of the operands: a graph tensor wins
over eager ones (eager tensors captured by a traced function become graph
constants); tensors from two different traces may not be mixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from shapegrad.dtypes import DType, DTypeError, as_dtype, check_fits, float32, infer_dtype
from shapegrad.ops.protocol import ConstValue, Prim
from shapegrad.shapes import Shape, ShapeError, broadcast_shapes, fmt
from shapegrad.tensor import Ops, Tensor

Scalar = int | float | bool


_DEFAULT_OPS: list[Ops] = []  # the eager interpreter, registered by ``ops/eager.py`` (above)


def set_default_ops(ops: Ops) -> None:
    """Make ``ops`` the interpreter of ops whose operands are all Python/NumPy values."""
    _DEFAULT_OPS[:] = [ops]


def default_ops() -> Ops:
    if not _DEFAULT_OPS:
        raise RuntimeError("shapegrad.ops.prims: no default interpreter (import shapegrad)")
    return _DEFAULT_OPS[0]


def pick_ops(inputs: Sequence[Tensor]) -> Ops:
    """The interpreter that runs an op over ``inputs`` (highest priority wins)."""
    chosen: Ops | None = None
    for t in inputs:
        ops = t._ops
        if chosen is None or ops is chosen:
            chosen = ops
            continue
        p_new, p_old = getattr(ops, "priority", 0), getattr(chosen, "priority", 0)
        if p_new == p_old:
            raise ValueError(
                "cannot mix tensors from two different traces (or interpreters) in one op; "
                "pass values into the compiled function as arguments instead of capturing them"
            )
        if p_new > p_old:
            chosen = ops
    return chosen if chosen is not None else default_ops()


def bind(prim: Prim, inputs: Sequence[Tensor], ops: Ops | None = None, **attrs: Any) -> Tensor:
    """Apply ``prim`` through the interpreter of its inputs (or ``ops`` for sources).

    NumPy arrays (and nested lists of numbers) among ``inputs`` become eager constants
    here, the one entry point every op reaches, so ``sg.max(array)`` works like
    ``sg.exp(array)``; anything else is a TypeError naming the op.
    """
    try:
        interpreter = ops if ops is not None else pick_ops(inputs)
    except AttributeError:  # a non-tensor operand: rare, so kept off the hot path
        inputs = [as_tensor(t, prim.value) for t in inputs]
        interpreter = pick_ops(inputs)
    return interpreter.apply(prim, inputs, attrs)


def as_tensor(value: Any, op: str) -> Tensor:
    """``value`` itself when a Tensor, else an eager constant of its inferred dtype."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray | np.generic | list | tuple | bool | int | float):
        if isinstance(value, list | tuple) and _holds_tensor(value):
            raise TypeError(
                f"{op}: a {type(value).__name__} of tensors is not a tensor; combine them "
                "with sg.stack(...) or sg.concat(...)"
            )
        return constant(value)
    raise TypeError(
        f"{op}: unsupported operand type {type(value).__name__} (expected a Tensor or a "
        "NumPy array)"
    )


# --- sources ---------------------------------------------------------------


def constant(value: Any, dtype: DType | str | None = None, like: Tensor | None = None) -> Tensor:
    """A constant tensor on the interpreter of ``like`` (eager when None)."""
    target = as_dtype(dtype) if dtype is not None else infer_dtype(value)
    return bind(
        Prim.CONSTANT,
        [],
        ops=_ops_of(like),
        value=ConstValue(value, target),
    )


def _ops_of(like: Any) -> Ops | None:
    """The interpreter of ``like`` (None: eager, also for a NumPy array)."""
    return like._ops if isinstance(like, Tensor) else None


def full(shape: Sequence[int], value: Scalar, dtype: DType, like: Tensor | None = None) -> Tensor:
    """``value`` broadcast to ``shape`` (a scalar constant plus a BROADCAST node)."""
    scalar = constant(value, dtype, like=like)
    return broadcast_in_dim(scalar, tuple(shape), ()) if shape else scalar


def iota(shape: Sequence[int], axis: int, dtype: DType, like: Tensor | None = None) -> Tensor:
    return bind(
        Prim.IOTA,
        [],
        ops=_ops_of(like),
        shape=tuple(shape),
        axis=axis,
        dtype=dtype,
    )


def random_uniform(
    shape: Sequence[int], seed: int, dtype: DType = float32, like: Tensor | None = None
) -> Tensor:
    return bind(
        Prim.RANDOM,
        [],
        ops=_ops_of(like),
        shape=tuple(shape),
        seed=int(seed),
        dtype=dtype,
    )


# --- scalars and coercion --------------------------------------------------


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    return isinstance(value, list | tuple) and any(_holds_tensor(v) for v in value)


def coerce(value: Any, like: Tensor) -> Tensor:
    """Turn a Python scalar / NumPy array / list into a tensor of ``like``'s dtype (weak typing)."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, list | tuple) and _holds_tensor(value):
        raise TypeError(
            f"a {type(value).__name__} of tensors is not a tensor (given to a shapegrad op); "
            "combine them with sg.stack(...) or sg.concat(...)"
        )
    if isinstance(value, bool | int | float | np.generic | np.ndarray | list | tuple):
        array = np.asarray(value)
        if array.dtype.kind == "f" and not like.dtype.is_float:
            raise DTypeError(
                f"cannot combine a float value with a {like.dtype} tensor; cast with .astype()"
            )
        return constant(array, like.dtype, like=like)
    raise TypeError(f"unsupported operand type {type(value).__name__} for a shapegrad op")


def broadcast_in_dim(x: Tensor, shape: Shape, dims: Sequence[int]) -> Tensor:
    if x.shape == shape:
        return x
    return bind(Prim.BROADCAST, [x], shape=tuple(shape), dims=tuple(dims))


def broadcast_to(x: Tensor, shape: Sequence[int], op: str = "broadcast_to") -> Tensor:
    """NumPy-style broadcast of ``x`` to ``shape`` (trailing alignment)."""
    shape = tuple(shape)
    if x.shape == shape:
        return x
    offset = len(shape) - len(x.shape)
    if offset < 0:
        raise ShapeError(op, f"cannot broadcast {fmt(x.shape)} to lower-rank {fmt(shape)}")
    for i, d in enumerate(x.shape):
        if d not in (1, shape[offset + i]):
            raise ShapeError(
                op,
                f"cannot broadcast {fmt(x.shape)} to {fmt(shape)}: dimension {offset + i} is {d} vs {shape[offset + i]}",
            )
    return broadcast_in_dim(x, shape, tuple(range(offset, len(shape))))


def broadcast_all(op: str, *tensors: Tensor) -> list[Tensor]:
    shape = broadcast_shapes(op, *(t.shape for t in tensors))
    return [broadcast_to(t, shape, op) for t in tensors]


# --- elementwise -----------------------------------------------------------


def unary(prim: Prim, x: Tensor) -> Tensor:
    if not isinstance(x, Tensor):
        x = as_tensor(x, prim.value)
    return x._ops.apply(prim, [x], {})


# A scalar operand that becomes a parameter of the op rather than a tensor input.
_SCALAR_TYPES = (bool, int, float, np.generic)
# Commutative prims take their scalar second, so rules and kernels see one layout.
_COMMUTATIVE = frozenset({Prim.ADD, Prim.MUL, Prim.MAX, Prim.MIN, Prim.EQ, Prim.NE})


def is_scalar(value: Any) -> bool:
    """True for a Python or NumPy scalar (or a 0-d array) that an op takes as a parameter."""
    if isinstance(value, _SCALAR_TYPES):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 0


def weak_scalar(value: Any, dtype: DType) -> Any:
    """``value`` as a NumPy scalar of ``dtype`` (weak typing: the tensor's dtype wins).

    Raises:
        DTypeError: a float value meets a non-float tensor.
        IntegerOverflowError: an integer does not fit the (integer) dtype.
    """
    if type(value) is float and dtype.is_float:  # the common case: nothing to check
        return dtype.numpy.type(value)
    kind = value.dtype.kind if isinstance(value, np.generic | np.ndarray) else None
    if (kind == "f" or (kind is None and isinstance(value, float))) and not dtype.is_float:
        raise DTypeError(f"cannot combine a float value with a {dtype} tensor; cast with .astype()")
    target = dtype.numpy
    if target.kind in "iu" and not (isinstance(value, np.generic) and value.dtype == target):
        check_fits(value, target, "constant")
    return target.type(value)


def binary(prim: Prim, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """Elementwise ``prim`` with weak scalars and NumPy broadcasting.

    A Python/NumPy scalar operand takes the tensor's dtype and becomes a parameter of
    the op (``attrs["scalars"]``, see ``ops/protocol.py``), not a constant tensor.
    """
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            if a.aval is not b.aval and a.shape != b.shape:
                a, b = broadcast_all(prim.value, a, b)
            return bind(prim, [a, b])
        t, value, scalar_first = a, b, False
    elif isinstance(b, Tensor):
        t, value, scalar_first = b, a, prim not in _COMMUTATIVE
    else:
        raise TypeError(f"{prim.value}: at least one operand must be a Tensor")
    dtype = t.aval.dtype
    kind: type = type(value)
    # The hot cases first: a NumPy scalar of the tensor's dtype (what VJP rules pass on)
    # and a Python float with a float tensor need no checks.
    if kind is dtype.numpy.type:
        s: Any = value
    elif kind is float and dtype.is_float:
        s = dtype.numpy.type(value)
    elif is_scalar(value):
        s = weak_scalar(value, dtype)
    else:
        other = coerce(value, t)
        return binary(prim, other, t) if t is b else binary(prim, t, other)
    # One tensor operand: its interpreter runs the op (no ``pick_ops`` needed).
    scalars = (s, None) if scalar_first else (None, s)
    return t._ops.apply(prim, [t], {"scalars": scalars})


def where(cond: Tensor, a: Tensor | Scalar, b: Tensor | Scalar) -> Tensor:
    """``a`` where ``cond`` else ``b``; scalar branches are parameters of the op.

    A scalar takes the dtype of the other branch when that is a tensor, float32 when
    both are scalars (the dtype of the first decides the second's).
    """
    a_scalar = not isinstance(a, Tensor) and is_scalar(a)
    b_scalar = not isinstance(b, Tensor) and is_scalar(b)
    if a_scalar and b_scalar:
        sa = weak_scalar(a, float32)
        sb = weak_scalar(b, float32)
        return bind(Prim.WHERE, [cond], scalars=(None, sa, sb))
    if a_scalar and isinstance(b, Tensor):
        if cond.shape != b.shape:
            cond, b = broadcast_all("where", cond, b)
        return bind(Prim.WHERE, [cond, b], scalars=(None, weak_scalar(a, b.dtype), None))
    if b_scalar and isinstance(a, Tensor):
        if cond.shape != a.shape:
            cond, a = broadcast_all("where", cond, a)
        return bind(Prim.WHERE, [cond, a], scalars=(None, None, weak_scalar(b, a.dtype)))
    if not isinstance(a, Tensor):
        a = coerce(a, b) if isinstance(b, Tensor) else constant(a, float32, like=cond)
    if not isinstance(b, Tensor):
        b = coerce(b, a)
    if not (cond.shape == a.shape == b.shape):
        cond, a, b = broadcast_all("where", cond, a, b)
    return bind(Prim.WHERE, [cond, a, b])


def cast(x: Tensor, dtype: DType) -> Tensor:
    return x if x.dtype == dtype else bind(Prim.CAST, [x], dtype=dtype)


# --- reductions and contractions --------------------------------------------


def reduce_sum(x: Tensor, axes: Sequence[int]) -> Tensor:
    return bind(Prim.REDUCE_SUM, [x], axes=tuple(sorted(axes))) if axes else x


def reduce_max(x: Tensor, axes: Sequence[int]) -> Tensor:
    return bind(Prim.REDUCE_MAX, [x], axes=tuple(sorted(axes))) if axes else x


def einsum(spec: str, *operands: Tensor) -> Tensor:
    return bind(Prim.EINSUM, list(operands), spec=spec)


# --- layout ---------------------------------------------------------------


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    return (
        x
        if tuple(shape) == x.shape
        else bind(Prim.RESHAPE, [x], shape=tuple(int(d) for d in shape))
    )


def permute(x: Tensor, perm: Sequence[int]) -> Tensor:
    perm = tuple(perm)
    return x if perm == tuple(range(len(perm))) else bind(Prim.PERMUTE, [x], perm=perm)


def slice_(x: Tensor, starts: Sequence[int], stops: Sequence[int], steps: Sequence[int]) -> Tensor:
    if tuple(starts) == (0,) * x.ndim and tuple(stops) == x.shape and set(steps) <= {1}:
        return x
    return bind(Prim.SLICE, [x], starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))


def pad(x: Tensor, low: Sequence[int], high: Sequence[int], value: float = 0.0) -> Tensor:
    if not any(low) and not any(high):
        return x
    return bind(Prim.PAD, [x], low=tuple(low), high=tuple(high), value=float(value))


def concat(tensors: Sequence[Tensor], axis: int) -> Tensor:
    return tensors[0] if len(tensors) == 1 else bind(Prim.CONCAT, list(tensors), axis=axis)


def gather(x: Tensor, idx: Tensor, axis: int, what: str | None = None) -> Tensor:
    """``np.take(x, idx, axis)``; ``what`` (optional) is the message of the IndexError an
    out-of-range index raises in compiled code (default: the gather's own)."""
    if what is None:
        return bind(Prim.GATHER, [x, idx], axis=axis)
    return bind(Prim.GATHER, [x, idx], axis=axis, what=what)


def scatter_add(updates: Tensor, idx: Tensor, axis: int, size: int) -> Tensor:
    return bind(Prim.SCATTER_ADD, [updates, idx], axis=axis, size=size)


def argsort(x: Tensor, axis: int, descending: bool = False, k: int | None = None) -> Tensor:
    """The int32 positions of the first ``k`` (all when None) elements of a stable sort of
    ``x`` along ``axis`` (a normalized axis); ``ops/protocol.py``'s ``ARGSORT``."""
    n = x.shape[axis] if 0 <= axis < len(x.shape) else 0
    return bind(
        Prim.ARGSORT, [x], axis=axis, descending=bool(descending), k=n if k is None else k
    )


def stop_gradient(x: Tensor) -> Tensor:
    return bind(Prim.STOP_GRADIENT, [x])


def zeros_like(x: Tensor) -> Tensor:
    return full(x.shape, 0, x.dtype, like=x)


def ones_like(x: Tensor) -> Tensor:
    return full(x.shape, 1, x.dtype, like=x)


# --- collectives (attrs["comm"]: a shapegrad.distributed Communicator) -------------------


def all_reduce(x: Tensor, comm: Any, op: str = "sum", root: int | None = None) -> Tensor:
    """Sum/mean/max of ``x`` over the processes of ``comm`` (``root``: the sum there, zeros
    elsewhere; that form is the gradient of a broadcast)."""
    return bind(Prim.ALL_REDUCE, [x], comm=comm, op=op, root=root)


def all_gather(x: Tensor, comm: Any) -> Tensor:
    return bind(Prim.ALL_GATHER, [x], comm=comm)


def reduce_scatter(x: Tensor, comm: Any) -> Tensor:
    return bind(Prim.REDUCE_SCATTER, [x], comm=comm)


def broadcast_from(x: Tensor, comm: Any, root: int = 0) -> Tensor:
    return bind(Prim.BROADCAST_FROM, [x], comm=comm, root=int(root))
