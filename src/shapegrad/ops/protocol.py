"""The primitive set every interpreter implements, and their shape/dtype rules.

A *primitive* is one of :class:`Prim`. Every Tensor operation, composite op,
loss, layer and optimizer is built from these. Interpreters (eager NumPy,
graph builder) implement :class:`Ops`; shape and dtype inference lives here
once, so both interpreters raise the same errors at the same point.

Conventions the rest of the system relies on:

* Elementwise binary primitives take operands of *equal* shape and dtype;
  broadcasting is made explicit by ``BROADCAST`` nodes inserted by Tensor's
  operators (so gradients of broadcasts are plain ``REDUCE_SUM``).
* A Python/NumPy scalar operand of a binary primitive or ``WHERE`` is a
  *parameter* of the op, not a tensor: ``attrs["scalars"]`` has one entry per
  operand, ``None`` where the next tensor input goes and the scalar (a NumPy
  scalar of the op's dtype, already checked to fit) elsewhere. ``x * 0.5`` is
  ``MUL`` with one input and ``scalars=(None, float32(0.5))``. The eager
  interpreter hands the scalar straight to NumPy; the graph builder spells it
  in the IR as a 0-d ``CONSTANT`` plus ``BROADCAST`` (the form every compiler
  pass already folds into a loop constant). VJP rules see operand lists with
  the scalars in place (``vjp.py``), so one rule serves both forms.
* ``REDUCE_*`` remove the reduced axes (keepdims is a later ``RESHAPE``).
* ``EINSUM`` takes one or two operands and a spec with explicit letters, no
  ``...`` and no letter repeated inside one operand (``functional.einsum``
  rewrites those forms); letters absent from the output are summed.
* ``BROADCAST(shape, dims)`` is XLA's broadcast_in_dim: operand axis ``i``
  becomes output axis ``dims[i]``; its size must equal the output's or be 1.
* ``RANDOM`` is a counter-based hash of (flat index, seed): every backend
  produces identical bits (see ``reference.random_uniform``).
* ``ARGSORT(axis, descending, k)`` gives int32 positions, not values: the first ``k``
  of a *stable* sort along ``axis`` (ties keep their order; NaN is the largest value, as
  in PyTorch). ``sort``/``topk`` values are a ``GATHER`` of these positions, so their
  gradient is that gather's (a scatter back through the positions) and ARGSORT itself
  is non-differentiable.
* Collectives (``ALL_REDUCE``, ``ALL_GATHER``, ``REDUCE_SCATTER``,
  ``BROADCAST_FROM``) carry their communicator in ``attrs["comm"]`` (an object of
  ``shapegrad.distributed``'s ``Communicator`` protocol, hashed by identity): every
  process of the communicator runs the same graph and meets the same collectives
  in the same order. Gather and scatter work on the leading axis (contiguous
  blocks per process, as MPI lays them out).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shapegrad.dtypes import DType, DTypeError, as_dtype, bool_, check_fits, int32, int64
from shapegrad.shapes import Shape, ShapeError, fmt, resolve_reshape

Attrs = Mapping[str, Any]


class Prim(enum.Enum):
    """Primitive operations. The value is the name printed in IR dumps."""

    # Members are singletons: identity hashing (in C) instead of Enum's Python-level
    # hash of the name, which dominated set/dict lookups on the eager hot path.
    __hash__ = object.__hash__

    # elementwise unary
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    SIN = "sin"
    COS = "cos"
    SQRT = "sqrt"
    TANH = "tanh"
    ERF = "erf"
    ABS = "abs"
    # elementwise binary (equal shapes)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAX = "maximum"
    MIN = "minimum"
    LT = "less"
    LE = "less_equal"
    EQ = "equal"
    NE = "not_equal"
    # selection
    WHERE = "where"
    # reductions
    REDUCE_SUM = "reduce_sum"
    REDUCE_MAX = "reduce_max"
    # contraction
    EINSUM = "einsum"
    # layout (index maps, never arithmetic)
    RESHAPE = "reshape"
    PERMUTE = "permute"
    BROADCAST = "broadcast"
    SLICE = "slice"
    PAD = "pad"
    CONCAT = "concat"
    # types and indexing
    CAST = "cast"
    GATHER = "gather"
    SCATTER_ADD = "scatter_add"
    # ordering: stable sorted positions along one axis (attrs axis, descending, k)
    ARGSORT = "argsort"
    # sources
    CONSTANT = "constant"
    IOTA = "iota"
    RANDOM = "random_uniform"
    # autodiff frontier (identity forward, zero gradient)
    STOP_GRADIENT = "stop_gradient"
    # graph-only: a named input of a compiled graph
    INPUT = "input"
    # collectives over the processes of attrs["comm"] (see shapegrad.distributed)
    ALL_REDUCE = "all_reduce"  # attrs: comm, op ("sum" | "mean" | "max"), root (None | int)
    ALL_GATHER = "all_gather"  # leading axes of every process, concatenated in rank order
    REDUCE_SCATTER = "reduce_scatter"  # sum over processes, leading-axis block `rank` kept
    BROADCAST_FROM = "broadcast_from"  # attrs: comm, root: the root's value on every process
    # structured: a loop over a body sub-graph traced once (``ops/scan.py``)
    SCAN = "scan"


UNARY = frozenset(
    {Prim.NEG, Prim.EXP, Prim.LOG, Prim.SIN, Prim.COS, Prim.SQRT, Prim.TANH, Prim.ERF, Prim.ABS}
)
FLOAT_ONLY_UNARY = frozenset(
    {Prim.EXP, Prim.LOG, Prim.SIN, Prim.COS, Prim.SQRT, Prim.TANH, Prim.ERF}
)
ARITHMETIC = frozenset({Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.POW, Prim.MAX, Prim.MIN})
COMPARISON = frozenset({Prim.LT, Prim.LE, Prim.EQ, Prim.NE})
BINARY = ARITHMETIC | COMPARISON
ELEMENTWISE = UNARY | BINARY | {Prim.WHERE, Prim.CAST, Prim.STOP_GRADIENT}
REDUCTIONS = frozenset({Prim.REDUCE_SUM, Prim.REDUCE_MAX})
LAYOUT = frozenset({Prim.RESHAPE, Prim.PERMUTE, Prim.BROADCAST, Prim.SLICE, Prim.PAD, Prim.CONCAT})
SOURCES = frozenset({Prim.CONSTANT, Prim.IOTA, Prim.RANDOM, Prim.INPUT})
COLLECTIVES = frozenset(
    {Prim.ALL_REDUCE, Prim.ALL_GATHER, Prim.REDUCE_SCATTER, Prim.BROADCAST_FROM}
)
REDUCE_OPS = ("sum", "mean", "max")
SCALAR_OPERANDS = BINARY | {Prim.WHERE}  # prims that take ``attrs["scalars"]``
NON_DIFFERENTIABLE = COMPARISON | {
    Prim.IOTA, Prim.RANDOM, Prim.CONSTANT, Prim.STOP_GRADIENT, Prim.ARGSORT
}


@dataclass(frozen=True)
class AVal:
    """Abstract value: what is known about a tensor without its data."""

    shape: Shape
    dtype: DType

    def __str__(self) -> str:
        return f"{self.dtype.name}{fmt(self.shape)}"


# ---------------------------------------------------------------------------
# Shape and dtype inference: one rule per primitive family.
# ---------------------------------------------------------------------------


def _same_dtype(prim: Prim, avals: Sequence[AVal]) -> DType:
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1:
        shown = ", ".join(str(a) for a in avals)
        raise DTypeError(f"{prim.value}: operands must share one dtype, got {shown}; use .astype()")
    return avals[0].dtype


def _same_shape(prim: Prim, avals: Sequence[AVal]) -> Shape:
    first = avals[0].shape
    for other in avals[1:]:
        if other.shape != first:
            raise ShapeError(
                prim.value, f"operand shapes differ: {fmt(first)} vs {fmt(other.shape)}"
            )
    return first


def scalar_dtype(value: Any) -> DType:
    """The dtype of a scalar operand (a NumPy scalar made by ``prims.weak_scalar``)."""
    return as_dtype(value.dtype)


def operands(inputs: Sequence[Any], attrs: Attrs) -> list[Any]:
    """The full operand list of an op: ``inputs`` with its scalar operands put in place."""
    scalars = attrs.get("scalars")
    if scalars is None:
        return list(inputs)
    pending = iter(inputs)
    return [next(pending) if s is None else s for s in scalars]


def _infer_with_scalars(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    """Shape from the tensor operands; dtype from every operand (scalars carry theirs)."""
    scalars: tuple[Any, ...] = attrs["scalars"]
    if prim not in SCALAR_OPERANDS or len(scalars) != (3 if prim is Prim.WHERE else 2):
        raise ValueError(f"{prim.value}: scalar operands {scalars!r} do not fit this primitive")
    if len(avals) != sum(s is None for s in scalars) or not avals:
        raise ValueError(f"{prim.value}: {len(avals)} tensor inputs for scalars {scalars!r}")
    full = [AVal(avals[0].shape, scalar_dtype(s)) if s is not None else None for s in scalars]
    pending = iter(avals)
    filled = [a if a is not None else next(pending) for a in full]
    return _infer_elementwise(prim, filled, {})


def _infer_elementwise(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    if "scalars" in attrs:
        return _infer_with_scalars(prim, avals, attrs)
    if prim is Prim.WHERE:
        cond, a, b = avals
        if cond.dtype != bool_:
            raise DTypeError(f"where: condition must be bool, got {cond.dtype}")
        return AVal(_same_shape(prim, avals), _same_dtype(prim, [a, b]))
    if prim is Prim.CAST:
        return AVal(avals[0].shape, attrs["dtype"])
    shape = _same_shape(prim, avals)
    dtype = _same_dtype(prim, avals)
    if prim in FLOAT_ONLY_UNARY and not dtype.is_float:
        raise DTypeError(f"{prim.value}: needs a floating-point operand, got {dtype}")
    return AVal(shape, bool_ if prim in COMPARISON else dtype)


def _infer_reduce(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    (x,) = avals
    axes: tuple[int, ...] = attrs["axes"]
    if any(not 0 <= a < len(x.shape) for a in axes):
        raise ShapeError(prim.value, f"axes {axes} out of range for shape {fmt(x.shape)}")
    if prim is Prim.REDUCE_MAX and any(x.shape[a] == 0 for a in axes):
        raise ShapeError(prim.value, f"max over an empty axis of shape {fmt(x.shape)}")
    return AVal(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)


def parse_einsum_spec(spec: str, n_operands: int) -> tuple[list[str], str]:
    """Split a primitive einsum spec ``"ij,jk->ik"`` into operand letters and output letters."""
    if "->" not in spec:
        raise ShapeError("einsum", f"primitive spec {spec!r} needs an explicit '->'")
    lhs, out = spec.split("->")
    terms = lhs.split(",")
    if len(terms) != n_operands:
        raise ShapeError("einsum", f"spec {spec!r} names {len(terms)} operands, got {n_operands}")
    return terms, out


_EINSUM_AVALS: dict[tuple[str, tuple[AVal, ...]], AVal] = {}


def _infer_einsum(avals: Sequence[AVal], attrs: Attrs) -> AVal:
    """Checked once per (spec, operand types): eager matmuls repeat the same few."""
    key = (attrs["spec"], tuple(avals))
    aval = _EINSUM_AVALS.get(key)
    if aval is None:
        aval = _check_einsum(avals, attrs)
        if len(_EINSUM_AVALS) > 4096:
            _EINSUM_AVALS.clear()
        _EINSUM_AVALS[key] = aval
    return aval


def _check_einsum(avals: Sequence[AVal], attrs: Attrs) -> AVal:
    spec: str = attrs["spec"]
    terms, out = parse_einsum_spec(spec, len(avals))
    sizes: dict[str, int] = {}
    for term, aval in zip(terms, avals, strict=True):
        if len(term) != len(aval.shape):
            raise ShapeError(
                "einsum", f"operand {term!r} has rank {len(term)} but shape {fmt(aval.shape)}"
            )
        if len(set(term)) != len(term):
            raise ShapeError("einsum", f"primitive operand {term!r} repeats a letter")
        for letter, size in zip(term, aval.shape, strict=True):
            if sizes.setdefault(letter, size) != size:
                shown = " and ".join(fmt(a.shape) for a in avals)
                raise ShapeError(
                    "einsum",
                    f"{spec!r}: index {letter!r} is {sizes[letter]} in one operand and {size} in another ({shown})",
                )
    if any(letter not in sizes for letter in out) or len(set(out)) != len(out):
        raise ShapeError("einsum", f"{spec!r}: output letters must appear once and in an operand")
    return AVal(tuple(sizes[letter] for letter in out), _same_dtype(Prim.EINSUM, avals))


def _infer_layout(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    x = avals[0]
    rank = len(x.shape)
    if prim is Prim.RESHAPE:
        return AVal(resolve_reshape("reshape", x.shape, attrs["shape"]), x.dtype)
    if prim is Prim.PERMUTE:
        perm: tuple[int, ...] = attrs["perm"]
        if sorted(perm) != list(range(rank)):
            raise ShapeError(
                "permute", f"{perm} is not a permutation of the axes of {fmt(x.shape)}"
            )
        return AVal(tuple(x.shape[p] for p in perm), x.dtype)
    if prim is Prim.BROADCAST:
        shape: Shape = attrs["shape"]
        dims: tuple[int, ...] = attrs["dims"]
        if (
            len(dims) != rank
            or list(dims) != sorted(set(dims))
            or any(d >= len(shape) for d in dims)
        ):
            raise ShapeError(
                "broadcast", f"dims {dims} do not map {fmt(x.shape)} into {fmt(shape)}"
            )
        for i, d in enumerate(dims):
            if x.shape[i] not in (1, shape[d]):
                raise ShapeError(
                    "broadcast",
                    f"cannot broadcast {fmt(x.shape)} to {fmt(shape)}: dimension {i} is {x.shape[i]} vs {shape[d]}",
                )
        return AVal(tuple(shape), x.dtype)
    if prim is Prim.SLICE:
        starts, stops, steps = attrs["starts"], attrs["stops"], attrs["steps"]
        if not len(starts) == len(stops) == len(steps) == rank:
            raise ShapeError(
                "slice", f"needs {rank} (start, stop, step) triples for {fmt(x.shape)}"
            )
        out = []
        for d, (lo, hi, st) in enumerate(zip(starts, stops, steps, strict=True)):
            if st < 1 or not 0 <= lo <= hi <= x.shape[d]:
                raise ShapeError(
                    "slice", f"bad range {lo}:{hi}:{st} for dimension {d} of {fmt(x.shape)}"
                )
            out.append(max(0, -(-(hi - lo) // st)))
        return AVal(tuple(out), x.dtype)
    if prim is Prim.PAD:
        low, high = attrs["low"], attrs["high"]
        if len(low) != rank or len(high) != rank or min((*low, *high), default=0) < 0:
            raise ShapeError(
                "pad", f"needs {rank} non-negative (low, high) pairs for {fmt(x.shape)}"
            )
        return AVal(
            tuple(d + lo + hi for d, lo, hi in zip(x.shape, low, high, strict=True)), x.dtype
        )
    # CONCAT
    axis: int = attrs["axis"]
    dtype = _same_dtype(prim, avals)
    for other in avals[1:]:
        if len(other.shape) != rank or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, other.shape, strict=True)) if i != axis
        ):
            shown = ", ".join(fmt(a.shape) for a in avals)
            raise ShapeError("concat", f"shapes {shown} differ outside axis {axis}")
    total = sum(a.shape[axis] for a in avals)
    return AVal(x.shape[:axis] + (total,) + x.shape[axis + 1 :], dtype)


def _infer_indexing(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    x, idx = avals
    axis: int = attrs["axis"]
    if idx.dtype != int32 and idx.dtype != int64:
        raise DTypeError(f"{prim.value}: indices must be int32 or int64, got {idx.dtype}")
    if prim is Prim.GATHER:
        return AVal(x.shape[:axis] + idx.shape + x.shape[axis + 1 :], x.dtype)
    # SCATTER_ADD: x are the updates shaped like a gather result; output has `size` on axis.
    size: int = attrs["size"]
    n = len(idx.shape)
    out = x.shape[:axis] + (size,) + x.shape[axis + n :]
    return AVal(out, x.dtype)


_MAX_SORTED = (1 << 31) - 1  # positions are int32


def _infer_argsort(avals: Sequence[AVal], attrs: Attrs) -> AVal:
    """``ARGSORT``: the positions (int32) of the first ``k`` elements of each row along
    ``axis`` in stable sorted order (``descending``: largest first; NaN counts as the
    largest value, as in PyTorch: last ascending, first descending). The result has ``k``
    on ``axis`` (``k`` = the axis size for a full argsort)."""
    (x,) = avals
    axis: int = attrs["axis"]
    k: int = attrs["k"]
    if not x.shape:
        raise ShapeError("argsort", f"needs a tensor with an axis to sort along, got a scalar {x}")
    if not 0 <= axis < len(x.shape):
        raise ShapeError(
            "argsort", f"axis {axis} is out of range for shape {fmt(x.shape)} (rank {len(x.shape)})"
        )
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ShapeError(
            "argsort", f"k={k} is out of range for dimension {axis} of size {n} of {fmt(x.shape)}"
        )
    if n > _MAX_SORTED:
        raise ShapeError(
            "argsort", f"dimension {axis} of {fmt(x.shape)} has more than {_MAX_SORTED} elements "
            "(positions are int32)"
        )
    return AVal(x.shape[:axis] + (k,) + x.shape[axis + 1 :], int32)


def _infer_collective(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    (x,) = avals
    size = int(attrs["comm"].size)
    if prim is Prim.ALL_REDUCE:
        op = attrs["op"]
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
        if x.dtype == bool_ and op != "max":
            raise DTypeError(
                f"all_reduce: op {op!r} needs a numeric operand, got {x}; 'max' is 'any'"
            )
        if op == "mean" and not x.dtype.is_float:
            raise DTypeError(f"all_reduce: op 'mean' needs a floating-point operand, got {x}")
        root = attrs.get("root")
        if root is not None and (op != "sum" or not 0 <= root < size):
            raise ValueError(f"all_reduce: root={root} needs op 'sum' and 0 <= root < {size}")
        return x
    if prim is Prim.BROADCAST_FROM:
        root = attrs["root"]
        if not 0 <= root < size:
            raise ValueError(
                f"broadcast: root {root} is not a rank of a {size}-process communicator"
            )
        return x
    if not x.shape:
        raise ShapeError(prim.value, f"needs an operand with a leading axis, got a scalar {x}")
    lead = x.shape[0]
    if prim is Prim.ALL_GATHER:
        return AVal((lead * size, *x.shape[1:]), x.dtype)
    if x.dtype == bool_:
        raise DTypeError(f"reduce_scatter: needs a numeric operand, got {x}")
    if lead % size:
        raise ShapeError(
            prim.value, f"leading axis of {fmt(x.shape)} does not split into {size} equal blocks"
        )
    return AVal((lead // size, *x.shape[1:]), x.dtype)


def infer_aval(prim: Prim, avals: Sequence[AVal], attrs: Attrs) -> AVal:
    """Output shape and dtype of ``prim`` applied to ``avals``; raises ShapeError/DTypeError."""
    if prim in ELEMENTWISE:
        return _infer_elementwise(prim, avals, attrs)
    if prim in REDUCTIONS:
        return _infer_reduce(prim, avals, attrs)
    if prim is Prim.EINSUM:
        return _infer_einsum(avals, attrs)
    if prim in LAYOUT:
        out = _infer_layout(prim, avals, attrs)
        if prim in _SIZING:
            _check_elements(prim, out.shape)
        return out
    if prim in (Prim.GATHER, Prim.SCATTER_ADD):
        return _infer_indexing(prim, avals, attrs)
    if prim in COLLECTIVES:
        return _infer_collective(prim, avals, attrs)
    if prim is Prim.ARGSORT:
        return _infer_argsort(avals, attrs)
    if prim is Prim.SCAN:  # the traced body knows its shapes (``ops/scan.py``)
        aval: AVal = attrs["body"].infer(avals, attrs)
        return aval
    if prim in SOURCES:
        if prim is Prim.CONSTANT:
            value = attrs["value"]
            return AVal(value.shape, value.dtype)
        shape = tuple(attrs["shape"])
        _check_elements(prim, shape)
        return AVal(shape, attrs["dtype"])
    raise NotImplementedError(f"no shape rule for {prim}")


_SIZING = frozenset({Prim.BROADCAST, Prim.PAD})  # layout prims that can grow a tensor
_MAX_ELEMENTS = (1 << 63) - 1  # element counts and flat indices are int64 in every backend


def _check_elements(prim: Prim, shape: Shape) -> None:
    """A shape-creating op: dimensions non-negative, element count within int64."""
    count = math.prod(shape)
    if count <= _MAX_ELEMENTS and min(shape, default=0) >= 0:
        return  # the common case: two C calls (eager broadcasts run this per op)
    if min(shape) < 0:
        raise ShapeError(prim.value, f"shape {fmt(shape)} has a negative dimension")
    if count > _MAX_ELEMENTS:
        raise ShapeError(
            prim.value,
            f"shape {fmt(shape)} has {count} elements, more than int64 indexes "
            f"(at most {_MAX_ELEMENTS})",
        )


class ConstValue:
    """A constant's data, hashable by content so equal constants hash-cons to one node."""

    __slots__ = ("_hash", "array", "dtype", "shape")

    def __init__(self, array: Any, dtype: DType) -> None:
        import numpy as np

        check_fits(array, dtype.numpy, "constant")
        self.array = np.array(array, dtype=dtype.numpy, order="C", copy=True)
        self.array.setflags(write=False)
        self.dtype = dtype
        self.shape: Shape = tuple(self.array.shape)
        self._hash: int | None = None  # hashed on first use: eager constants never are

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self.shape, self.dtype.name, self.array.tobytes()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ConstValue)
            and hash(self) == hash(other)
            and self.dtype == other.dtype
            and self.shape == other.shape
            and self.array.tobytes() == other.array.tobytes()
        )

    def __repr__(self) -> str:
        if self.array.size == 1:
            return repr(self.array.reshape(()).item())
        return f"<{self.dtype.name}{fmt(self.shape)} constant>"
