"""The one set of vector-Jacobian product rules, written in terms of primitives.

Each rule receives ``(inputs, output, cotangent, attrs, needs)`` and returns
one cotangent (or None) per input. Rules of ops that take scalar operands
(``attrs["scalars"]``, see ``protocol.py``) are written over the full operand
list, scalars in place with ``needs`` False; ``_over_operands`` maps that to
the tensor inputs, so the eager scalar form and the graph's constant form
share one rule. Because rules only call primitives, the
eager tape runs them on NumPy and the graph autodiff records them as IR:
there is no second rule set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shapegrad.ops import prims as p
from shapegrad.ops.protocol import NON_DIFFERENTIABLE, Attrs, Prim, operands
from shapegrad.tensor import Tensor

Cotangents = Sequence[Tensor | None]
Rule = Callable[[Sequence[Tensor], Tensor, Tensor, Attrs, Sequence[bool]], Cotangents]

_RULES: dict[Prim, Rule] = {}


def rule(*prims_: Prim) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        wrapped = _over_operands(fn)
        for prim in prims_:
            _RULES[prim] = wrapped
        return fn

    return register


def _over_operands(fn: Rule) -> Rule:
    """Run ``fn`` on the full operand list (scalar operands in place, not needed) and
    keep the cotangents of the tensor inputs."""

    def on_inputs(
        xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
    ) -> Cotangents:
        scalars = attrs.get("scalars")
        if scalars is None:
            return fn(xs, y, g, attrs, needs)
        pending = iter(needs)
        full_needs = [next(pending) if s is None else False for s in scalars]
        cts = fn(operands(xs, attrs), y, g, attrs, full_needs)
        return [ct for ct, s in zip(cts, scalars, strict=True) if s is None]

    return on_inputs


def vjp_rule(prim: Prim) -> Rule:
    """The VJP rule of ``prim`` (non-differentiable primitives give no cotangents)."""
    if prim in NON_DIFFERENTIABLE:
        return lambda inputs, out, ct, attrs, needs: [None] * len(inputs)
    try:
        return _RULES[prim]
    except KeyError:
        raise NotImplementedError(f"no VJP rule for primitive {prim.value}") from None


def _sign(x: Tensor) -> Tensor:
    return (p.where(x > 0, 1.0, 0.0) - p.where(x < 0, 1.0, 0.0)).astype(x.dtype)


# --- elementwise unary -------------------------------------------------------------


@rule(Prim.NEG)
def _neg(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [-g]


@rule(Prim.EXP)
def _exp(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g * y]


@rule(Prim.LOG)
def _log(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g / xs[0]]


@rule(Prim.SIN)
def _sin(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g * p.unary(Prim.COS, xs[0])]


@rule(Prim.COS)
def _cos(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [-(g * p.unary(Prim.SIN, xs[0]))]


@rule(Prim.SQRT)
def _sqrt(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g / (y * 2.0)]


@rule(Prim.TANH)
def _tanh(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g * (1.0 - y * y)]


@rule(Prim.ERF)
def _erf(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    return [g * (p.unary(Prim.EXP, -(x * x)) * (2.0 / math.sqrt(math.pi)))]


@rule(Prim.ABS)
def _abs(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g * _sign(xs[0])]


# --- elementwise binary ------------------------------------------------------------


@rule(Prim.ADD)
def _add(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g, g]


@rule(Prim.SUB)
def _sub(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [g, -g if needs[1] else None]


@rule(Prim.MUL)
def _mul(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    a, b = xs
    return [g * b if needs[0] else None, g * a if needs[1] else None]


@rule(Prim.DIV)
def _div(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    a, b = xs
    return [g / b if needs[0] else None, -(g * y) / b if needs[1] else None]


@rule(Prim.POW)
def _pow(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    a, b = xs
    ga = g * b * p.binary(Prim.POW, a, b - 1.0) if needs[0] else None
    if not needs[1]:
        gb = None
    elif not isinstance(a, Tensor):  # a scalar base: its log is a scalar too
        base: Any = a
        gb = g * y * np.log(base) if base > 0 else p.zeros_like(g)
    else:
        safe_a = p.where(a > 0, a, 1.0)
        gb = p.where(a > 0, g * y * p.unary(Prim.LOG, safe_a), 0.0)
    return [ga, gb]


def _select_grads(
    a_wins: Tensor, a: Tensor, b: Tensor, g: Tensor, needs: Sequence[bool]
) -> Cotangents:
    # Ties split the gradient evenly, which is what central differences see. A product
    # with a 0/0.5/1 mask, not a select of g: compiled, the mask fuses into the kernel
    # that produces g (ReLU's backward rides on the col2im sum of a convolution); a select
    # reads g in two branches and was materialized as its own pass (CNN step 1.15x slower).
    share = p.where(a_wins, 1.0, p.where(a == b, 0.5, 0.0)).astype(g.dtype)
    return [g * share if needs[0] else None, g * (1.0 - share) if needs[1] else None]


@rule(Prim.MAX)
def _maximum(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return _select_grads(xs[0] > xs[1], xs[0], xs[1], g, needs)


@rule(Prim.MIN)
def _minimum(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return _select_grads(xs[0] < xs[1], xs[0], xs[1], g, needs)


@rule(Prim.WHERE)
def _where(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    cond = xs[0]
    return [
        None,
        p.where(cond, g, 0) if needs[1] else None,
        p.where(cond, 0, g) if needs[2] else None,
    ]


# --- reductions and contraction ------------------------------------------------------


def _kept_dims(rank: int, axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(i for i in range(rank) if i not in axes)


@rule(Prim.REDUCE_SUM)
def _reduce_sum(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    return [p.broadcast_in_dim(g, x.shape, _kept_dims(x.ndim, attrs["axes"]))]


@rule(Prim.REDUCE_MAX)
def _reduce_max(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    axes = attrs["axes"]
    kept = _kept_dims(x.ndim, axes)
    mask = (x == p.broadcast_in_dim(y, x.shape, kept)).astype(g.dtype)
    count = p.reduce_sum(mask, axes)  # ties share the gradient evenly
    return [mask * p.broadcast_in_dim(g / count, x.shape, kept)]


@rule(Prim.EINSUM)
def _einsum(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    lhs, out = attrs["spec"].split("->")
    terms = lhs.split(",")
    result: list[Tensor | None] = []
    for k, (term, x) in enumerate(zip(terms, xs, strict=True)):
        if not needs[k]:
            result.append(None)
            continue
        others = [(t, o) for j, (t, o) in enumerate(zip(terms, xs, strict=True)) if j != k]
        available = set(out).union(*(set(t) for t, _ in others))
        target = "".join(letter for letter in term if letter in available)
        spec = ",".join([out, *(t for t, _ in others)]) + "->" + target
        partial = p.einsum(spec, g, *(o for _, o in others))
        dims = tuple(term.index(letter) for letter in target)
        result.append(p.broadcast_in_dim(partial, x.shape, dims))
    return result


# --- layout -------------------------------------------------------------------


@rule(Prim.RESHAPE)
def _reshape(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [p.reshape(g, xs[0].shape)]


@rule(Prim.PERMUTE)
def _permute(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    perm = attrs["perm"]
    inverse = [0] * len(perm)
    for i, axis in enumerate(perm):
        inverse[axis] = i
    return [p.permute(g, inverse)]


@rule(Prim.BROADCAST)
def _broadcast(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    dims = attrs["dims"]
    summed = [d for d in range(len(y.shape)) if d not in dims]
    summed += [d for i, d in enumerate(dims) if x.shape[i] == 1 and y.shape[d] != 1]
    return [p.reshape(p.reduce_sum(g, summed), x.shape)]


@rule(Prim.SLICE)
def _slice(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    for axis, (lo, step) in enumerate(zip(attrs["starts"], attrs["steps"], strict=True)):
        n, m = x.shape[axis], g.shape[axis]
        if step > 1 and m > 0:
            # Interleave zeros: [m] -> [m, 1] -> pad to [m, step] -> [m * step].
            shape = list(g.shape)
            g = p.reshape(g, shape[: axis + 1] + [1] + shape[axis + 1 :])
            high = [0] * g.ndim
            high[axis + 1] = step - 1
            g = p.pad(g, [0] * g.ndim, high)
            g = p.reshape(g, shape[:axis] + [m * step] + shape[axis + 1 :])
        extent = g.shape[axis]
        low = [0] * g.ndim
        high = [0] * g.ndim
        low[axis] = lo
        if lo + extent > n:  # trailing zeros of the interleave run past the end
            g = p.slice_(
                g,
                [0] * g.ndim,
                [n - lo if a == axis else s for a, s in enumerate(g.shape)],
                [1] * g.ndim,
            )
            extent = n - lo
        high[axis] = n - lo - extent
        g = p.pad(g, low, high)
    return [g]


@rule(Prim.PAD)
def _pad(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    starts = list(attrs["low"])
    stops = [lo + n for lo, n in zip(starts, x.shape, strict=True)]
    return [p.slice_(g, starts, stops, [1] * x.ndim)]


@rule(Prim.CONCAT)
def _concat(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    axis = attrs["axis"]
    result: list[Tensor | None] = []
    offset = 0
    for x, need in zip(xs, needs, strict=True):
        size = x.shape[axis]
        if need:
            starts = [offset if a == axis else 0 for a in range(g.ndim)]
            stops = [offset + size if a == axis else s for a, s in enumerate(g.shape)]
            result.append(p.slice_(g, starts, stops, [1] * g.ndim))
        else:
            result.append(None)
        offset += size
    return result


# --- types and indexing ---------------------------------------------------------------


@rule(Prim.CAST)
def _cast(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x = xs[0]
    return [p.cast(g, x.dtype) if x.dtype.is_float else None]


@rule(Prim.GATHER)
def _gather(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    x, idx = xs
    axis = attrs["axis"]
    return [p.scatter_add(g, idx, axis, x.shape[axis]), None]


@rule(Prim.SCATTER_ADD)
def _scatter_add(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    _, idx = xs
    return [p.gather(g, idx, attrs["axis"]), None]


# --- collectives ------------------------------------------------------------------------
# The loss of a data-parallel program is the sum of every process's loss, so each rule
# sums cotangents over the processes of the communicator.


@rule(Prim.ALL_REDUCE)
def _all_reduce(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    comm, op, root = attrs["comm"], attrs["op"], attrs.get("root")
    if root is not None:  # y is the sum on the root only: every x feeds the root's cotangent
        return [p.broadcast_from(g, comm, root)]
    if op == "sum":
        return [p.all_reduce(g, comm, "sum")]
    if op == "mean":
        return [p.all_reduce(g, comm, "mean")]
    # max: the processes holding the maximum share the summed cotangent evenly
    x = xs[0]
    mask = (x == y).astype(g.dtype)
    count = p.all_reduce(mask, comm, "sum")
    return [p.all_reduce(g, comm, "sum") * mask / count]


@rule(Prim.ALL_GATHER)
def _all_gather(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [p.reduce_scatter(g, attrs["comm"])]


@rule(Prim.REDUCE_SCATTER)
def _reduce_scatter(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [p.all_gather(g, attrs["comm"])]


@rule(Prim.BROADCAST_FROM)
def _broadcast_from(
    xs: Sequence[Tensor], y: Tensor, g: Tensor, attrs: Attrs, needs: Sequence[bool]
) -> Cotangents:
    return [p.all_reduce(g, attrs["comm"], "sum", root=attrs["root"])]
