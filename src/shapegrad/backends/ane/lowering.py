"""Lowering an optimized :class:`~shapegrad.ir.Graph` to a Core ML ML Program (MIL).

One small rule per primitive, read top to bottom in :data:`_RULES`. The
program computes in fp16 by default (the Neural Engine's native type) and
talks to the host in fp32/int32: float inputs are cast to the compute type
right after the function boundary and float outputs back to fp32 right
before it. Core ML has no rank-0 inputs/outputs and no bool outputs, so
scalars travel as shape ``[1]`` and bools as int32; :class:`MilProgram`
records this so the executable can undo it on the host.

Broadcasts are *lazy*: a ``BROADCAST`` node becomes a reshape that inserts
size-1 axes, and elementwise consumers rely on MIL's NumPy-style implicit
broadcasting. Only a consumer that needs the full shape (a reduction, a
matmul, an output...) gets a ``tile``. This keeps the bias/scalar broadcasts
of a training step from materialising on the engine.

Every primitive is classified for the report: ``native`` (one MIL op),
``decomposed`` (several MIL ops) or ``folded`` (a compile-time constant):

* native: unary exp/log/sin/cos/sqrt/tanh/abs; add/sub/mul/real_div/pow/
  maximum/minimum; less/less_equal/equal/not_equal; where -> select;
  reduce_sum/reduce_max; reshape; permute -> transpose; slice ->
  slice_by_index; pad; concat; cast; gather; constant -> const; einsum when
  it is one (batched) matmul, using transpose_x/transpose_y.
* decomposed: broadcast (reshape + implicit broadcasting, tile on demand);
  neg (mul by -1); other einsums (reduce_sum/transpose/reshape around one
  matmul); scatter_add (one-hot matmul); int32 div (fp32 real_div + cast);
  bool arithmetic, comparisons, reductions and gathers (through int32);
  int/bool pad (through fp32).
* folded: iota (const line), random_uniform (static seed), stop_gradient,
  float->float casts within one compute type.
* unsupported (AneLoweringError): zero-size tensors, bool scatter_add, int64 and
  uint8 tensors (no Core ML type for them).

Example:
    >>> mil = lower_to_mil(graph)          # doctest: +SKIP
    >>> print(mil.text())                  # the MIL program, one op a line
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DType, bool_
from shapegrad.ir import Graph, Node
from shapegrad.ops import reference
from shapegrad.ops.protocol import BINARY, COLLECTIVES, UNARY, Prim
from shapegrad.shapes import fmt

from ._decompose import lower_einsum, lower_scatter_add
from ._errors import AneLoweringError
from ._mil import FP16_MAX, Var, builder, function_class, program_class, target, types_module
from ._sort import lower_argsort

Array = npt.NDArray[Any]

# MIL ops implementing one primitive each (elementwise families).
_UNARY_OPS = {
    Prim.EXP: "exp",
    Prim.LOG: "log",
    Prim.SIN: "sin",
    Prim.COS: "cos",
    Prim.SQRT: "sqrt",
    Prim.TANH: "tanh",
    Prim.ERF: "erf",  # MIL elementwise_unary erf
    Prim.ABS: "abs",
}
_BINARY_OPS = {
    Prim.ADD: "add",
    Prim.SUB: "sub",
    Prim.MUL: "mul",
    Prim.DIV: "real_div",
    Prim.POW: "pow",
    Prim.MAX: "maximum",
    Prim.MIN: "minimum",
    Prim.LT: "less",
    Prim.LE: "less_equal",
    Prim.EQ: "equal",
    Prim.NE: "not_equal",
}
# Consumers that accept a lazily broadcast operand (MIL broadcasts them implicitly).
_BROADCASTING_CONSUMERS = (
    UNARY
    | BINARY
    | {
        Prim.WHERE,
        Prim.CAST,
        Prim.STOP_GRADIENT,
        Prim.BROADCAST,
    }
)
PRECISIONS = ("fp16", "fp32")


@dataclass
class MilProgram:
    """A lowered graph: the MIL program plus what the host needs to call it.

    Attributes:
        program: the coremltools ``Program`` (function ``"main"``). ``ct.convert``
            rewrites it in place, so evaluate it before converting.
        graph: the shapegrad graph it implements.
        input_names / output_names: MIL names, in ``graph.inputs`` / ``graph.outputs`` order.
        precision: ``"fp16"`` or ``"fp32"`` (the compute type of float values).
        lowering: primitive name -> ``"native"``, ``"decomposed"`` or ``"folded"``.
    """

    program: Any
    graph: Graph
    input_names: list[str]
    output_names: list[str]
    precision: str
    lowering: dict[str, str] = field(default_factory=dict)

    def operations(self) -> list[Any]:
        """The main function's MIL operations, in program order."""
        return list(self.program.functions["main"].operations)

    def op_histogram(self) -> Counter[str]:
        """MIL op type -> count (consts included)."""
        return Counter(op.op_type for op in self.operations())

    def op_count(self, include_const: bool = False) -> int:
        """Number of MIL operations (by default not counting ``const``)."""
        return sum(1 for op in self.operations() if include_const or op.op_type != "const")

    def text(self) -> str:
        """The MIL program in coremltools' text form (what ``SHAPEGRAD_DEBUG`` dumps)."""
        return str(self.program)


def host_input_dtype(dtype: DType) -> np.dtype[Any]:
    """The NumPy dtype the host feeds for a graph input of ``dtype`` (Core ML I/O types)."""
    if dtype.is_float:
        return np.dtype(np.float32)
    return np.dtype(np.int32)  # int32 as is; bool travels as 0/1 int32


def mil_name(raw: str, taken: set[str]) -> str:
    """A valid, unique MIL identifier for a user-facing input name like ``params[0]``."""
    name = re.sub(r"\W+", "_", raw).strip("_") or "in"
    if not name[0].isalpha():
        name = "in_" + name
    base, k = name, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def to_fp16(array: Array) -> Array:
    """``array`` as fp16, clipping finite values to the fp16 range (large masks stay finite)."""
    values = np.asarray(array, dtype=np.float64)
    finite = np.isfinite(values)
    clipped = np.where(finite, np.clip(values, -FP16_MAX, FP16_MAX), values)
    return clipped.astype(np.float16)


class _Lowerer:
    """State of one lowering: the MIL value of every node (possibly lazily broadcast)."""

    def __init__(self, precision: str, fp32_nodes: frozenset[int] = frozenset()) -> None:
        self.mb = builder()
        self.precision = precision
        self.fp32_nodes = fp32_nodes
        self.current = precision  # compute type of the node being lowered
        # (var name, type) -> that value in that float type (casts made once; fp32 inputs kept)
        self.converted: dict[tuple[str, str], Var] = {}
        self.values: dict[int, Var] = {}
        self.materialised: dict[int, Var] = {}
        self.kinds: dict[str, str] = {}

    # --- types and constants -----------------------------------------------------------

    def mil_dtype(self, dtype: DType) -> str:
        if dtype.is_float:
            return self.current
        return "bool" if dtype == bool_ else "int32"

    def np_dtype(self, dtype: DType) -> np.dtype[Any]:
        names = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_}
        return np.dtype(names[self.mil_dtype(dtype)])

    def const(self, value: Any, dtype: DType) -> Var:
        """A MIL const holding ``value`` in the compute type of ``dtype``."""
        array = np.asarray(value)
        if dtype.is_float and self.current == "fp16":
            array = to_fp16(array)
        return self.mb.const(val=np.array(array, dtype=self.np_dtype(dtype)))

    def scalar(self, value: float, dtype: DType) -> Var:
        return self.const(np.array(value), dtype)

    # --- values ----------------------------------------------------------------------

    def lazy(self, node: Node) -> Var:
        """The MIL value of ``node``; its shape may have size-1 axes where ``node`` has more."""
        return self.values[node.id]

    def full(self, node: Node) -> Var:
        """The MIL value of ``node`` with exactly ``node.shape`` (tiles a lazy broadcast once)."""
        var = self.values[node.id]
        if tuple(var.shape) == node.shape:
            return var
        if node.id not in self.materialised:
            reps = np.array(
                [n if s == 1 else 1 for s, n in zip(var.shape, node.shape, strict=True)], np.int32
            )
            if var.op is not None and var.op.op_type == "const":
                tiled = np.broadcast_to(var.val, node.shape)
                self.materialised[node.id] = self.mb.const(val=np.array(tiled))
            else:
                self.materialised[node.id] = self.mb.tile(x=var, reps=reps)
        return self.materialised[node.id]

    def operand(self, consumer: Node, node: Node) -> Var:
        return self.lazy(node) if consumer.prim in _BROADCASTING_CONSUMERS else self.full(node)

    def mark(self, prim: Prim, kind: str) -> None:
        # "decomposed" wins over "native": report the worst case seen for a primitive.
        order = {"native": 0, "folded": 1, "decomposed": 2}
        if order[kind] >= order[self.kinds.get(prim.value, "native")]:
            self.kinds[prim.value] = kind

    # --- the driver ------------------------------------------------------------------

    def lower(self, node: Node) -> None:
        rule = _RULES.get(node.prim)
        if node.prim in COLLECTIVES:
            raise AneLoweringError(
                node.prim.value, "collectives run on the C or numpy backend, not in Core ML"
            )
        if rule is None:
            raise AneLoweringError(node.prim.value, "no MIL rule for this primitive")
        if any(d == 0 for d in node.shape):
            raise AneLoweringError(
                node.prim.value, f"zero-size tensor {fmt(node.shape)} (Core ML has none)"
            )

        self.current = "fp32" if node.id in self.fp32_nodes else self.precision
        args = [self.in_compute_type(i, self.operand(node, i)) for i in node.inputs]
        self.values[node.id] = rule(self, node, args)

    def in_compute_type(self, node: Node, var: Var) -> Var:
        """``var`` (the value of ``node``) cast to the current float type where it differs."""
        if not node.aval.dtype.is_float or var.dtype == getattr(types_module(), self.current):
            return var
        key = (var.name, self.current)
        if key not in self.converted:
            self.converted[key] = self.mb.cast(x=var, dtype=self.current)
        return self.converted[key]

    def via_int32(self, node: Node, args: list[Var], op: str) -> Var:
        """Run MIL ``op`` on bool operands by casting them to int32 (MIL has no bool arithmetic)."""
        mb = self.mb
        cast = [mb.cast(x=a, dtype="int32") if a.dtype == types_module().bool else a for a in args]
        result = getattr(mb, op)(x=cast[0], y=cast[1])
        self.mark(node.prim, "decomposed")
        if node.aval.dtype == bool_ and result.dtype != types_module().bool:
            result = mb.cast(x=result, dtype="bool")
        return result


Rule = Callable[[_Lowerer, Node, list[Var]], Var]


# --- elementwise ---------------------------------------------------------------------


def _unary(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    (x,) = args
    if node.prim is Prim.NEG:
        lo.mark(node.prim, "decomposed")
        return lo.mb.mul(x=x, y=lo.scalar(-1, node.aval.dtype))
    lo.mark(node.prim, "native")
    op = _UNARY_OPS[node.prim]
    if node.prim is Prim.LOG:
        # MIL's log is log(x + epsilon); epsilon 0 keeps log(0) = -inf as in NumPy.
        return lo.mb.log(x=x, epsilon=lo.scalar(0.0, node.aval.dtype))
    return getattr(lo.mb, op)(x=x)


def _binary(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    operand_dtype = node.inputs[0].aval.dtype
    if operand_dtype == bool_:
        return lo.via_int32(node, args, _BINARY_OPS[node.prim])
    if node.prim is Prim.DIV and not operand_dtype.is_float:
        return _int_divide(lo, node, args)
    lo.mark(node.prim, "native")
    return getattr(lo.mb, _BINARY_OPS[node.prim])(x=args[0], y=args[1])


def _int_divide(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """C-style integer division (truncate toward zero, x/0 -> x) through fp32."""
    mb = lo.mb
    a, b = args
    zero = mb.equal(x=b, y=np.int32(0))
    safe = mb.select(cond=zero, a=np.int32(1), b=b)
    quotient = mb.real_div(x=mb.cast(x=a, dtype="fp32"), y=mb.cast(x=safe, dtype="fp32"))
    lo.mark(node.prim, "decomposed")
    return mb.cast(x=quotient, dtype="int32")  # fp32 -> int32 truncates toward zero


def _where(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    cond, a, b = args
    # MIL's select takes its result shape from a and b only: a condition broader than
    # both would be cut, so then a is materialised to the full shape.
    if np.broadcast_shapes(a.shape, b.shape) != np.broadcast_shapes(cond.shape, a.shape, b.shape):
        a = lo.full(node.inputs[1])
    lo.mark(node.prim, "native")
    return lo.mb.select(cond=cond, a=a, b=b)


def _cast(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    target_dtype = lo.mil_dtype(node.aval.dtype)
    if lo.mil_dtype(node.inputs[0].aval.dtype) == target_dtype:
        lo.mark(node.prim, "folded")  # float -> float inside one compute type
        return args[0]
    lo.mark(node.prim, "native")
    return lo.mb.cast(x=args[0], dtype=target_dtype)


def _identity(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "folded")
    return args[0]


# --- reductions ----------------------------------------------------------------------


def _reduce(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    op = "reduce_sum" if node.prim is Prim.REDUCE_SUM else "reduce_max"
    axes = np.array(node.attr["axes"], np.int32)
    x = args[0]
    if node.aval.dtype == bool_:
        lo.mark(node.prim, "decomposed")
        total = getattr(lo.mb, op)(x=lo.mb.cast(x=x, dtype="int32"), axes=axes, keep_dims=False)
        return lo.mb.cast(x=total, dtype="bool")
    lo.mark(node.prim, "native")
    return getattr(lo.mb, op)(x=x, axes=axes, keep_dims=False)


# --- layout --------------------------------------------------------------------------


def _reshape(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "native")
    return lo.mb.reshape(x=args[0], shape=np.array(node.shape, dtype=np.int32))


def _permute(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "native")
    return lo.mb.transpose(x=args[0], perm=np.array(node.attr["perm"], np.int32))


def _broadcast(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """A reshape to the output rank with size-1 axes; ``full`` tiles it only when needed."""
    x = args[0]
    expanded = [1] * len(node.shape)
    for i, d in enumerate(node.attr["dims"]):
        expanded[d] = x.shape[i]
    lo.mark(node.prim, "decomposed")
    if list(x.shape) == expanded:
        return x
    if x.op is not None and x.op.op_type == "const":
        return lo.mb.const(val=np.array(x.val).reshape(expanded))
    return lo.mb.reshape(x=x, shape=np.array(expanded, dtype=np.int32))


def _slice(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "native")
    attrs = node.attr
    return lo.mb.slice_by_index(
        x=args[0],
        begin=np.array(attrs["starts"], np.int32),
        end=np.array(attrs["stops"], np.int32),
        stride=np.array(attrs["steps"], np.int32),
    )


def _pad(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    widths = [w for pair in zip(node.attr["low"], node.attr["high"], strict=True) for w in pair]
    dtype = node.aval.dtype
    x = args[0]
    if dtype.is_float:
        lo.mark(node.prim, "native")
        value = lo.scalar(node.attr["value"], dtype)
        return lo.mb.pad(x=x, pad=np.array(widths, np.int32), mode="constant", constant_val=value)
    # MIL pads floats only: go through fp32 (exact for |ints| < 2**24).
    lo.mark(node.prim, "decomposed")
    value = np.float32(node.attr["value"])
    padded = lo.mb.pad(
        x=lo.mb.cast(x=x, dtype="fp32"), pad=np.array(widths, np.int32), constant_val=value
    )
    return lo.mb.cast(x=padded, dtype=lo.mil_dtype(dtype))


def _concat(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "native")
    return lo.mb.concat(values=args, axis=np.int32(node.attr["axis"]), interleave=False)


# --- indexing ------------------------------------------------------------------------


def _gather(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    x, idx = args
    axis = np.int32(node.attr["axis"])
    if node.aval.dtype == bool_:
        lo.mark(node.prim, "decomposed")
        picked = lo.mb.gather(x=lo.mb.cast(x=x, dtype="int32"), indices=idx, axis=axis)
        return lo.mb.cast(x=picked, dtype="bool")
    lo.mark(node.prim, "native")
    return lo.mb.gather(x=x, indices=idx, axis=axis)


# --- sources -------------------------------------------------------------------------


def _constant(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    lo.mark(node.prim, "native")
    return lo.const(node.attr["value"].array, node.aval.dtype)


def _iota(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    """A const ``arange`` line shaped size-1 off ``axis``: tiled lazily like a broadcast.

    (A ``range_1d`` op would be constant-folded by coremltools into the same const.)
    """
    shape, axis = node.shape, node.attr["axis"]
    expanded = [shape[axis] if i == axis else 1 for i in range(len(shape))]
    lo.mark(node.prim, "folded")
    line = np.arange(shape[axis]).reshape(expanded)
    return lo.mb.const(val=line.astype(lo.np_dtype(node.aval.dtype)))


def _random(lo: _Lowerer, node: Node, args: list[Var]) -> Var:
    # The seed is a static attribute, so the counter-based numbers are a constant.
    attrs = node.attr
    lo.mark(node.prim, "folded")
    return lo.const(
        reference.random_uniform(attrs["shape"], attrs["seed"], node.aval.dtype), node.aval.dtype
    )


def _contraction_rules() -> dict[Prim, Rule]:
    return {Prim.EINSUM: lower_einsum, Prim.SCATTER_ADD: lower_scatter_add}


_RULES: dict[Prim, Rule] = {
    **dict.fromkeys(UNARY, _unary),
    **dict.fromkeys(BINARY, _binary),
    Prim.WHERE: _where,
    Prim.CAST: _cast,
    Prim.STOP_GRADIENT: _identity,
    Prim.REDUCE_SUM: _reduce,
    Prim.REDUCE_MAX: _reduce,
    Prim.RESHAPE: _reshape,
    Prim.PERMUTE: _permute,
    Prim.BROADCAST: _broadcast,
    Prim.SLICE: _slice,
    Prim.PAD: _pad,
    Prim.CONCAT: _concat,
    Prim.GATHER: _gather,
    Prim.ARGSORT: lower_argsort,
    Prim.CONSTANT: _constant,
    Prim.IOTA: _iota,
    Prim.RANDOM: _random,
    **_contraction_rules(),
}


# --- the function boundary -----------------------------------------------------------


# Element types Core ML's I/O and compute types (fp16, fp32, int32, bool) cannot hold.
_NO_ANE_DTYPES = {
    "int64": "cast to int32 first (x.int()) where the values fit",
    "uint8": "cast to float32 (x.float()) or int32 (x.int()) first",
}


def _refuse_dtypes(graph: Graph) -> None:
    """An int64 or uint8 tensor anywhere in the graph: a clear error before any MIL."""
    for node in [*graph.inputs, *graph.nodes()]:
        fix = _NO_ANE_DTYPES.get(node.aval.dtype.name)
        if fix is not None:
            what = f"input {node.attr.get('name', '')!r}" if node.prim is Prim.INPUT else ""
            raise AneLoweringError(
                what or node.prim.value,
                f"{node.aval} has dtype {node.aval.dtype}, which Core ML does not compute in "
                f"(fp16, fp32, int32, bool); {fix}",
            )


def _placeholders(graph: Graph) -> tuple[dict[str, Any], list[str]]:
    """MIL placeholders for the graph inputs (rank 0 as ``[1]``, bool as int32)."""
    mb, types = builder(), types_module()
    taken: set[str] = set()
    specs: dict[str, Any] = {}
    names: list[str] = []
    for k, node in enumerate(graph.inputs):
        name = mil_name(str(node.attr.get("name", f"in{k}")), taken)
        dtype = types.fp32 if node.aval.dtype.is_float else types.int32
        specs[name] = mb.placeholder(shape=node.shape or (1,), dtype=dtype, name=name)
        names.append(name)
    return specs, names


def _enter_input(lo: _Lowerer, node: Node, var: Var) -> Var:
    mb = lo.mb
    if not node.shape:
        var = mb.reshape(x=var, shape=np.zeros((0,), np.int32))
    target_dtype = lo.mil_dtype(node.aval.dtype)
    if target_dtype in ("fp32", "int32"):
        return var
    low = mb.cast(x=var, dtype=target_dtype)
    lo.converted[(low.name, "fp32")] = var  # fp32 consumers read the exact input
    return low


def _leave_output(lo: _Lowerer, node: Node, k: int) -> Var:
    """The value of output ``k`` as an fp32/int32 tensor of rank >= 1 with a fresh name."""
    mb, types = lo.mb, types_module()
    var = lo.full(node)
    # An fp32 input returned as is (or an fp32 island value) leaves without an fp16 round trip.
    exact = (var.name, "fp32")
    if node.aval.dtype.is_float and exact in lo.converted:
        var = lo.converted[exact]
    name = f"output_{k}"
    host = "fp32" if node.aval.dtype.is_float else "int32"
    needs_reshape = not node.shape
    if var.dtype != getattr(types, host):
        named = {} if needs_reshape else {"name": name}
        var = mb.cast(x=var, dtype=host, **named)
    elif not needs_reshape:
        var = mb.identity(x=var, name=name)
    if needs_reshape:
        var = mb.reshape(x=var, shape=np.array([1], np.int32), name=name)
    return var


def lower_to_mil(
    graph: Graph, precision: str = "fp16", fp32_nodes: frozenset[int] = frozenset()
) -> MilProgram:
    """Translate ``graph`` into a MIL program (one function ``main``).

    Args:
        graph: an optimized shapegrad graph.
        precision: ``"fp16"`` (default; the Neural Engine's type) or ``"fp32"`` compute.
        fp32_nodes: ids of nodes computed in fp32 whatever ``precision`` says (an
            optimizer update on master weights); Core ML runs those on the CPU.
    Returns:
        the :class:`MilProgram`.
    Raises:
        AneLoweringError: a construct Core ML cannot express (message names the op).
    Example:
        >>> mil = lower_to_mil(graph)       # doctest: +SKIP
        >>> mil.op_count()
        12
    """
    if precision not in PRECISIONS:
        raise ValueError(f"ane precision must be one of {PRECISIONS}, got {precision!r}")
    _refuse_dtypes(graph)
    specs, names = _placeholders(graph)
    lo = _Lowerer(precision, fp32_nodes)
    inputs = {node.id for node in graph.inputs}
    with function_class()(specs, opset_version=target().iOS16) as func:
        for node, name in zip(graph.inputs, names, strict=True):
            if any(d == 0 for d in node.shape):
                raise AneLoweringError(
                    f"input {name!r}", f"zero-size tensor {fmt(node.shape)} (Core ML has none)"
                )
            lo.values[node.id] = _enter_input(lo, node, func.inputs[name])
        for node in graph.nodes():
            if node.id not in inputs:
                if node.prim is Prim.INPUT:
                    raise AneLoweringError("input", f"{node} is not one of the graph's inputs")
                lo.lower(node)
        outputs = [_leave_output(lo, node, k) for k, node in enumerate(graph.outputs)]
        func.set_outputs(outputs)
    program = program_class()()
    program.add_function("main", func)
    return MilProgram(
        program=program,
        graph=graph,
        input_names=names,
        output_names=[o.name for o in outputs],
        precision=precision,
        lowering=dict(sorted(lo.kinds.items())),
    )
