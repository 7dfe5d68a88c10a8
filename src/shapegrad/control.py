"""Structured control flow: the layer loop ``sg.scan`` and rematerialization ``sg.checkpoint``.

Both are one primitive, ``SCAN``, whose body is a sub-graph traced **once**
(:class:`Body`, an attribute of the node):

* inputs: initial carry leaves, per-layer inputs ``xs`` (leading dim = the loop
  length), then loop-invariant inputs (explicit ones, then tensors the body
  captured from its closure: closure conversion makes them inputs);
* output: ONE flat buffer of the carry/output dtype, laid out as
  ``[final carry (C) | carry into each layer (L*C, only with save) | ys (L*Y)]``;
  the user's pytrees are slices + reshapes of it (index maps, never copies, in
  compiled code). One output per primitive keeps the IR, autodiff and memory
  planner unchanged.

The VJP of ``SCAN`` is another ``SCAN`` running the other way, whose body is the
forward body *replayed* and differentiated (traced once per body): each layer's
forward is recomputed from its stored carry input, as ANEForge's CheckpointedStack
does (``policy="recompute"``), or the forward loop also stores the body's residuals
(values the backward reads) per layer and the backward body reads them
(``policy="residuals"``). The reverse loop's body lives in its own sub-graph, so
common-subexpression elimination can never merge the recomputation back into the
forward pass: that is what makes ``sg.checkpoint`` = a one-iteration scan work in
compiled graphs. Eagerly the same primitive runs its body with NumPy in a Python
loop (``ops/reference.py`` calls :meth:`Body.run`), and the same VJP rule applies.

Randomness inside a body (dropout) is part of the traced body, so a recomputation
replays the same mask; every layer of a loop sees the same seed (pass per-layer
noise through ``xs`` for different masks).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from shapegrad import tree
from shapegrad.dtypes import DType
from shapegrad.ir import Graph, Node, topological_order
from shapegrad.ops import prims as p
from shapegrad.ops import reference
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.ops.vjp import rule
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["Body", "checkpoint", "scan"]

Policy = Literal["recompute", "residuals"]
_POLICIES = ("recompute", "residuals")
_body_ids = itertools.count()
_depth = [0]


@dataclass(eq=False)
class Body:
    """A function traced once into a sub-graph; compared and hashed by identity.

    ``graph.inputs`` = carry leaves, per-layer slices, loop invariants (in that order);
    ``graph.outputs`` = new carry leaves, then per-layer outputs ``ys``.
    """

    graph: Graph
    n_carry: int
    n_xs: int
    name: str
    number: int = field(default_factory=lambda: next(_body_ids))
    _order: list[Node] | None = None
    # derived bodies (backward loops, residual forms), built once per key
    derived: dict[Any, Any] = field(default_factory=dict)

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

    def run(self, arrays: Sequence[Any]) -> list[Any]:
        """Evaluate the body with NumPy (the reference semantics)."""
        if self._order is None:
            self._order = [n for n in self.graph.nodes() if n.prim is not Prim.INPUT]
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


# --- tracing a body (closure conversion) --------------------------------------------------


class _BodyOps(GraphOps):
    """The graph interpreter of a body trace: tensors of an enclosing trace (or eager
    tensors that take part in differentiation) become extra inputs, not errors."""

    def __init__(self) -> None:
        super().__init__()
        _depth[0] += 1
        self.priority = 10 + _depth[0]  # nested bodies win over their enclosing traces
        self.captured: list[Tensor] = []
        self._capture_of: dict[Any, Node] = {}

    def lift(self, t: Tensor) -> Node:
        if t._ops is self:
            node: Node = t._payload
            return node
        eager = isinstance(t._payload, np.ndarray)
        if eager and not (t._leaf or t._tape is not None):
            return super().lift(t)  # a plain constant
        key = id(t) if eager else (id(t._ops), t._payload.id)
        found = self._capture_of.get(key)
        if found is None:
            found = self.table.make(
                Prim.INPUT, [], {"name": f"captured{len(self.captured)}"}, t.aval
            )
            self._capture_of[key] = found
            self.captured.append(t)
        return found


def trace_body(
    fn: Callable[[list[Tensor]], tuple[list[Tensor], list[Tensor]]],
    in_avals: Sequence[AVal],
    n_carry: int,
    n_xs: int,
    name: str,
) -> tuple[Body, list[Tensor]]:
    """Trace ``fn(inputs) -> (carry_out, ys)`` once; returns the body and its captures."""
    ops = _BodyOps()
    try:
        inputs = [ops.add_input(f"in{i}", a) for i, a in enumerate(in_avals)]
        carry, ys = fn(inputs)
        outputs = [ops.lift_value(t) for t in [*carry, *ys]]
    finally:
        _depth[0] -= 1
    capture_nodes = [ops._capture_of[k] for k in ops._capture_of]
    graph = Graph(list(ops.inputs[: len(in_avals)]) + capture_nodes, outputs, ops.table)
    return Body(graph, n_carry, n_xs, name), ops.captured


def replay(
    graph: Graph, args: Sequence[Tensor], substitute: dict[int, Tensor] | None = None
) -> list[Tensor]:
    """Re-run ``graph``'s nodes as primitives on ``args`` (any interpreter); nodes whose id
    is in ``substitute`` take that value instead of being recomputed."""
    env: dict[int, Tensor] = {n.id: a for n, a in zip(graph.inputs, args, strict=True)}
    env.update(substitute or {})
    like = args[0] if args else None
    for node in topological_order(graph.outputs):
        if node.id in env:
            continue
        if node.prim is Prim.INPUT:
            raise ValueError(f"replay: input {node.attr.get('name')} is not bound")
        ins = [env[i.id] for i in node.inputs]
        ops = like._ops if (like is not None and not ins) else None
        env[node.id] = p.bind(node.prim, ins, ops=ops, **node.attr)
    return [env[o.id] for o in graph.outputs]


# --- binding and unpacking ----------------------------------------------------------------


def bind_scan(
    body: Body,
    inputs: Sequence[Tensor],
    length: int,
    reverse: bool,
    save: bool,
    policy: Policy,
) -> Tensor:
    return p.bind(
        Prim.SCAN,
        list(inputs),
        body=body,
        length=length,
        reverse=reverse,
        save=save,
        policy=policy,
    )


def _split(flat: Tensor, avals: Sequence[AVal], offset: int = 0) -> list[Tensor]:
    """Leaves of ``avals`` packed one after another in the 1-d ``flat`` from ``offset``."""
    out = []
    for a in avals:
        n = math.prod(a.shape)
        out.append(p.reshape(p.slice_(flat, [offset], [offset + n], [1]), a.shape))
        offset += n
    return out


def _rows(flat: Tensor, offset: int, length: int, width: int) -> Tensor:
    """``flat[offset : offset + length*width]`` as ``[length, width]``."""
    piece = p.slice_(flat, [offset], [offset + length * width], [1])
    return p.reshape(piece, (length, width))


def unpack(
    flat: Tensor, body: Body, length: int, save: bool, reverse: bool
) -> tuple[list[Tensor], list[Tensor]]:
    """(final carry leaves, stacked ys leaves) of a SCAN output."""
    lay = layout(body, length, save, reverse)
    carry = _split(flat, body.carry_avals, lay.final_offset)
    return carry, stacked_ys(flat, body, lay)


def stacked_ys(flat: Tensor, body: Body, lay: Layout) -> list[Tensor]:
    """Each per-layer output leaf of a SCAN output (or of its cotangent) as ``[L, ...]``."""
    ys, before = [], 0
    for a in body.y_avals:
        n = math.prod(a.shape)
        rows = _rows(flat, lay.y_offset(before), lay.length, n)
        ys.append(p.reshape(rows, (lay.length, *a.shape)))
        before += n
    return ys


def _concat_flat(leaves: Sequence[Tensor]) -> Tensor:
    flat = [p.reshape(t, (math.prod(t.shape),)) for t in leaves]
    return flat[0] if len(flat) == 1 else p.concat(flat, 0)


def _zero_range(ct: Tensor, lo: int, hi: int) -> bool:
    """Whether the 1-d ``ct`` is certainly zero on ``[lo, hi)`` (NumPy values are checked;
    graph values are analysed: sums of zero-padded pieces, as autodiff builds them)."""
    if isinstance(ct._payload, np.ndarray):
        return not np.any(ct._payload[lo:hi])
    return _zero_node(ct._payload, lo, hi)


def _is_zero_constant(node: Node) -> bool:
    while node.prim is Prim.BROADCAST:
        node = node.inputs[0]
    return node.prim is Prim.CONSTANT and not np.any(node.attr["value"].array)


def _zero_node(node: Node, lo: int, hi: int) -> bool:
    if _is_zero_constant(node):
        return True
    if node.prim is Prim.ADD:
        return all(_zero_node(i, lo, hi) for i in node.inputs)
    if node.prim is Prim.PAD and node.attr["value"] == 0.0:
        start = node.attr["low"][0]
        end = start + node.inputs[0].shape[0]
        return end <= lo or start >= hi or _zero_node(node.inputs[0], lo - start, hi - start)
    return False


# --- the VJP: a reverse loop ------------------------------------------------------------


def _backward_body(body: Body, needs: tuple[bool, ...], with_history_ct: bool) -> Body:
    """The body of the reverse loop of ``body`` (traced once per ``needs`` pattern).

    Reverse-loop inputs: carry = ([ct of the carry (C,)], accumulated cts of the needed
    invariants...); xs = ([carry input of the layer (C,)], [ct of that carry input (C,)],
    [ct of the layer's ys (Y,)], the layer's xs...); invariants = the forward's invariants
    (bracketed parts are absent when C or Y is 0). Outputs: carry = (ct of the layer's
    carry input, accumulators + this layer's share); ys = cts of the layer's needed xs.
    """
    key = ("backward", needs, with_history_ct)
    if key in body.derived:
        built: Body = body.derived[key]
        return built
    from shapegrad.autodiff import backward

    nc, nx = body.n_carry, body.n_xs
    avals = body.input_avals
    carry_avals, y_avals = body.carry_avals, body.y_avals
    dtype = out_dtype(body)
    lay = layout(body, 1, False)
    has_c = lay.carry > 0
    with_history_ct = with_history_ct and has_c
    consts = list(range(nc + nx, len(avals)))
    need_x = [i for i in range(nc, nc + nx) if needs[i]]
    need_k = [i for i in consts if needs[i]]
    for i in need_k:
        if avals[i].dtype != dtype:
            raise TypeError(
                f"scan: a loop-invariant input {avals[i]} needs a gradient of another dtype than "
                f"the loop's outputs ({dtype}); cast it outside the loop"
            )
    flat_c = AVal((lay.carry,), dtype)
    carry_part = ([flat_c] if has_c else []) + [avals[i] for i in need_k]
    xs_part = ([flat_c] if has_c else []) + ([flat_c] if with_history_ct else [])
    xs_part += list(y_avals)  # the cotangent of each output leaf
    n_carry, n_xs = len(carry_part), len(xs_part) + nx
    in_avals = carry_part + xs_part + [avals[i] for i in range(nc, len(avals))]

    def fn(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        it = iter(inputs)
        ct_c = next(it) if has_c else None
        accs = [next(it) for _ in need_k]
        hist = next(it) if has_c else None
        ct_hist = next(it) if with_history_ct else None
        ct_y = [next(it) for _ in y_avals]
        rest = list(it)
        xs, invariants = rest[:nx], rest[nx:]
        carry_in = _split(hist, carry_avals) if hist is not None else []
        leaves = [*carry_in, *xs, *invariants]
        outs = replay(body.graph, leaves)
        cts = (_split(ct_c, carry_avals) if ct_c is not None else []) + ct_y
        wrt = leaves[:nc] + [leaves[i] for i in need_x + need_k]
        grads = backward(outs, cts, wrt)
        g_carry, g_x, g_k = grads[:nc], grads[nc : nc + len(need_x)], grads[nc + len(need_x) :]
        new_carry = []
        if has_c:
            new_ct = _concat_flat(g_carry)
            new_carry.append(new_ct + ct_hist if ct_hist is not None else new_ct)
        new_carry += [a + g for a, g in zip(accs, g_k, strict=True)]
        return new_carry, list(g_x)

    built, captured = trace_body(fn, in_avals, n_carry, n_xs, f"{body.name}_vjp")
    assert not captured, "a backward body captures nothing: every value is an input"
    body.derived[key] = built
    return built


@rule(Prim.SCAN)
def _scan_vjp(
    inputs: Sequence[Tensor], out: Tensor, ct: Tensor, attrs: Any, needs: Sequence[bool]
) -> list[Tensor | None]:
    body: Body = attrs["body"]
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    policy: Policy = attrs["policy"]
    nc, nx = body.n_carry, body.n_xs
    lay = layout(body, length, save, reverse)
    needs_t = tuple(bool(n) for n in needs)
    if policy == "residuals":
        from shapegrad._remat import residual_vjp

        return residual_vjp(body, inputs, out, ct, attrs, needs_t)
    has_c, has_y = lay.carry > 0, lay.ys > 0
    history_ct = False
    xs_in: list[Tensor] = []
    carry_in: list[Tensor] = []
    if has_c:
        # a loop that did not keep its carries (a reverse loop) runs again, keeping them
        history = out if save else bind_scan(body, inputs, length, reverse, True, policy)
        saved = layout(body, length, True, reverse)
        carry_in.append(p.slice_(ct, [lay.final_offset], [lay.final_offset + lay.carry], [1]))
        xs_in.append(_rows(history, saved.history_offset, length, lay.carry))
        history_ct = save and not _zero_range(
            ct, lay.history_offset, lay.history_offset + length * lay.carry
        )
        if history_ct:  # something reads the stored carries (a gradient of a gradient)
            xs_in.append(_rows(ct, lay.history_offset, length, lay.carry))
    if has_y:
        xs_in += stacked_ys(ct, body, lay)
    need_k = [i for i in range(nc + nx, len(inputs)) if needs_t[i]]
    bwd = _backward_body(body, needs_t, has_c and history_ct)
    need_x = [i for i in range(nc, nc + nx) if needs_t[i]]
    return run_reverse(
        bwd, body, inputs, carry_in, xs_in, (need_k, need_x), (length, reverse), policy, has_c
    )


def run_reverse(
    bwd: Body,
    body: Body,
    inputs: Sequence[Tensor],
    carry_in: list[Tensor],
    xs_in: list[Tensor],
    needed: tuple[list[int], list[int]],
    loop: tuple[int, bool],
    policy: Policy,
    has_c: bool,
) -> list[Tensor | None]:
    """Run the backward loop ``bwd`` (the other way round) and place its results: the
    initial carries' cotangent (when ``has_c``), then the closed-over inputs' (``needed[0]``)
    and the stacked inputs' (``needed[1]``) gradients; None for the others. Shared by both
    VJP policies (recompute here, stored residuals in ``_remat.py``)."""
    length, reverse = loop
    need_k, need_x = needed
    nc = body.n_carry
    carry_in = [*carry_in, *(p.zeros_like(inputs[i]) for i in need_k)]
    flat = bind_scan(bwd, [*carry_in, *xs_in, *inputs[nc:]], length, not reverse, False, policy)
    carry_out, ys = unpack(flat, bwd, length, False, not reverse)
    result: list[Tensor | None] = [None] * len(inputs)
    if has_c:
        for i, g in enumerate(_split(carry_out[0], body.carry_avals)):
            result[i] = g
        carry_out = carry_out[1:]
    for i, g in zip(need_k, carry_out, strict=True):
        result[i] = g
    for i, g in zip(need_x, ys, strict=True):
        result[i] = g
    return result


# --- the user API -----------------------------------------------------------------------


def _as_tensor(x: Any, like: Tensor | None) -> Tensor:
    if isinstance(x, Tensor):
        return x
    from shapegrad.ops.eager import tensor

    return tensor(np.asarray(x))


def scan(
    f: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any = None,
    length: int | None = None,
    reverse: bool = False,
    policy: Policy = "recompute",
) -> tuple[Any, Any]:
    """A loop over the leading axis of ``xs`` whose body is traced and compiled once
    (``jax.lax.scan``'s contract).

    ``f(carry, x) -> (carry, y)``: ``carry`` keeps its structure, shapes and dtypes;
    ``x`` is one layer's slice of ``xs`` (e.g. one block's parameters from a
    stacked ParamList whose annotations have a leading ``layers`` dim); the ``y`` of
    every layer are stacked along a new leading axis. Tensors the body uses from its
    closure are loop invariants (their gradients are accumulated across layers).

    Args:
        f: the layer body, a pure function of tensors (no Python control flow on values).
        init: the initial carry (a pytree of tensors).
        xs: per-layer inputs (a pytree of tensors with one leading length), or None.
        length: the number of layers when ``xs`` is None (else it must agree).
        reverse: run from the last layer to the first (outputs stay in layer order).
        policy: gradients recompute each layer's forward from its stored carry input
            (``"recompute"``: memory of one carry per layer) or read residuals the
            forward loop stored (``"residuals"``: no recomputation, more memory).
    Returns:
        ``(final carry, stacked ys)`` with the structures ``f`` returned.
    Example:
        >>> def layer(h, wb):
        ...     w, b = wb
        ...     return sg.relu(h @ w.T + b), None
        >>> h, _ = sg.scan(layer, x, (ws, bs))     # ws: [layers, d, d], bs: [layers, d]
    """
    if policy not in _POLICIES:
        raise ValueError(f"scan: policy must be one of {_POLICIES}, got {policy!r}")
    carry_leaves, carry_td = tree.flatten(init)
    x_leaves, x_td = tree.flatten(xs)
    carry_leaves = [_as_tensor(c, None) for c in carry_leaves]
    x_leaves = [_as_tensor(x, None) for x in x_leaves]
    lengths = {x.shape[0] if x.ndim else -1 for x in x_leaves}
    if length is not None:
        lengths.add(length)
    if len(lengths) != 1 or -1 in lengths:
        shown = ", ".join(fmt(x.shape) for x in x_leaves)
        raise ShapeError(
            "scan",
            f"every xs leaf needs the same leading (layers) length"
            f"{'' if length is None else f' = {length}'}: got {shown or 'no xs and no length'}",
        )
    (n_layers,) = lengths
    if n_layers < 1:
        raise ShapeError("scan", "the loop needs at least one layer")
    in_avals = [c.aval for c in carry_leaves] + [AVal(x.shape[1:], x.dtype) for x in x_leaves]
    nc, nx = len(carry_leaves), len(x_leaves)
    y_td_box: list[tree.TreeDef] = []

    def fn(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        carry = tree.unflatten(carry_td, inputs[:nc])
        x = tree.unflatten(x_td, inputs[nc : nc + nx])
        result = f(carry, x)
        if not isinstance(result, tuple) or len(result) != 2:
            raise TypeError("scan: the body must return a pair (new_carry, y)")
        new_carry, y = result
        new_leaves, new_td = tree.flatten(new_carry)
        if new_td.signature() != carry_td.signature() or len(new_leaves) != nc:
            raise TypeError("scan: the body must return a carry with the structure of init")
        for old, new in zip(inputs[:nc], new_leaves, strict=True):
            if not isinstance(new, Tensor) or new.aval != old.aval:
                got = new.aval if isinstance(new, Tensor) else type(new).__name__
                raise ShapeError(
                    "scan", f"the body changes a carry from {old.aval} to {got}; it must keep it"
                )
        y_leaves, y_td = tree.flatten(y)
        y_td_box.append(y_td)
        return list(new_leaves), [_as_tensor(t, None) for t in y_leaves]

    name = getattr(f, "__name__", "body")
    body, captured = trace_body(fn, in_avals, nc, nx, name)
    n_ys = len(body.y_avals)
    if policy == "residuals":
        from shapegrad._remat import residual_forward

        body = residual_forward(body)
    flat = bind_scan(body, [*carry_leaves, *x_leaves, *captured], n_layers, reverse, True, policy)
    carry, ys = unpack(flat, body, n_layers, True, reverse)
    return tree.unflatten(carry_td, carry), tree.unflatten(y_td_box[0], ys[:n_ys])


def checkpoint(fn: Callable[..., Any], policy: Policy = "recompute") -> Callable[..., Any]:
    """``fn`` whose intermediate values are not kept for the backward pass but recomputed
    (``jax.checkpoint`` / ``torch.utils.checkpoint``); works eagerly and compiled.

    Tensor arguments (and tensors ``fn`` captures) are the region's inputs; its outputs
    (a pytree) must share one floating-point dtype. Non-tensor arguments are static.
    Example:
        >>> block = sg.checkpoint(lambda h, w: sg.gelu(h @ w))
        >>> loss = block(x, w).sum()      # backward recomputes gelu(h @ w)'s internals
    """
    if policy not in _POLICIES:  # checked here, not at the first call deep in a trace
        raise ValueError(f"sg.checkpoint: policy must be one of {_POLICIES}, got {policy!r}")
    if not callable(fn):
        raise TypeError(f"sg.checkpoint: expected a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        leaves, td = tree.flatten(args)
        tensors = [_as_tensor(t, None) for t in leaves]
        out_td_box: list[tree.TreeDef] = []

        def region(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
            result = fn(*tree.unflatten(td, inputs))
            out_leaves, out_td = tree.flatten(result)
            out_td_box.append(out_td)
            return [], [_as_tensor(t, None) for t in out_leaves]

        name = getattr(fn, "__name__", "region")
        body, captured = trace_body(region, [t.aval for t in tensors], 0, 0, f"checkpoint_{name}")
        n_ys = len(body.y_avals)
        if policy == "residuals":
            from shapegrad._remat import residual_forward

            body = residual_forward(body)
        flat = bind_scan(body, [*tensors, *captured], 1, False, True, policy)
        _, ys = unpack(flat, body, 1, True, False)
        ys = ys[:n_ys]
        return tree.unflatten(out_td_box[0], [p.reshape(y, y.shape[1:]) for y in ys])

    return wrapped
