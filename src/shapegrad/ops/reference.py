"""NumPy semantics of every primitive: the eager interpreter and the reference backend run this."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DType, bfloat16, float32
from shapegrad.ops.einsum_plan import einsum_macs, plan_einsum
from shapegrad.ops.protocol import COLLECTIVES, Attrs, Prim, operands
from shapegrad.ops.special import erf

Array = npt.NDArray[Any]


UNARY: dict[Prim, Callable[[Array], Array]] = {
    Prim.NEG: np.negative,
    Prim.EXP: np.exp,
    Prim.LOG: np.log,
    Prim.SIN: np.sin,
    Prim.COS: np.cos,
    Prim.SQRT: np.sqrt,
    Prim.TANH: np.tanh,
    Prim.ERF: erf,
    Prim.ABS: np.abs,
}

BINARY: dict[Prim, Callable[[Array, Array], Array]] = {
    Prim.ADD: np.add,
    Prim.SUB: np.subtract,
    Prim.MUL: np.multiply,
    Prim.POW: np.power,
    Prim.MAX: np.maximum,
    Prim.MIN: np.minimum,
    Prim.LT: np.less,
    Prim.LE: np.less_equal,
    Prim.EQ: np.equal,
    Prim.NE: np.not_equal,
}


def divide(a: Array, b: Array) -> Array:
    if a.dtype.kind in "iu":
        # C semantics (truncation toward zero), which every backend shares.
        return np.asarray(np.trunc(np.divide(a, np.where(b == 0, 1, b))), dtype=a.dtype)
    return np.divide(a, b)


# Unsigned integers of each float/int width, for the bit blend of ``select``.
_UINT_OF_SIZE: dict[int, Any] = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# From this size on, ``select`` blends bits instead of calling np.where (measured: about
# equal at 4k elements with a random mask, 1.2x slower than np.where on a sorted mask and
# 6-8x faster on a random one from 16k on).
SELECT_BITWISE_MIN = 8192


def select(cond: Array, a: Any, b: Any) -> Array:
    """``np.where(cond, a, b)``, bit for bit; ``cond`` has the output's shape.

    NumPy's where branches per element, and a data-dependent mask (a ReLU's, a dropout's)
    mispredicts half of the branches: 3.8 ms on 1M floats. Large float/int selects blend
    the bit patterns instead (``b ^ ((a ^ b) & -cond)``): 1.3 ms, exact for NaN, inf, -0.0.
    """
    if cond.size < SELECT_BITWISE_MIN:
        small: Array = np.where(cond, a, b)
        return small
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    dtype = a_arr.dtype
    uint = _UINT_OF_SIZE.get(dtype.itemsize)
    if (
        uint is None
        or b_arr.dtype != dtype
        or dtype.kind not in "fi"
        or cond.dtype != np.bool_
        or a_arr.ndim > cond.ndim
        or b_arr.ndim > cond.ndim
    ):
        chosen: Array = np.where(cond, a, b)
        return chosen
    # A uniform mask (a max's tie mask is all False on real data) takes one branch: a
    # read-only view, no pass over the data beyond the (early-exit) any/all.
    if not cond.any():
        return np.broadcast_to(b_arr, cond.shape)
    if cond.all():
        return np.broadcast_to(a_arr, cond.shape)
    a_scalar, b_scalar = _as_scalar(a_arr), _as_scalar(b_arr)
    mask = cond.view(np.uint8).astype(uint)  # 0 or 1 ...
    if b_scalar is not None and not b_scalar.view(uint):  # where(c, x, 0): x & -c
        np.negative(mask, out=mask)
        np.bitwise_and(mask, a_arr.view(uint), out=mask)
    elif a_scalar is not None and not a_scalar.view(uint):  # where(c, 0, x): x & (c - 1)
        np.subtract(mask, uint(1), out=mask)
        np.bitwise_and(mask, b_arr.view(uint), out=mask)
    else:  # b ^ ((a ^ b) & -c)
        np.negative(mask, out=mask)
        b_bits = b_arr.view(uint)
        np.bitwise_and(mask, np.bitwise_xor(a_arr.view(uint), b_bits), out=mask)
        np.bitwise_xor(mask, b_bits, out=mask)
    return mask.view(dtype)


def _as_scalar(x: Array) -> Array | None:
    """``x`` as a 0-d array when it holds one value (0-d, or broadcast with zero strides)."""
    if x.ndim == 0:
        return x
    if not any(x.strides):
        return np.asarray(x[(0,) * x.ndim])
    return None


def random_uniform(shape: Sequence[int], seed: int, dtype: DType) -> Array:
    """Counter-based uniform [0, 1) numbers: murmur3's finaliser over (flat index + seed * golden)."""
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    with np.errstate(over="ignore"):
        x = np.arange(n, dtype=np.uint32) + np.uint32((seed * 0x9E3779B9) & 0xFFFFFFFF)
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x85EBCA6B)
        x ^= x >> np.uint32(13)
        x *= np.uint32(0xC2B2AE35)
        x ^= x >> np.uint32(16)
    values = (x >> np.uint32(8)).astype(np.float64) * (1.0 / (1 << 24))
    return values.astype(dtype.numpy).reshape(tuple(shape))


def _gather(x: Array, idx: Array, axis: int, what: str | None = None) -> Array:
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(
            what
            or f"gather: index out of range [{-n}, {n}) on axis {axis} of shape {list(x.shape)}"
        )
    return np.take(x, np.where(idx < 0, idx + n, idx), axis=axis)


def _scatter_add(updates: Array, idx: Array, axis: int, size: int) -> Array:
    out_shape = updates.shape[:axis] + (size,) + updates.shape[axis + idx.ndim :]
    # float16 rows accumulate in float32 (``evaluate`` rounds the result once)
    out = np.zeros(out_shape, dtype=np.float32 if updates.dtype == np.float16 else updates.dtype)
    flat_idx = np.where(idx < 0, idx + size, idx).reshape(-1)
    moved = np.moveaxis(out, axis, 0)
    upd = updates.reshape(
        updates.shape[:axis] + (flat_idx.size,) + updates.shape[axis + idx.ndim :]
    )
    np.add.at(moved, flat_idx, np.moveaxis(upd, axis, 0))
    return out


def argsort(x: Array, axis: int, descending: bool, k: int) -> Array:
    """The first ``k`` positions of a stable sort along ``axis``: ties keep their order in
    both directions, NaN counts as the largest value (last ascending, first descending),
    as ``torch.sort(stable=True)`` and ``np.argsort(kind="stable")`` order them."""
    if descending:
        # Sorting the reversed row ascending and reversing the result puts ties back in
        # their original order (a sort of -x would not: -NaN is NaN, and int32 min wraps).
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        order = x.shape[axis] - 1 - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    return np.take(order, np.arange(k), axis=axis).astype(np.int32)


# Primitives that only move or select bfloat16 values (no arithmetic, nothing to widen).
_BF16_AS_IS = frozenset(
    {Prim.RESHAPE, Prim.PERMUTE, Prim.BROADCAST, Prim.SLICE, Prim.CONCAT, Prim.GATHER,
     Prim.STOP_GRADIENT, Prim.SCAN, Prim.WHERE, Prim.PAD, *COLLECTIVES}
)  # fmt: skip


def _widen_bfloat16(prim: Prim, args: Sequence[Array], attrs: Attrs, dtype: DType) -> Array:
    """``prim`` computed in float32 from bfloat16 operands, the result rounded once (as
    compiled code does: sums and products accumulate in float32, never in bfloat16)."""
    wide = [a.astype(np.float32) if a.dtype == bfloat16.numpy else a for a in args]
    out = evaluate(prim, wide, attrs, float32 if dtype == bfloat16 else dtype)
    return np.asarray(out, dtype=dtype.numpy)


def _accumulator(dtype: DType) -> np.dtype[Any]:
    """The type sums and products of ``dtype`` accumulate in: float16 in float32, as NumPy
    does only along contiguous axes (and as the compiled targets do; ``Target.accumulators``),
    rounded once to ``dtype`` at the end."""
    return np.dtype(np.float32) if dtype.name == "float16" else dtype.numpy


def evaluate(prim: Prim, args: Sequence[Array], attrs: Attrs, dtype: DType) -> Array:
    """Compute ``prim`` on NumPy arrays; ``dtype`` is the inferred output dtype."""
    if prim not in _BF16_AS_IS and any(
        getattr(a, "dtype", None) == bfloat16.numpy for a in args
    ):
        return _widen_bfloat16(prim, args, attrs, dtype)
    if "scalars" in attrs:  # scalar operands go where they belong (``protocol.operands``)
        args = operands(args, attrs)
    if prim in UNARY:
        result = UNARY[prim](args[0])
    elif prim in BINARY:
        result = BINARY[prim](args[0], args[1])
    elif prim is Prim.DIV:
        result = divide(args[0], args[1])
    elif prim is Prim.WHERE:
        result = select(args[0], args[1], args[2])
    elif prim is Prim.REDUCE_SUM:
        result = np.sum(args[0], axis=attrs["axes"], dtype=_accumulator(dtype))
    elif prim is Prim.REDUCE_MAX:
        # An empty input (with non-empty reduced axes) gives an empty result of the kept shape.
        kept = [d for i, d in enumerate(args[0].shape) if i not in attrs["axes"]]
        empty = np.zeros(kept, dtype.numpy)
        result = np.max(args[0], axis=attrs["axes"]) if args[0].size else empty
    elif prim is Prim.EINSUM:
        acc = _accumulator(dtype)
        wide = [a.astype(acc) for a in args] if acc != dtype.numpy else args
        result = _einsum(attrs["spec"], wide)
    elif prim is Prim.RESHAPE:
        result = np.reshape(args[0], attrs["shape"])
    elif prim is Prim.PERMUTE:
        result = np.transpose(args[0], attrs["perm"])
    elif prim is Prim.BROADCAST:
        result = _broadcast_in_dim(args[0], attrs["shape"], attrs["dims"])
    elif prim is Prim.SLICE:
        index = tuple(
            slice(lo, hi, st)
            for lo, hi, st in zip(attrs["starts"], attrs["stops"], attrs["steps"], strict=True)
        )
        result = args[0][index]
    elif prim is Prim.PAD:
        widths = list(zip(attrs["low"], attrs["high"], strict=True))
        result = np.pad(args[0], widths, constant_values=attrs["value"])
    elif prim is Prim.CONCAT:
        result = np.concatenate(args, axis=attrs["axis"])
    elif prim is Prim.CAST:
        result = args[0].astype(dtype.numpy)
    elif prim is Prim.GATHER:
        result = _gather(args[0], args[1], attrs["axis"], attrs.get("what"))
    elif prim is Prim.SCATTER_ADD:
        result = _scatter_add(args[0], args[1], attrs["axis"], attrs["size"])
    elif prim is Prim.ARGSORT:
        result = argsort(args[0], attrs["axis"], attrs["descending"], attrs["k"])
    elif prim is Prim.CONSTANT:
        result = attrs["value"].array
    elif prim is Prim.IOTA:
        shape = tuple(attrs["shape"])
        axis = attrs["axis"]
        line = np.arange(shape[axis], dtype=dtype.numpy)
        result = np.broadcast_to(
            line.reshape([-1 if i == axis else 1 for i in range(len(shape))]), shape
        )
    elif prim is Prim.RANDOM:
        result = random_uniform(attrs["shape"], attrs["seed"], dtype)
    elif prim is Prim.STOP_GRADIENT:
        result = args[0]
    elif prim in COLLECTIVES:
        result = _collective(prim, args[0], attrs)
    elif prim is Prim.SCAN:  # a Python loop over the traced body (``ops/scan.py``)
        result = attrs["body"].evaluate(args, attrs, dtype)
    else:
        raise NotImplementedError(f"reference: no NumPy rule for {prim}")
    return np.asarray(result, dtype=dtype.numpy)


def _collective(prim: Prim, x: Array, attrs: Attrs) -> Array:
    """Run a collective through its communicator (``shapegrad.distributed.Communicator``)."""
    comm = attrs["comm"]
    x = np.ascontiguousarray(x)
    if prim is Prim.ALL_REDUCE:
        out: Array = comm.all_reduce(x, attrs["op"], attrs.get("root"))
    elif prim is Prim.ALL_GATHER:
        out = comm.all_gather(x)
    elif prim is Prim.REDUCE_SCATTER:
        out = comm.reduce_scatter(x)
    else:
        out = comm.broadcast(x, attrs["root"])
    return out


# Small products run a plan (``einsum_plan.py``): there np.einsum's per-call parsing is
# most of the time. Large ones keep np.einsum with a cached path: with OpenBLAS threads on
# a busy machine, the plan's np.matmul measured 2x slower on the 784-512-512-10 MLP step
# than np.einsum's own route to BLAS, for reasons not pinned down; at one thread they tie.
PLAN_MAX_MACS = 1 << 16
_EINSUM_PLANS: dict[tuple[str, tuple[tuple[int, ...], ...]], Any] = {}


def _einsum(spec: str, args: Sequence[Array]) -> Array:
    """np.einsum, planned once per (spec, shapes): a small two-operand float product runs
    its plan (one matmul on reshaped views); the rest np.einsum with a computed path."""
    if len(args) < 2:
        return np.asarray(np.einsum(spec, *args))
    key = (spec, tuple(a.shape for a in args))
    plan = _EINSUM_PLANS.get(key)
    if plan is None:
        if len(_EINSUM_PLANS) > 4096:
            _EINSUM_PLANS.clear()
        a, b = args[0], args[-1]
        small = (
            len(args) == 2
            and a.dtype.kind == "f"
            and b.dtype == a.dtype
            and einsum_macs(spec, a.shape, b.shape) <= PLAN_MAX_MACS
        )
        if small:
            plan = plan_einsum(spec, a.shape, b.shape)
        else:
            plan = np.einsum_path(spec, *args, optimize="greedy")[0]
        _EINSUM_PLANS[key] = plan
    if callable(plan) and args[0].dtype.kind == "f" and args[1].dtype == args[0].dtype:
        result: Array = plan(args[0], args[1])
        return result
    if callable(plan):  # same shapes, other dtypes: NumPy's own einsum
        return np.asarray(np.einsum(spec, *args))
    return np.asarray(np.einsum(spec, *args, optimize=plan))


def _broadcast_in_dim(x: Array, shape: Sequence[int], dims: Sequence[int]) -> Array:
    expanded = [1] * len(shape)
    for i, d in enumerate(dims):
        expanded[d] = x.shape[i]
    return np.broadcast_to(x.reshape(expanded), tuple(shape))
