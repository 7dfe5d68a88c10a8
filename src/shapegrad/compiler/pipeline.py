"""The loop pipeline: an optimized Graph -> a memory-planned loop-IR Program, stage by stage.

``LOOP_PIPELINE`` is the ordered, visible list of loop stages, the loop-level
twin of the graph ``PIPELINE`` in ``compiler/passes.py``. Every backend that
renders loop IR calls :func:`lower_program` with its
:class:`~shapegrad.compiler.target.Target`; nothing else lowers a graph.

========================  ==========================================================
stage                     what it does
========================  ==========================================================
choose_conv_algorithm     im2col or Winograd for each ``conv2d(algorithm="auto")``, by
                          the target's rule (``conv_algorithm.py``; its dump: the graph)
permute_product_outputs   a permuted product becomes a product writing that layout, batch
                          letters between its rows and columns (``products.py``;
                          optional: ``Target.strided_batches``)
widen_library_products    a product of a type the target's library lacks (bfloat16 on C)
                          runs in its accumulator type and is rounded once (``widen.py``)
plan_fusion               which values get a buffer, which are recomputed inline, which
                          reductions take their elementwise consumer as an epilogue
build_kernels             one kernel of loop IR per materialized value (``lower.py``)
schedule_outputs_early    kernels that only write outputs run right after what they read,
                          so the temps they read die early (``memory.py``)
fuse_batch_producers      large batched products build their operand one batch slice at
                          a time, and take in adjacent per-batch-index kernels
                          (``batchfuse.py``; optional: ``Target.batch_fusion``)
hoist_bounds_checks       index checks of program inputs run before any kernel, so a
                          failing step changes nothing (optional)
place_state_updates       updated state written in place where safe (``memory.py``)
forward_output_copies     an output that is a whole copy of a temp is written in place of
                          that temp: no copy kernel (``memory.py``)
overlap_collectives       all-reduces start as soon as their operand is written and are
                          waited for just before their result is read (``overlap.py``;
                          optional: GPU targets stage collectives through the host)
fuse_elementwise_kernels  adjacent elementwise kernels over one index space share one
                          loop nest (``loopfuse.py``; optional)
fuse_row_kernels          adjacent kernels over the same rows (a softmax's max, exp, sum
                          and divide) share one loop over the rows (``rowfuse.py``;
                          optional)
collapse_loops            two nested loops whose indices hold their variables only as
                          ``B*i + j`` become one loop (``collapse.py``; optional)
split_index_sets          short loops unrolled, loops cut into segments on which their
                          range tests are constant, ``v // d`` indexing div-split; loops
                          the backend threads stay whole (``splitting.py``; optional)
speculate_selects         selects whose arms are safe to compute whatever the condition
                          are marked so both arms are computed and blended: the loop
                          vectorizes (``speculate.py``; optional: C only)
pack_arena                temps packed into one arena by liveness (``memory.py``)
assign_slots              the I/O table: inputs, then outputs, then constants
========================  ==========================================================

Each stage is a function ``(LoopUnit) -> LoopUnit``; optional stages are skipped
when the target says so (``Target.runs``). After every stage the program (or the
fusion plan) is handed to ``on_stage``, which ``SHAPEGRAD_DEBUG`` uses to write
``loopNN_<stage>.txt`` next to the graph dumps, and a :class:`LoopStageStat`
records its time and the program's size.

Example:
    >>> program, stats = lower_program(graph, C_TARGET, name="step")
    >>> print(program.format())
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.batchfuse import fuse_batch_producers
from shapegrad.compiler.collapse import collapse_loops
from shapegrad.compiler.conv_algorithm import choose_conv_algorithm
from shapegrad.compiler.debug import write_dump
from shapegrad.compiler.fusion import FusionPlan, plan_fusion
from shapegrad.compiler.loopfuse import fuse_elementwise_kernels
from shapegrad.compiler.lower import build_kernels, local_id
from shapegrad.compiler.memory import (
    forward_output_copies,
    pack_arena,
    place_state_updates,
    schedule_outputs_early,
)
from shapegrad.compiler.overlap import overlap_collectives
from shapegrad.compiler.products import permute_product_outputs
from shapegrad.compiler.rowfuse import fuse_row_kernels
from shapegrad.compiler.speculate import speculate_selects
from shapegrad.compiler.splitting import split_index_sets
from shapegrad.compiler.target import Target
from shapegrad.compiler.widen import widen_library_products
from shapegrad.ir import Graph


@dataclass
class LoopUnit:
    """What flows through the loop stages: the graph, the target and what is built so far."""

    graph: Graph
    target: Target
    name: str
    plan: FusionPlan | None = None
    program: L.Program | None = None

    def built(self) -> L.Program:
        """The program (stages after ``build_kernels`` only)."""
        assert self.program is not None, "this stage runs after build_kernels"
        return self.program


@dataclass(frozen=True)
class LoopStage:
    """A named stage; ``optional`` stages may be skipped by a target."""

    name: str
    run: Callable[[LoopUnit], LoopUnit]
    optional: bool = False


@dataclass(frozen=True)
class LoopStageStat:
    """One stage application: wall time and the program's size after it."""

    stage: str
    seconds: float
    skipped: bool
    kernels: int
    buffers: int
    arena_bytes: int


# --- the stages -----------------------------------------------------------------------


def stage_choose_conv_algorithm(unit: LoopUnit) -> LoopUnit:
    return replace(unit, graph=choose_conv_algorithm(unit.graph, unit.target))


def stage_permute_product_outputs(unit: LoopUnit) -> LoopUnit:
    return replace(unit, graph=permute_product_outputs(unit.graph))


def stage_widen_library_products(unit: LoopUnit) -> LoopUnit:
    return replace(unit, graph=widen_library_products(unit.graph, unit.target))


def stage_plan_fusion(unit: LoopUnit) -> LoopUnit:
    return replace(unit, plan=plan_fusion(unit.graph, unit.target))


def stage_build_kernels(unit: LoopUnit) -> LoopUnit:
    assert unit.plan is not None, "build_kernels runs after plan_fusion"
    program = build_kernels(unit.graph, unit.plan, unit.target, unit.name, lower_program)
    return replace(unit, program=program)


def stage_schedule_outputs_early(unit: LoopUnit) -> LoopUnit:
    schedule_outputs_early(unit.built())
    return unit


def stage_fuse_batch_producers(unit: LoopUnit) -> LoopUnit:
    fuse_batch_producers(unit.built(), unit.target)
    return unit


def stage_hoist_bounds_checks(unit: LoopUnit) -> LoopUnit:
    hoist_bounds_checks(unit.built())
    return unit


def stage_place_state_updates(unit: LoopUnit) -> LoopUnit:
    place_state_updates(unit.built())
    return unit


def stage_forward_output_copies(unit: LoopUnit) -> LoopUnit:
    forward_output_copies(unit.built())
    return unit


def stage_overlap_collectives(unit: LoopUnit) -> LoopUnit:
    overlap_collectives(unit.built())
    return unit


def stage_fuse_elementwise_kernels(unit: LoopUnit) -> LoopUnit:
    fuse_elementwise_kernels(unit.built(), unit.target.tuning)
    return unit


def stage_fuse_row_kernels(unit: LoopUnit) -> LoopUnit:
    fuse_row_kernels(unit.built(), unit.target.tuning)
    return unit


def stage_collapse_loops(unit: LoopUnit) -> LoopUnit:
    collapse_loops(unit.built(), unit.target)
    return unit


def stage_split_index_sets(unit: LoopUnit) -> LoopUnit:
    split_index_sets(unit.built(), unit.target)
    return unit


def stage_speculate_selects(unit: LoopUnit) -> LoopUnit:
    speculate_selects(unit.built())
    return unit


def stage_pack_arena(unit: LoopUnit) -> LoopUnit:
    pack_arena(unit.built(), unit.target.alignment)
    return unit


def stage_assign_slots(unit: LoopUnit) -> LoopUnit:
    assign_slots(unit.built())
    return unit


LOOP_PIPELINE: list[LoopStage] = [
    LoopStage("choose_conv_algorithm", stage_choose_conv_algorithm),
    LoopStage("permute_product_outputs", stage_permute_product_outputs, optional=True),
    LoopStage("widen_library_products", stage_widen_library_products),
    LoopStage("plan_fusion", stage_plan_fusion),
    LoopStage("build_kernels", stage_build_kernels),
    LoopStage("schedule_outputs_early", stage_schedule_outputs_early, optional=True),
    LoopStage("fuse_batch_producers", stage_fuse_batch_producers, optional=True),
    LoopStage("hoist_bounds_checks", stage_hoist_bounds_checks, optional=True),
    LoopStage("place_state_updates", stage_place_state_updates),
    LoopStage("forward_output_copies", stage_forward_output_copies),
    LoopStage("overlap_collectives", stage_overlap_collectives, optional=True),
    LoopStage("fuse_elementwise_kernels", stage_fuse_elementwise_kernels, optional=True),
    LoopStage("fuse_row_kernels", stage_fuse_row_kernels, optional=True),
    LoopStage("collapse_loops", stage_collapse_loops, optional=True),
    LoopStage("split_index_sets", stage_split_index_sets, optional=True),
    LoopStage("speculate_selects", stage_speculate_selects, optional=True),
    LoopStage("pack_arena", stage_pack_arena),
    LoopStage("assign_slots", stage_assign_slots),
]


# --- stage bodies that live nowhere else ------------------------------------------------


def hoist_bounds_checks(program: L.Program) -> L.Program:
    """Move every top-level ``CheckBounds`` of an index buffer the program never writes
    (an input or a constant) into a first kernel, so a bad index fails the step before
    any kernel runs (state untouched). Checks of computed indices stay where they are."""
    written = set().union(*(L.writes(k.body) for k in program.kernels))
    hoisted: list[L.Stmt] = []
    for kernel in program.kernels:
        keep: list[L.Stmt] = []
        for s in kernel.body:
            movable = isinstance(s, L.CheckBounds) and s.buffer not in written
            (hoisted if movable else keep).append(s)
        kernel.body = tuple(keep)
    if hoisted:
        size = sum(s.size for s in hoisted if isinstance(s, L.CheckBounds))
        checks = L.Kernel("k_checks", tuple(hoisted), size, "bounds checks of input indices")
        program.kernels = [checks, *(k for k in program.kernels if k.body)]
    return program


def assign_slots(program: L.Program) -> L.Program:
    """Number the I/O table: inputs (graph order), then outputs, then constants."""
    buffers = program.buffers
    order = list(dict.fromkeys(program.inputs))
    order += [b.name for b in buffers.values() if b.kind == "output"]
    order += [b.name for b in buffers.values() if b.kind == "const"]
    for slot, name in enumerate(order):
        buffers[name] = replace(buffers[name], slot=slot)
    program.n_slots = len(order)
    return program


# --- the driver ---------------------------------------------------------------------------

StageHook = Callable[[str, str], None]


def lower_program(
    graph: Graph,
    target: Target,
    name: str = "fn",
    on_stage: StageHook | None = None,
    pipeline: list[LoopStage] | None = None,
) -> tuple[L.Program, list[LoopStageStat]]:
    """Run the loop pipeline on ``graph`` for ``target``.

    Args:
        graph: an optimized graph (``compiler.passes.optimize``).
        target: the backend's lowering policy.
        name: the program's name.
        on_stage: called as ``on_stage(stage_name, text)`` after every stage that ran, with
            the printed fusion plan or program (see :func:`stage_dumper`).
        pipeline: the stage list (default ``LOOP_PIPELINE``).
    Returns:
        (the finished program, one :class:`LoopStageStat` per stage).
    """
    unit = LoopUnit(graph, target, name)
    stats: list[LoopStageStat] = []
    for stage in pipeline if pipeline is not None else LOOP_PIPELINE:
        skipped = stage.optional and not target.runs(stage.name)
        t0 = time.perf_counter()
        if not skipped:
            unit = stage.run(unit)
        seconds = time.perf_counter() - t0
        program = unit.program
        stats.append(
            LoopStageStat(
                stage.name,
                seconds,
                skipped,
                len(program.kernels) if program else 0,
                len(program.buffers) if program else 0,
                program.arena_bytes if program else 0,
            )
        )
        if on_stage is not None and not skipped:
            on_stage(stage.name, _describe(unit))
    return unit.built(), stats


def _describe(unit: LoopUnit) -> str:
    if unit.program is not None:
        return unit.program.format()
    if unit.plan is None:  # a graph stage
        return unit.graph.format()
    return format_plan(unit.graph, unit.plan)


def format_plan(graph: Graph, plan: FusionPlan) -> str:
    """The fusion plan as text: each node's fate (buffer, inline, or epilogue of a root)."""
    lines = [f"fusion plan  # {len(plan.materialized)} materialized of {len(graph.nodes())} nodes"]
    for node in graph.nodes():
        nid = f"{node.prim.value}%{local_id(graph, node)}"
        if node.id in plan.fused_roots:
            root = plan.fused_roots[node.id]
            fate = f"buffer, epilogue of {root.prim.value}%{local_id(graph, root)}"
        elif node.id in plan.epilogue_of:
            fate = "computed inside its epilogue's kernel"
        elif node.id in plan.materialized:
            fate = "buffer"
        else:
            fate = f"inline (cost {plan.cost.get(node.id, 0)})"
        lines.append(f"  {nid}: {fate}")
    return "\n".join(lines)


def stage_dumper(folder: str, name: str) -> StageHook:
    """An ``on_stage`` hook writing ``<folder>/<name>.loopNN_<stage>.txt`` atomically."""
    counter = [0]

    def dump(stage: str, text: str) -> None:
        write_dump(folder, f"{name}.loop{counter[0]:02d}_{stage}.txt", text + "\n")
        counter[0] += 1

    return dump


def dump_program(folder: str, name: str, program: L.Program, source: str, suffix: str) -> None:
    """The final program (``<name>.loops.txt``) and its generated source (``<name><suffix>``)."""
    write_dump(folder, name + ".loops.txt", program.format() + "\n")
    write_dump(folder, name + suffix, source)
