"""SCAN's IR data: the traced :class:`Body`, the :class:`Layout` of its one flat output,
its shape rule and NumPy semantics (the primitive's meaning; ``control.py`` is the user
API, ``_scan.py`` the tracing and the reverse loop, ``compiler/layerloop.py`` the lowering).

A SCAN node's inputs are the initial carry leaves, the per-layer inputs ``xs`` (leading
dim = the loop length), then loop-invariant inputs; its output is ONE flat buffer
``[final carry (C) | carry into each layer (L*C, only with save) | ys (L*Y)]``.
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from shapegrad.dtypes import DType
from shapegrad.ir import Graph, Node
from shapegrad.ops import reference
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.shapes import ShapeError

Policy = Literal["recompute", "residuals"]
_body_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Body:
    """A function traced once into a sub-graph: immutable, compared and hashed by identity,
    keyed by content (``compiler/graphkey.py`` encodes its fields but ``number``).

    ``graph.inputs`` = carry leaves, per-layer slices, loop invariants (in that order);
    ``graph.outputs`` = new carry leaves, then per-layer outputs ``ys``. What is derived
    from a body (its reverse loop, residual forms, optimized graph) lives in side tables
    (:func:`derived` here, the compiler's own in ``compiler/layerloop.py``), never in it.
    """

    graph: Graph
    n_carry: int
    n_xs: int
    name: str
    # a process-wide serial number, for dumps only: not part of the body's content
    number: int = field(default_factory=lambda: next(_body_ids), metadata={"key": False})

    def __repr__(self) -> str:
        return f"<body {self.name}#{self.number}: {len(self.graph.nodes())} nodes>"

    @property
    def carry_avals(self) -> list[AVal]:
        return [n.aval for n in self.graph.outputs[: self.n_carry]]

    @property
    def y_avals(self) -> list[AVal]:
        return [n.aval for n in self.graph.outputs[self.n_carry :]]

    @property
    def input_avals(self) -> list[AVal]:
        return [n.aval for n in self.graph.inputs]

    def infer(self, avals: Sequence[AVal], attrs: Any) -> AVal:
        """The SCAN node's shape rule (``ops.protocol.infer_aval`` asks the body)."""
        return infer_scan(avals, attrs)

    def evaluate(self, arrays: Sequence[Any], attrs: Any, dtype: DType) -> Any:
        """The SCAN node's NumPy semantics (``ops.reference.evaluate`` asks the body)."""
        return run_scan(arrays, attrs, dtype)

    @functools.cached_property
    def _order(self) -> list[Node]:
        return [n for n in self.graph.nodes() if n.prim is not Prim.INPUT]

    def run(self, arrays: Sequence[Any]) -> list[Any]:
        """Evaluate the body with NumPy (the reference semantics)."""
        values: dict[int, Any] = {n.id: a for n, a in zip(self.graph.inputs, arrays, strict=True)}
        for node in self._order:
            args = [values[i.id] for i in node.inputs]
            values[node.id] = reference.evaluate(node.prim, args, node.attr, node.aval.dtype)
        return [values[o.id] for o in self.graph.outputs]


# --- layout of the one output ------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Element offsets inside a SCAN node's flat output.

    With ``save`` the carries are kept: ``[carry into layer 0, ..., into layer L-1, final]``
    for a forward loop and ``[final, carry into layer 0, ..., into layer L-1]`` for a
    reverse one, so layer ``l`` reads its carry at ``history(l)`` and writes the next one
    at ``history(l) + C`` (forward) or ``history(l) - C`` (reverse): both affine in ``l``,
    which lets compiled code address them with one stride. Without ``save`` there is one
    carry slot. The stacked ``ys`` follow leaf by leaf (leaf ``j`` of ``n_j`` elements per
    layer as one contiguous ``[L, n_j]`` block), so each stacked output is a contiguous view.
    """

    carry: int  # C: elements of one carry
    ys: int  # Y: elements of one layer's outputs
    length: int
    save: bool
    reverse: bool = False

    @property
    def final_offset(self) -> int:
        return self.carry * self.length if self.save and not self.reverse else 0

    @property
    def history_offset(self) -> int:
        """Where the carry into layer 0 is (layer ``l``'s is ``C*l`` further)."""
        return self.carry if self.reverse else 0

    @property
    def ys_offset(self) -> int:
        return self.carry * (1 + (self.length if self.save else 0))

    @property
    def size(self) -> int:
        return self.ys_offset + self.length * self.ys

    def y_offset(self, before: int) -> int:
        """Start of the stacked leaf whose per-layer predecessors hold ``before`` elements."""
        return self.ys_offset + self.length * before


def layout(body: Body, length: int, save: bool, reverse: bool = False) -> Layout:
    carry = sum(math.prod(a.shape) for a in body.carry_avals)
    ys = sum(math.prod(a.shape) for a in body.y_avals)
    return Layout(carry, ys, length, save, reverse)


def out_dtype(body: Body) -> DType:
    avals = body.carry_avals + body.y_avals
    if not avals:
        raise ValueError("scan: the body returns neither a carry nor outputs")
    dtypes = {a.dtype for a in avals}
    if len(dtypes) != 1 or not avals[0].dtype.is_float:
        shown = ", ".join(str(a) for a in avals)
        raise TypeError(
            f"scan/checkpoint: the carry and per-layer outputs must share one floating-point "
            f"dtype (they are stored in one buffer), got {shown}"
        )
    return avals[0].dtype


def infer_scan(avals: Sequence[AVal], attrs: Any) -> AVal:
    """Shape rule of SCAN (called by ``ops.protocol.infer_aval``)."""
    body: Body = attrs["body"]
    length: int = attrs["length"]
    expected = list(body.input_avals)
    for i in range(body.n_carry, body.n_carry + body.n_xs):
        expected[i] = AVal((length, *expected[i].shape), expected[i].dtype)
    if len(avals) != len(expected) or any(a != e for a, e in zip(avals, expected, strict=True)):
        raise ShapeError(
            "scan",
            f"inputs {', '.join(map(str, avals))} do not match the traced body's "
            f"{', '.join(map(str, expected))}",
        )
    return AVal((layout(body, length, attrs["save"]).size,), out_dtype(body))


def run_scan(args: Sequence[Any], attrs: Any, dtype: DType) -> Any:
    """NumPy semantics of SCAN: a Python loop over the body (``ops/reference.py``)."""
    body: Body = attrs["body"]
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    lay = layout(body, length, save, reverse)
    nc, nx = body.n_carry, body.n_xs
    out = np.zeros(lay.size, dtype.numpy)
    carry = list(args[:nc])
    xs, consts = args[nc : nc + nx], list(args[nc + nx :])
    for step in range(length):
        layer = length - 1 - step if reverse else step
        if save and lay.carry:
            at = lay.history_offset + layer * lay.carry
            out[at : at + lay.carry] = _flat(carry, dtype)
        results = body.run(carry + [x[layer] for x in xs] + consts)
        carry = results[:nc]
        before = 0
        for y in results[nc:]:
            n = int(np.size(y))
            at = lay.y_offset(before) + layer * n
            out[at : at + n] = np.asarray(y, dtype.numpy).reshape(-1)
            before += n
    out[lay.final_offset : lay.final_offset + lay.carry] = _flat(carry, dtype)
    return out


def _flat(arrays: Sequence[Any], dtype: DType) -> Any:
    if not arrays:
        return np.zeros(0, dtype.numpy)
    return np.concatenate([np.asarray(a, dtype.numpy).reshape(-1) for a in arrays])


_DERIVED: weakref.WeakKeyDictionary[Body, dict[Any, Any]] = weakref.WeakKeyDictionary()


def derived(body: Body) -> dict[Any, Any]:
    """The bodies derived from ``body`` (reverse loops, residual forms), built once per key.

    A side table, not a field: a body's content never changes after tracing. Entries
    live as long as ``body`` does; an entry must not refer back to ``body`` (it would
    keep it alive forever).
    """
    table = _DERIVED.get(body)
    if table is None:
        table = _DERIVED[body] = {}
    return table


__all__ = ["Body", "Layout", "Policy", "derived", "infer_scan", "layout", "out_dtype", "run_scan"]
