"""Expanding a graph node into a scalar loop-IR expression at an index (inlining).

:class:`ExprBuilder` is where fusion becomes code: a materialized node is a
``Load`` from its buffer; anything else is recomputed from its operands at the
requested index. Layout primitives are pure index maps here: permute and
broadcast reorder/drop index components, slice scales and shifts them, pad and
concat select between operands (or the pad value) with range tests, reshape
goes through a flat offset (or maps axes directly when only size-1 axes
change).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shapegrad.compiler import loops as L
from shapegrad.compiler.fusion import FusionPlan
from shapegrad.dtypes import DType, bool_, int32
from shapegrad.ir import Node
from shapegrad.ops.protocol import BINARY, UNARY, Prim

Index = tuple[L.Affine, ...]


@dataclass(frozen=True)
class FlatIx:
    """An index given as a row-major flat offset (avoids div/mod through reshapes)."""

    flat: L.Affine


Ix = Index | FlatIx


_UNARY_OPS = {p: p.value for p in UNARY}
_BINARY_OPS = {
    Prim.ADD: "add",
    Prim.SUB: "sub",
    Prim.MUL: "mul",
    Prim.DIV: "div",
    Prim.POW: "pow",
    Prim.MAX: "max",
    Prim.MIN: "min",
    Prim.LT: "lt",
    Prim.LE: "le",
    Prim.EQ: "eq",
    Prim.NE: "ne",
}
assert set(_BINARY_OPS) == set(BINARY)


def multi_index(ix: Ix, shape: tuple[int, ...]) -> Index:
    return L.unflatten(ix.flat, shape) if isinstance(ix, FlatIx) else ix


def flat_index(ix: Ix, shape: tuple[int, ...]) -> L.Affine:
    return ix.flat if isinstance(ix, FlatIx) else L.flatten(ix, shape)


# ln of the smallest normal float per type: below it exp's result is denormal or zero.
_EXP_NORMAL_FLOOR = {"float32": -87.33, "float64": -708.39}


def exp_flushing_denormals(dtype: DType, x: L.Expr) -> L.Expr:
    """``exp(x)``, but 0 where the result would be denormal (``x`` below ln of the smallest
    normal, ``T``), and the math library never sees such an argument.

    Why: glibc's vector ``expf``/``exp`` (libmvec) runs a scalar fallback for a whole vector
    when one lane is out of its fast range; masked attention scores (-FLT_MAX) put such a
    lane in nearly every vector and made the softmax exp 6x slower. The form is
    ``exp(select(x < T, 0, x) + T*[x-T < 0]) * (1 - [x-T < 0])``, with no select around the call:
    gcc computes a vector call under a select with the discarded lanes left as they were
    (the raw ``x``), and it moves ``exp`` through a select of its argument; the two
    differently written tests keep it from proving the argument equal to ``x``.
    Exact for ``x >= T`` (``x + (-0.0) == x``); below it the result differs by less than the
    smallest normal (1.2e-38 in float32); ``-inf`` gives 0, NaN stays NaN, ``+inf`` gives inf.
    """
    floor = L.Const(dtype, _EXP_NORMAL_FLOOR[dtype.name])
    zero = L.Const(dtype, 0.0)
    shifted = L.Binary(dtype, "sub", x, floor)
    held = L.Select(dtype, L.Binary(bool_, "lt", x, floor), zero, x)
    below = L.Cast(dtype, L.Binary(bool_, "lt", shifted, zero))
    arg = L.Binary(dtype, "add", held, L.Binary(dtype, "mul", floor, below))
    # 1 - below, not [0 <= x-T]: a NaN argument is kept (exp(NaN) is NaN, never 0)
    kept = L.Binary(dtype, "sub", L.Const(dtype, 1.0), below)
    return L.Binary(dtype, "mul", L.Unary(dtype, "exp", arg), kept)


def _reshape_groups(
    old: tuple[int, ...], new: tuple[int, ...]
) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
    """Matching axis ranges ``((old_lo, old_hi), (new_lo, new_hi))`` of equal size that a
    row-major reshape maps onto each other, or None (empty shapes)."""
    if 0 in old or 0 in new:
        return None
    groups = []
    i = j = 0
    while i < len(old) or j < len(new):
        i0, j0 = i, j
        a = b = 1
        while True:
            if a <= b and i < len(old):
                a *= old[i]
                i += 1
            elif j < len(new):
                b *= new[j]
                j += 1
            else:
                break
            if a == b and (i == len(old) or old[i] != 1 or j == len(new) or new[j] != 1):
                break
        if a != b:
            return None
        groups.append(((i0, i), (j0, j)))
    return groups


class ExprBuilder:
    """Expands a node's value at an index: loads for materialized nodes, inline math otherwise.

    With ``flush_exp`` (a target's ``exp_underflow_to_zero``) ``exp`` is expanded by
    :func:`exp_flushing_denormals`.
    """

    def __init__(self, plan: FusionPlan, names: dict[int, str], flush_exp: bool = False) -> None:
        self.plan = plan
        self.names = names
        self.flush_exp = flush_exp
        self.subst: dict[int, Callable[[Ix], L.Expr]] = {}
        self.inlined: dict[int, Node] = {}

    def value(self, node: Node, ix: Ix) -> L.Expr:
        """The scalar expression of ``node`` at ``ix``."""
        if node.id in self.subst:
            return self.subst[node.id](ix)
        dtype = node.aval.dtype
        if not isinstance(ix, FlatIx) and 1 in node.shape:
            # Every valid access has index 0 along a size-1 axis (inside a concat/pad branch
            # the affine form may not show it); pinning it keeps div/mod out of the index.
            ix = tuple(L.const(0) if d == 1 else i for i, d in zip(ix, node.shape, strict=True))
        if node.id in self.names:
            return L.Load(dtype, self.names[node.id], flat_index(ix, node.shape))
        return self.expand(node, ix)

    def expand(self, node: Node, ix: Ix) -> L.Expr:
        """Compute ``node`` itself at ``ix`` (its operands via :meth:`value`)."""
        dtype = node.aval.dtype
        self.inlined[node.id] = node
        prim, ins = node.prim, node.inputs
        if prim in UNARY:
            x = self.value(ins[0], ix)
            if prim is Prim.EXP and self.flush_exp and dtype.name in _EXP_NORMAL_FLOOR:
                return exp_flushing_denormals(dtype, x)
            return L.Unary(dtype, _UNARY_OPS[prim], x)
        if prim in BINARY:
            a, b = self.value(ins[0], ix), self.value(ins[1], ix)
            return L.Binary(dtype, _BINARY_OPS[prim], a, b)
        if prim is Prim.WHERE:
            c, a, b = (self.value(i, ix) for i in ins)
            return L.Select(dtype, c, a, b)
        if prim is Prim.CAST:
            return L.Cast(dtype, self.value(ins[0], ix))
        if prim is Prim.STOP_GRADIENT:
            return self.value(ins[0], ix)
        if prim is Prim.CONSTANT:
            flat = node.attr["value"].array.reshape(-1)
            # An empty constant is never read (its loops run zero times): any value will do.
            return L.Const(dtype, flat[0].item() if flat.size else 0)
        if prim is Prim.RANDOM:
            return L.Random(dtype, flat_index(ix, node.shape), int(node.attr["seed"]))
        if prim is Prim.RESHAPE:
            squeezed = [d for d in node.shape if d != 1]
            if not isinstance(ix, FlatIx) and squeezed == [d for d in ins[0].shape if d != 1]:
                # Only size-1 axes come or go: map the index axis by axis (no flattening).
                kept = iter([i for i, d in zip(ix, node.shape, strict=True) if d != 1])
                inner = tuple(L.const(0) if d == 1 else next(kept) for d in ins[0].shape)
                return self.value(ins[0], inner)
            groups = None if ins[0].id in self.names else _reshape_groups(ins[0].shape, node.shape)
            if not isinstance(ix, FlatIx) and groups is not None:
                # A layout view below: split/merge axis groups one by one, so an index
                # component never leaks into another group's div/mod (a merged head axis
                # of attention stays exact in batch and time).
                inner_ix: list[L.Affine] = []
                for (o0, o1), (n0, n1) in groups:
                    flat = L.flatten(ix[n0:n1], node.shape[n0:n1])
                    inner_ix.extend(L.unflatten(flat, ins[0].shape[o0:o1]))
                return self.value(ins[0], tuple(inner_ix))
            return self.value(ins[0], FlatIx(flat_index(ix, node.shape)))
        return self._layout(node, multi_index(ix, node.shape))

    def _layout(self, node: Node, ix: Index) -> L.Expr:
        prim, attrs = node.prim, node.attr
        if prim is Prim.IOTA:
            return L.Cast(node.aval.dtype, L.IndexValue(int32, ix[attrs["axis"]]))
        x = node.inputs[0]
        if prim is Prim.PERMUTE:
            inner: list[L.Affine] = [L.Affine()] * len(ix)
            for out_axis, in_axis in enumerate(attrs["perm"]):
                inner[in_axis] = ix[out_axis]
            return self.value(x, tuple(inner))
        if prim is Prim.BROADCAST:
            dims = attrs["dims"]
            idx = tuple(
                ix[d] if x.shape[i] == node.shape[d] else L.const(0) for i, d in enumerate(dims)
            )
            return self.value(x, idx)
        if prim is Prim.SLICE:
            idx = tuple(
                i * st + lo for i, lo, st in zip(ix, attrs["starts"], attrs["steps"], strict=True)
            )
            return self.value(x, idx)
        if prim is Prim.PAD:
            return self._pad(node, ix)
        if prim is Prim.CONCAT:
            return self._concat(node, ix)
        raise NotImplementedError(f"loop lowering: cannot inline {prim.value}")

    def _pad(self, node: Node, ix: Index) -> L.Expr:
        x = node.inputs[0]
        inner = tuple(i + (-lo) for i, lo in zip(ix, node.attr["low"], strict=True))
        cond: L.Expr | None = None
        for i, size, lo, hi in zip(
            inner, x.shape, node.attr["low"], node.attr["high"], strict=True
        ):
            if lo == 0 and hi == 0:
                continue
            test = L.InRange(bool_, i, 0, size)
            cond = test if cond is None else L.Binary(bool_, "and", cond, test)
        value = self.value(x, inner)
        if cond is None:
            return value
        return L.Select(node.aval.dtype, cond, value, L.Const(node.aval.dtype, node.attr["value"]))

    def _concat(self, node: Node, ix: Index) -> L.Expr:
        axis = node.attr["axis"]
        offsets = np.cumsum([0] + [i.shape[axis] for i in node.inputs])
        result: L.Expr | None = None
        for operand, lo, hi in reversed(
            list(zip(node.inputs, offsets[:-1], offsets[1:], strict=True))
        ):
            shifted = tuple(i + (-int(lo)) if d == axis else i for d, i in enumerate(ix))
            value = self.value(operand, shifted)
            if result is None:
                result = value
            else:
                test = L.InRange(bool_, ix[axis], int(lo), int(hi))
                result = L.Select(node.aval.dtype, test, value, result)
        assert result is not None
        return result
