"""A small NumPy interpreter of the MIL ops the ANE lowering emits.

It executes a coremltools ``Program`` (before ``ct.convert`` rewrites it)
op by op, so the lowering's semantics - operand order, transpose flags,
axes, lazy broadcasts, the fp16 boundary casts - are checked on machines
without Core ML. Values are stored in the op's declared MIL type: an fp16
op rounds its result to fp16 after each op. Matmul and reductions on fp16
accumulate in fp32 before rounding (as the Neural Engine's multiply-
accumulate units do), other fp16 ops compute in fp32 and round.

It also runs the program *after* ``ct.convert``'s optimization passes (which
rewrite it in place), i.e. what a Mac would execute, for the few fused ops
those passes introduce (``reduce_mean``, ``linear``...).

Usage::

    outputs = run_mil(mil.program, {"x": x_fp32, ...})   # dict: output name -> array
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shapegrad.backends.ane._mil import types_module
from shapegrad.ops.reference import erf as reference_erf

Array = np.ndarray
OpFn = Callable[[dict[str, Any]], Array]


def _np_dtype(var: Any) -> np.dtype:
    return np.dtype(types_module().nptype_from_builtin(var.dtype))


def _wide(x: Array) -> Array:
    """fp16 values computed in fp32 (rounded back by the caller)."""
    return x.astype(np.float32) if x.dtype == np.float16 else x


def _binary(fn: Callable[[Array, Array], Array]) -> OpFn:
    return lambda a: fn(_wide(a["x"]), _wide(a["y"]))


def _unary(fn: Callable[[Array], Array]) -> OpFn:
    return lambda a: fn(_wide(a["x"]))


def _real_div(a: dict[str, Any]) -> Array:
    x, y = _wide(a["x"]), _wide(a["y"])
    if x.dtype.kind in "iu":
        return np.floor_divide(x, y)  # MIL real_div on ints: floor (not emitted by the lowering)
    return np.divide(x, y)


def _log(a: dict[str, Any]) -> Array:
    return np.log(_wide(a["x"]) + _wide(a["epsilon"]) if "epsilon" in a else _wide(a["x"]))


def _cast(a: dict[str, Any]) -> Array:
    x, dtype = a["x"], str(a["dtype"])
    if dtype == "bool":
        return x != 0
    target = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32}[dtype]
    if target is np.int32 and x.dtype.kind == "f":
        return np.trunc(x).astype(np.int32)  # toward zero
    return x.astype(target)


def _reduce(fn: Callable[..., Array]) -> OpFn:
    def run(a: dict[str, Any]) -> Array:
        axes = tuple(int(i) for i in a["axes"])
        return fn(_wide(a["x"]), axis=axes, keepdims=bool(a.get("keep_dims", False)))

    return run


def _matmul(a: dict[str, Any]) -> Array:
    x, y = _wide(a["x"]), _wide(a["y"])
    if a.get("transpose_x", False):
        x = np.swapaxes(x, -1, -2)
    if a.get("transpose_y", False):
        y = np.swapaxes(y, -1, -2)
    return np.matmul(x, y)


def _slice(a: dict[str, Any]) -> Array:
    x = a["x"]
    begin, end, stride = a["begin"], a["end"], a.get("stride", np.ones(x.ndim, np.int32))
    index = tuple(
        slice(int(lo), int(hi), int(st)) for lo, hi, st in zip(begin, end, stride, strict=True)
    )
    return x[index]


def _pad(a: dict[str, Any]) -> Array:
    x, widths = a["x"], [int(w) for w in a["pad"]]
    pairs = [(0, 0)] * (x.ndim - len(widths) // 2) + list(
        zip(widths[::2], widths[1::2], strict=True)
    )
    return np.pad(x, pairs, constant_values=a.get("constant_val", 0))


def _gather(a: dict[str, Any]) -> Array:
    x, idx, axis = a["x"], a["indices"], int(a.get("axis", 0))
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"MIL gather: index out of [{-n}, {n})")
    return np.take(x, idx, axis=axis)


def _gelu(a: dict[str, Any]) -> Array:
    """MIL ``gelu`` (coremltools' passes fuse x * 0.5 * (1 + erf(x / sqrt 2)) into it)."""
    x = np.asarray(a["x"])
    mode = str(a.get("mode", "EXACT"))
    if mode == "EXACT":
        return np.asarray(x * 0.5 * (1.0 + reference_erf(x / np.sqrt(2.0))), x.dtype)
    if mode == "TANH_APPROXIMATION":
        inner = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
        return np.asarray(0.5 * x * (1.0 + np.tanh(inner)), x.dtype)
    return np.asarray(x / (1.0 + np.exp(-1.702 * x)), x.dtype)  # SIGMOID_APPROXIMATION


def _range(a: dict[str, Any]) -> Array:
    return np.arange(a["start"], a["end"], a["step"])


_OPS: dict[str, OpFn] = {
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "real_div": _real_div,
    "pow": _binary(np.power),
    "maximum": _binary(np.maximum),
    "minimum": _binary(np.minimum),
    "less": _binary(np.less),
    "less_equal": _binary(np.less_equal),
    "equal": _binary(np.equal),
    "not_equal": _binary(np.not_equal),
    "exp": _unary(np.exp),
    "log": _log,
    "sin": _unary(np.sin),
    "cos": _unary(np.cos),
    "sqrt": _unary(np.sqrt),
    "tanh": _unary(np.tanh),
    "erf": _unary(reference_erf),
    "gelu": _gelu,
    "abs": _unary(np.abs),
    "relu": _unary(lambda x: np.maximum(x, 0)),
    "select": lambda a: np.where(a["cond"], a["a"], a["b"]),
    "cast": _cast,
    "identity": lambda a: a["x"],
    "reduce_sum": _reduce(np.sum),
    "reduce_max": _reduce(np.max),
    "reduce_mean": _reduce(np.mean),  # coremltools' passes fuse reduce_sum * (1/n) into it
    "linear": lambda a: (
        np.matmul(_wide(a["x"]), _wide(a["weight"]).T) + _wide(np.asarray(a.get("bias", 0.0)))
    ),
    "matmul": _matmul,
    "reshape": lambda a: np.reshape(a["x"], tuple(int(d) for d in a["shape"])),
    "transpose": lambda a: np.transpose(a["x"], tuple(int(p) for p in a["perm"])),
    "tile": lambda a: np.tile(a["x"], tuple(int(r) for r in a["reps"])),
    "slice_by_index": _slice,
    "pad": _pad,
    "concat": lambda a: np.concatenate(list(a["values"]), axis=int(a["axis"])),
    "gather": _gather,
    "range_1d": _range,
    "fill": lambda a: np.full(tuple(int(d) for d in a["shape"]), a["value"]),
}


def supported_ops() -> frozenset[str]:
    """The MIL op types this evaluator can execute."""
    return frozenset(_OPS) | {"const"}


def _operands(op: Any, env: dict[str, Array]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, var in op.inputs.items():
        if isinstance(var, list | tuple):
            values[name] = [env[v.name] for v in var]
        else:
            value = env[var.name]
            values[name] = (
                value.item() if isinstance(value, np.ndarray) and value.dtype.kind == "U" else value
            )
    return values


def run_mil(program: Any, feeds: Mapping[str, Array]) -> dict[str, Array]:
    """Execute ``program``'s ``main`` on ``feeds`` (input name -> array); returns output name -> array.

    Raises:
        NotImplementedError: the program uses a MIL op this evaluator lacks.
        ValueError: a result's shape disagrees with the type MIL inferred for it.
    """
    func = program.functions["main"]
    env: dict[str, Array] = {}
    for name, var in func.inputs.items():
        env[var.name] = np.asarray(feeds[name]).astype(_np_dtype(var))
    with np.errstate(all="ignore"):
        for op in func.operations:
            out = op.outputs[0]
            if op.op_type == "const":
                env[out.name] = np.asarray(op.val.val)
                continue
            if op.op_type not in _OPS:
                raise NotImplementedError(f"MIL evaluator: no rule for op {op.op_type!r}")
            result = np.asarray(_OPS[op.op_type](_operands(op, env)))
            expected = tuple(int(d) for d in out.shape)
            if result.shape != expected:
                raise ValueError(
                    f"{op.name} ({op.op_type}): got shape {result.shape}, MIL says {expected}"
                )
            env[out.name] = result.astype(_np_dtype(out))
    return {var.name: env[var.name] for var in func.outputs}
