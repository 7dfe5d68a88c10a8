"""Lowering a SCAN node (``sg.scan``, ``sg.checkpoint``) to one :class:`~loops.LayerLoop`.

The body sub-graph is optimized once (the graph ``PIPELINE``, cached on the body) and
lowered once by the whole loop pipeline (``lower_program``: fusion, kernels, its own
memory plan): a program of its own. The enclosing kernel is

1. copy the initial carry to where the first layer reads it;
2. ``LayerLoop``: per layer, bind the body's I/O table to per-layer slices
   (``buffer + offset + stride*layer``) of the SCAN node's output (carries in and out,
   stacked ``ys``), of the stacked inputs ``xs`` and of the loop invariants, and run it;
   a loop that keeps no carry history writes the next carry to a scratch buffer and
   copies it into place after each layer.

So the generated source holds one copy of the body whatever the depth, and its arena is
one temp of the enclosing program: live only while the loop runs (what ``sg.checkpoint``
saves: the body's intermediates never outlive the loop).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace
from typing import TYPE_CHECKING

from shapegrad.compiler import loops as L
from shapegrad.compiler.fusion import consumers_of, contiguous_view
from shapegrad.compiler.passes import splat_value
from shapegrad.ir import Graph, Node
from shapegrad.ops.protocol import Prim
from shapegrad.ops.scan import Body, layout
from shapegrad.shapes import size_of

if TYPE_CHECKING:
    from shapegrad.compiler.lower import KernelBuilder


# The compiler's side table: a body's graph after the graph pipeline, once per body
# (bodies are immutable; what the compiler derives from one lives here, not in it).
_OPTIMIZED: weakref.WeakKeyDictionary[Body, Graph] = weakref.WeakKeyDictionary()


def optimized_body(body: Body) -> Graph:
    """The body's graph after the graph pipeline (computed once per body)."""
    graph = _OPTIMIZED.get(body)
    if graph is None:
        from shapegrad.compiler.passes import optimize

        graph, _ = optimize(body.graph)
        _OPTIMIZED[body] = graph
    return graph


def _shift_errors(program: L.Program, delta: int) -> None:
    """Renumber the error codes of ``program`` (and of layer loops inside it) by ``delta``."""
    if not delta:
        return

    def fix(s: L.Stmt) -> L.Stmt:
        return replace(s, code=s.code + delta) if isinstance(s, L.CheckBounds) else s

    for kernel in program.kernels:
        kernel.body = L.map_body(kernel.body, None, fix)
        for s in L.walk(kernel.body):
            if isinstance(s, L.LayerLoop):
                _shift_errors(s.body, delta)
    program.errors = {code + delta: text for code, text in program.errors.items()}


def _forwarded_output(builder: KernelBuilder, node: Node, start: int, size: int) -> str | None:
    """The buffer of a program output that is exactly ``node``'s elements
    ``[start, start+size)`` through a chain of views nothing else reads, or None.

    The loop then writes that stacked output (the gradients of stacked parameters) into the
    output buffer itself: no copy, and no arena bytes for it."""
    graph = builder.graph
    if builder.users is None:
        builder.users = consumers_of(graph)
    users = builder.users
    aliased = {k for k, _ in graph.aliases}
    for k, out in enumerate(graph.outputs):
        if k in aliased or out.id in builder.forwarded or size_of(out.shape) != size:
            continue
        if contiguous_view(out, builder.plan.materialized) != (node, start) or out is node:
            continue
        chain, link = [], out
        while link is not node:
            chain.append(link)
            link = link.inputs[0]
        if any(len(users.get(n.id, [])) != 1 for n in chain[1:]):
            continue
        for user in users.get(node.id, []):
            if user is chain[-1]:
                continue
            if user.prim is not Prim.SLICE or len(user.shape) != 1:
                return None
            lo, hi = user.attr["starts"][0], user.attr["stops"][0]
            if lo < start + size and start < hi:
                return None
        builder.forwarded.add(out.id)
        return builder.names[out.id]
    return None


def emit_layer_loop(builder: KernelBuilder, node: Node, dst: str) -> None:
    """The kernel of SCAN ``node`` writing its flat output ``dst`` (see the module docstring)."""
    attrs = node.attr
    body = attrs["body"]
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    lay = layout(body, length, save, reverse)
    nc, nx = body.n_carry, body.n_xs
    number = len(builder.kernels)
    if builder.lower_body is None:
        raise ValueError(
            f"build_kernels: the SCAN node {node!r} ({body.name}) needs lower_body, the loop "
            "pipeline that lowers its body (compiler.pipeline passes lower_program)"
        )
    program, _ = builder.lower_body(
        optimized_body(body), builder.target, f"{body.name}_layer{number}"
    )
    _shift_errors(program, max(builder.errors, default=0))
    builder.errors.update(program.errors)
    dtype = node.aval.dtype

    # where each carry leaf sits inside one carry
    leaf_offsets, at = [], 0
    for a in body.carry_avals:
        leaf_offsets.append(at)
        at += math.prod(a.shape)

    def operand(k: int) -> tuple[str, int]:
        view = contiguous_view(node.inputs[k], builder.plan.materialized)
        assert view is not None, "fusion materializes every other layer-loop operand"
        return builder.names[view[0].id], view[1]

    first = (length - 1) if reverse else 0
    carry_in_base = lay.history_offset if save else lay.final_offset
    stride_c = lay.carry if save else 0
    statements: list[L.Stmt] = []
    for k in range(nc):  # 1. the initial carry
        n = size_of(node.inputs[k].shape)
        v = builder.fresh(n, "c")
        start = carry_in_base + stride_c * first + leaf_offsets[k]
        splat = splat_value(node.inputs[k])
        if splat is not None:
            load: L.Expr = L.Const(dtype, splat)
        else:
            src, src_offset = operand(k)
            load = L.Load(dtype, src, L.var(v) + src_offset)
        statements.append(L.Loop(v, "parallel", (L.Store(dst, L.var(v) + start, load),)))

    slots: dict[int, L.LayerSlot] = {}
    after: list[L.Stmt] = []
    next_carry = builder.temp(dtype, max(lay.carry, 1), "next") if nc and not save else None
    for k, name in enumerate(program.inputs):
        slot = program.buffers[name].slot
        if k < nc:
            slots[slot] = L.LayerSlot(dst, carry_in_base + leaf_offsets[k], stride_c, False)
        elif k < nc + nx:
            per_layer = size_of(node.inputs[k].shape[1:])
            slots[slot] = L.LayerSlot(*operand(k), per_layer, False)
        else:
            slots[slot] = L.LayerSlot(*operand(k), 0, False)
    for j, name in enumerate(program.outputs):
        slot = program.buffers[name].slot
        if j < nc:
            if save:  # the next layer's carry-in slot: one carry further along the history
                step = -lay.carry if reverse else lay.carry
                offset = carry_in_base + step + leaf_offsets[j]
                slots[slot] = L.LayerSlot(dst, offset, stride_c, True)
            else:
                assert next_carry is not None
                slots[slot] = L.LayerSlot(next_carry, leaf_offsets[j], 0, True)
        else:
            before = sum(math.prod(a.shape) for a in body.y_avals[: j - nc])
            n = math.prod(body.y_avals[j - nc].shape)
            start = lay.y_offset(before)
            target = _forwarded_output(builder, node, start, length * n)
            if target is not None:  # written straight into the program output it feeds
                slots[slot] = L.LayerSlot(target, 0, n, True)
            else:
                slots[slot] = L.LayerSlot(dst, start, n, True)
    for name, array in program.constants.items():
        outer = f"{dst}_{name}"
        spec = program.buffers[name]
        builder.buffers[outer] = L.BufferSpec(outer, spec.dtype, spec.size, "const")
        builder.constants[outer] = array
        slots[spec.slot] = L.LayerSlot(outer, 0, 0, False)
    if next_carry is not None:  # move the next carry into place after each layer
        v = builder.fresh(lay.carry, "c")
        load = L.Load(dtype, next_carry, L.var(v))
        store = L.Store(dst, L.var(v) + lay.final_offset, load)
        after.append(L.Loop(v, "parallel", (store,)))
    assert sorted(slots) == list(range(program.n_slots)), "every body slot is bound"
    item = dtype.numpy.itemsize
    arena = builder.temp(dtype, max(1, -(-program.arena_bytes // item)), "arena")
    loop = L.LayerLoop(
        program,
        length,
        reverse,
        tuple(slots[k] for k in range(program.n_slots)),
        arena,
        tuple(after),
    )
    statements.append(loop)
    work = length * sum(k.work for k in program.kernels)
    builder.kernels.append(
        L.Kernel(f"k{number}", tuple(statements), work, f"scan%{number} ({body.name})")
    )
