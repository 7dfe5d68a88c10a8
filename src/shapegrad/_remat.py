"""The ``policy="residuals"`` form of a layer loop: store what the backward reads, per layer.

The reverse loop's body ``B`` (``_scan._backward_body``: the forward replayed, then
differentiated) splits into nodes that depend on cotangents and nodes that do not.
The second kind that the first kind reads are the *residuals*. Two new bodies follow:

* ``Fr``: the forward body that also returns the residuals as extra per-layer outputs
  (cast to the loop's dtype: boolean masks are stored as 0/1), so the forward loop
  stores them, stacked;
* ``Br``: ``B`` with each residual replaced by a per-layer input: no recomputation (and,
  when nothing reads the stored carries, with a zero for the carry history's cotangent,
  which is then no input at all).

What is stored are the results of products, reductions and gathers (JAX's
"dots saveable" choice), each moved along the chain of its only reader while that reader
is elementwise or a reshape/permute of the same size (a bias add, the causal mask, heads
merged: the forward then writes the stored value once, in place, as the unrolled program
would): other views and elementwise math are redone in the backward body, where fusion
inlines them into its kernels, and constants are never stored. The residual outputs are internal: if
anything differentiates through them (a gradient of a gradient) and the cotangent
reaching them cannot be shown to be zero, the VJP falls back to recomputation over
``Fr``, which is always correct.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from shapegrad._custom_vjp import replay_nodes
from shapegrad._scan import (
    _backward_body,
    _concat_flat,
    _rows,
    _scan_vjp,
    _zero_range,
    replay,
    run_reverse,
    stacked_ys,
    trace_body,
)
from shapegrad.ir import Node, topological_order
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import ELEMENTWISE, LAYOUT, Prim
from shapegrad.ops.scan import Body, derived, layout, out_dtype
from shapegrad.tensor import Tensor

_FREE = LAYOUT | {Prim.STOP_GRADIENT, Prim.CAST}


def _conservative_needs(body: Any) -> tuple[bool, ...]:
    """At forward time nothing is known: every floating-point input may need a gradient."""
    return tuple(a.dtype.is_float for a in body.input_avals)


def _residual_nodes(bwd: Any, n_ct: set[int]) -> list[Node]:
    """Nodes of ``bwd`` computable without cotangents that cotangent-dependent nodes read."""
    order = topological_order(bwd.graph.outputs)
    input_ids = {n.id for n in bwd.graph.inputs}
    on_ct: set[int] = set(n_ct)
    uses_input: set[int] = set()
    free: set[int] = set()
    for n in order:
        if n.id in input_ids:
            if n.id not in n_ct:
                uses_input.add(n.id)
            free.add(n.id)
            continue
        if any(i.id in on_ct for i in n.inputs):
            on_ct.add(n.id)
        if any(i.id in uses_input for i in n.inputs):
            uses_input.add(n.id)
        if n.id not in uses_input or (n.prim in _FREE and all(i.id in free for i in n.inputs)):
            free.add(n.id)
    found: dict[int, Node] = {}

    def store(n: Node) -> None:
        # Views and elementwise math are redone in the backward body (fused into its
        # kernels, they cost less than the memory traffic of storing them): what is
        # stored are the products, reductions and gathers they start from.
        stack = [n]
        while stack:
            n = stack.pop()
            if n.id in found or n.id in free:
                continue
            if n.prim in _FREE or n.prim in ELEMENTWISE:
                found[n.id] = n  # visited; dropped below
                stack.extend(n.inputs)
                continue
            found[n.id] = n
            kept.add(n.id)

    kept: set[int] = set()

    readers = [n for n in order if n.id in on_ct]
    for n in readers:
        for i in n.inputs:
            if i.id not in on_ct and i.id not in free:
                store(i)
    for o in bwd.graph.outputs:
        if o.id not in on_ct and o.id not in free:
            store(o)
    stored = [n for n in found.values() if n.id in kept]
    return _store_where_read(stored, order, bwd.graph.outputs, on_ct)


def _store_where_read(
    stored: list[Node], order: list[Node], outputs: Sequence[Node], on_ct: set[int]
) -> list[Node]:
    """Each stored value moved along the chain of its only reader while that reader is
    elementwise math or a reshape/permute of the same size computed without cotangents:
    a product is then stored after its epilogue (a bias add, the causal mask) and in the
    layout its reader wants (attention heads merged), so the forward writes it once, in
    place, and the backward reads it without recomputing the epilogue or copying it."""
    readers: dict[int, list[Node]] = {}
    for n in order:
        for i in n.inputs:
            readers.setdefault(i.id, []).append(n)
    out_ids = {o.id for o in outputs}
    moved: dict[int, Node] = {}
    for n in stored:
        while n.id not in out_ids:
            users = readers.get(n.id, [])
            if len(users) != 1:
                break
            (u,) = users
            if u.prim not in ELEMENTWISE and u.prim not in (Prim.RESHAPE, Prim.PERMUTE):
                break
            if u.id in on_ct or u.aval.dtype != n.aval.dtype:
                break
            if math.prod(u.shape) != math.prod(n.shape):
                break
            n = u
        moved.setdefault(n.id, n)
    return list(moved.values())


def _replay_nodes(targets: Sequence[Node], env: dict[int, Tensor], like: Tensor) -> list[Tensor]:
    """Values of ``targets`` re-run as primitives from the values already in ``env``."""
    return replay_nodes(
        targets, env, like._ops, "residuals: a residual depends on a cotangent input"
    )


def residual_forward(body: Any) -> Any:
    """``Fr`` for ``body`` (built once): ``body`` plus its residuals as extra outputs."""
    cached = derived(body).get("residual_forward")
    if cached is not None:
        return cached

    needs = _conservative_needs(body)
    bwd = _backward_body(body, needs, True)
    lay = layout(body, 1, False)
    has_c = lay.carry > 0
    n_need_k = sum(needs[body.n_carry + body.n_xs :])
    ins = bwd.graph.inputs
    n_ct_inputs = (1 if has_c else 0) + n_need_k  # carry part: ct of the carry, accumulators
    xs_start = n_ct_inputs
    hist = ins[xs_start] if has_c else None
    cts = list(ins[:n_ct_inputs])
    cursor = xs_start + (1 if has_c else 0)
    if has_c:
        cts.append(ins[cursor])  # ct of the history
        cursor += 1
    for _ in body.y_avals:  # the cotangent of each output leaf
        cts.append(ins[cursor])
        cursor += 1
    body_inputs = ins[cursor:]  # the layer's xs, then invariants
    residuals = _residual_nodes(bwd, {n.id for n in cts})
    dtype = out_dtype(body)
    nc = body.n_carry

    def fn(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        outs = replay(body.graph, inputs)
        env: dict[int, Tensor] = {}
        if hist is not None:
            env[hist.id] = _concat_flat(inputs[:nc])
        for node, value in zip(body_inputs, inputs[nc:], strict=True):
            env[node.id] = value
        values = _replay_nodes(residuals, env, inputs[0]) if residuals else []
        stored = [v if v.dtype == dtype else v.astype(dtype) for v in values]
        return outs[:nc], outs[nc:] + stored

    forward: Body
    forward, captured = trace_body(fn, body.input_avals, nc, body.n_xs, f"{body.name}_res")
    assert not captured
    # what the VJP over ``forward`` needs of ``body`` (``forward`` shares its inputs and
    # carries): never ``body`` itself, which maps to ``forward`` in the side table
    user_ys = layout(body, 1, False).ys
    derived(forward)["residual_of"] = (user_ys, bwd, residuals, len(body.y_avals), cursor)
    derived(body)["residual_forward"] = forward
    return forward


def _residual_backward(forward: Any, history_ct: bool) -> Any:
    """``Br``: the reverse body reading residuals as per-layer inputs (built once per
    ``history_ct``). Without ``history_ct`` (nothing reads the stored carries, the usual
    case) the cotangent of the carry history is no input but a zero the graph optimizer
    folds away: the enclosing program then never builds the zero-padded cotangent of the
    whole stacked output (the residuals included) only to read its zero rows."""
    key = ("residual_backward", history_ct)
    cached = derived(forward).get(key)
    if cached is not None:
        return cached
    _, bwd, residuals, n_user, cursor = derived(forward)["residual_of"]
    avals = [n.aval for n in bwd.graph.inputs]
    has_c = layout(forward, 1, False).carry > 0
    dropped = cursor - n_user - 1 if has_c and not history_ct else None  # the history ct
    kept = [a for k, a in enumerate(avals) if k != dropped]
    at = cursor - (dropped is not None)
    in_avals = kept[:at] + [r.aval for r in residuals] + kept[at:]
    n_res = len(residuals)

    def fn(inputs: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        values = inputs[at : at + n_res]
        args = inputs[:at] + inputs[at + n_res :]
        if dropped is not None:
            a = avals[dropped]
            args.insert(dropped, p.full(a.shape, 0, a.dtype, like=inputs[0]))
        substitute = {r.id: v for r, v in zip(residuals, values, strict=True)}
        outs = replay(bwd.graph, args, substitute)
        return outs[: bwd.n_carry], outs[bwd.n_carry :]

    n_xs = bwd.n_xs + n_res - (dropped is not None)
    backward: Body
    backward, captured = trace_body(fn, in_avals, bwd.n_carry, n_xs, f"{forward.name}_vjp")
    assert not captured
    derived(forward)[key] = backward
    return backward


def residual_vjp(
    forward: Any,
    inputs: Sequence[Tensor],
    out: Tensor,
    ct: Tensor,
    attrs: Any,
    needs: tuple[bool, ...],
) -> list[Tensor | None]:
    """The VJP of a SCAN over ``Fr`` (see the module docstring)."""
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    recompute = {**attrs, "policy": "recompute"}

    info = derived(forward).get("residual_of")
    lay = layout(forward, length, save, reverse)
    if info is None or not save:
        return list(_scan_vjp(inputs, out, ct, recompute, needs))
    user_ys, bwd, residuals, n_user, cursor = info
    if not _zero_range(ct, lay.y_offset(user_ys), lay.size):  # the residuals' cotangents
        return list(_scan_vjp(inputs, out, ct, recompute, needs))
    # ``needs`` may ask for less than the conservative pattern ``Br`` was built for; the
    # extra gradients are computed and dropped.
    nc, nx = forward.n_carry, forward.n_xs
    has_c = lay.carry > 0
    history = lay.history_offset, lay.history_offset + length * lay.carry
    history_ct = has_c and not _zero_range(ct, *history)
    br = _residual_backward(forward, history_ct)
    carry_in: list[Tensor] = []
    xs_in: list[Tensor] = []
    if has_c:
        carry_in.append(p.slice_(ct, [lay.final_offset], [lay.final_offset + lay.carry], [1]))
        xs_in.append(_rows(out, lay.history_offset, length, lay.carry))
        if history_ct:
            xs_in.append(_rows(ct, lay.history_offset, length, lay.carry))
    xs_in += stacked_ys(ct, forward, lay)[:n_user]
    for r, piece in zip(residuals, stacked_ys(out, forward, lay)[n_user:], strict=True):
        xs_in.append(piece if r.aval.dtype == piece.dtype else piece.astype(r.aval.dtype))
    conservative = _conservative_needs(forward)
    need_k = [i for i in range(nc + nx, len(inputs)) if conservative[i]]
    need_x = [i for i in range(nc, nc + nx) if conservative[i]]
    result = run_reverse(
        br, forward, inputs, carry_in, xs_in, (need_k, need_x), (length, reverse), "recompute", has_c
    )
    return [g if needs[i] or i < nc else None for i, g in enumerate(result)]


__all__ = ["residual_forward", "residual_vjp"]
