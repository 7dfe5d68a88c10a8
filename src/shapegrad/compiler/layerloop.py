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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from shapegrad.compiler import loops as L
from shapegrad.ir import Graph, Node
from shapegrad.shapes import size_of

if TYPE_CHECKING:
    from shapegrad.compiler.lower import KernelBuilder


def optimized_body(body: Any) -> Graph:
    """The body's graph after the graph pipeline (computed once per body)."""
    graph: Graph | None = body.derived.get("optimized")
    if graph is None:
        from shapegrad.compiler.passes import optimize

        graph, _ = optimize(body.graph)
        body.derived["optimized"] = graph
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


def emit_layer_loop(builder: KernelBuilder, node: Node, dst: str) -> None:
    """The kernel of SCAN ``node`` writing its flat output ``dst`` (see the module docstring)."""
    from shapegrad.compiler.pipeline import lower_program
    from shapegrad.control import layout

    attrs = node.attr
    body = attrs["body"]
    length, reverse, save = attrs["length"], attrs["reverse"], attrs["save"]
    lay = layout(body, length, save, reverse)
    nc, nx = body.n_carry, body.n_xs
    number = len(builder.kernels)
    program, _ = lower_program(optimized_body(body), builder.target, f"{body.name}_layer{number}")
    _shift_errors(program, max(builder.errors, default=0))
    builder.errors.update(program.errors)
    dtype = node.aval.dtype

    # where each carry leaf sits inside one carry
    leaf_offsets, at = [], 0
    for a in body.carry_avals:
        leaf_offsets.append(at)
        at += math.prod(a.shape)

    first = (length - 1) if reverse else 0
    carry_in_base = lay.history_offset if save else lay.final_offset
    stride_c = lay.carry if save else 0
    statements: list[L.Stmt] = []
    for k in range(nc):  # 1. the initial carry
        src = builder.names[node.inputs[k].id]
        n = size_of(node.inputs[k].shape)
        v = builder.fresh(n, "c")
        start = carry_in_base + stride_c * first + leaf_offsets[k]
        load = L.Load(dtype, src, L.var(v))
        statements.append(L.Loop(v, "parallel", (L.Store(dst, L.var(v) + start, load),)))

    slots: dict[int, L.LayerSlot] = {}
    after: list[L.Stmt] = []
    next_carry = builder.temp(dtype, max(lay.carry, 1), "next") if nc and not save else None
    for k, name in enumerate(program.inputs):
        slot = program.buffers[name].slot
        if k < nc:
            slots[slot] = L.LayerSlot(dst, carry_in_base + leaf_offsets[k], stride_c, False)
        elif k < nc + nx:
            operand = node.inputs[k]
            per_layer = size_of(operand.shape[1:])
            slots[slot] = L.LayerSlot(builder.names[operand.id], 0, per_layer, False)
        else:
            slots[slot] = L.LayerSlot(builder.names[node.inputs[k].id], 0, 0, False)
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
            y_offsets = 0
            for a in body.y_avals[: j - nc]:
                y_offsets += math.prod(a.shape)
            slots[slot] = L.LayerSlot(dst, lay.ys_offset + y_offsets, lay.ys, True)
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
