"""Tracing SCAN bodies and the recompute VJP of SCAN (a reverse loop).

The VJP of ``SCAN`` is another ``SCAN`` running the other way, whose body is the
forward body *replayed* and differentiated (traced once per body and needs pattern):
each layer's forward is recomputed from its stored carry input. ``_remat.py`` builds the
``policy="residuals"`` form on these pieces; ``control.py`` (the user API) registers the
rule that picks between them. See ``control.py``'s docstring for the whole design.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shapegrad._custom_vjp import StagedRule, register_stager, replay_nodes
from shapegrad.autodiff import CustomRule, CustomVjpCall, backward
from shapegrad.ir import Graph, Node
from shapegrad.ops import prims as p
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.ops.scan import Body, Layout, Policy, derived, layout, out_dtype
from shapegrad.tensor import Tensor

_depth = [0]


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
    return replay_nodes(graph.outputs, env, args[0]._ops if args else None)


def _stage(ops: GraphOps, call: CustomVjpCall, aval: AVal) -> StagedRule:
    """``call``'s backward traced once as a sub-graph of the cotangent, its other inputs
    lifted into ``ops`` (the call's trace), for ``replay_marker`` (see ``_custom_vjp``)."""
    inputs = tuple(ops.lift(t) for t in call.inputs)
    rule = call.rule
    assert rule is not None
    present: list[int] = []  # inputs that get a cotangent (not None)

    def fn(ins: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        cts = rule(ins[0], [True] * len(inputs))
        present[:] = [k for k, c in enumerate(cts) if c is not None]
        return [], [c for c in cts if c is not None]

    staged, captured = trace_body(fn, [aval], 0, 0, f"{call.name}_bwd")
    captures = tuple(ops.lift(c) for c in captured)
    n = len(inputs)

    def make_rule(values: Sequence[Tensor]) -> CustomRule:
        def replayed(ct: Tensor, needs: Sequence[bool]) -> list[Tensor | None]:
            result: list[Tensor | None] = [None] * n
            for k, g in zip(present, replay(staged.graph, [ct, *values]), strict=True):
                result[k] = g
            return result

        return replayed

    return StagedRule(inputs, captures, make_rule)


register_stager(_stage)


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
    """Whether the 1-d ``ct`` is certainly zero on ``[lo, hi)`` (NumPy values are checked,
    unless a tape records ``ct``: a second derivative then needs the path through it;
    graph values are analysed: sums of zero-padded pieces, as autodiff builds them)."""
    if isinstance(ct._payload, np.ndarray):
        if ct._leaf or ct._tape is not None:
            return False  # being differentiated: zero now, but its derivative is not
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
    table = derived(body)
    if key in table:
        built: Body = table[key]
        return built
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
    table[key] = built
    return built


def _scan_vjp(
    inputs: Sequence[Tensor], out: Tensor, ct: Tensor, attrs: Any, needs: Sequence[bool]
) -> list[Tensor | None]:
    """The VJP of SCAN by recomputation (``policy="recompute"``; ``control.py`` picks)."""
    body: Body = attrs["body"]
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    policy: Policy = attrs["policy"]
    nc, nx = body.n_carry, body.n_xs
    lay = layout(body, length, save, reverse)
    needs_t = tuple(bool(n) for n in needs)
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
