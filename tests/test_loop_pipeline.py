"""The loop pipeline: each stage on its own (input program -> output program), targets
switching stages off, the dumps, the visitor, the renderer's coverage of the IR, and the
error-flag contract in K-step runs."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c.render import CRenderer, render_c
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import (
    LOOP_PIPELINE,
    LoopUnit,
    assign_slots,
    hoist_bounds_checks,
    lower_program,
    stage_build_kernels,
    stage_plan_fusion,
)
from shapegrad.compiler.target import C_TARGET, Target
from shapegrad.dtypes import float32, int32
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _graph(fn, *args, **kw) -> Graph:  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy", **kw).graph(*args)


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _built(graph: Graph, target: Target = C_TARGET) -> L.Program:
    """The program right after build_kernels (no later stage has run)."""
    unit = stage_build_kernels(stage_plan_fusion(LoopUnit(graph, target, "t")))
    return unit.built()


def _stmts(program: L.Program) -> list[L.Stmt]:
    return [s for k in program.kernels for s in L.walk(k.body)]


# --- the pipeline as data ------------------------------------------------------------------


def test_pipeline_is_an_ordered_list_of_named_stages() -> None:
    names = [s.name for s in LOOP_PIPELINE]
    assert names == [
        "choose_conv_algorithm",
        "permute_product_outputs",
        "widen_library_products",
        "plan_fusion",
        "build_kernels",
        "schedule_outputs_early",
        "fuse_batch_producers",
        "hoist_bounds_checks",
        "place_state_updates",
        "forward_output_copies",
        "overlap_collectives",
        "fuse_elementwise_kernels",
        "fuse_row_kernels",
        "collapse_loops",
        "split_index_sets",
        "speculate_selects",
        "pack_arena",
        "assign_slots",
    ]
    assert {s.name for s in LOOP_PIPELINE if s.optional} == {
        "permute_product_outputs",
        "schedule_outputs_early",
        "fuse_batch_producers",
        "hoist_bounds_checks",
        "overlap_collectives",
        "fuse_elementwise_kernels",
        "fuse_row_kernels",
        "collapse_loops",
        "split_index_sets",
        "speculate_selects",
    }


def test_stats_record_every_stage_and_skips() -> None:
    g = _graph(lambda x: sg.exp(x).sum(), _f32(8))
    target = C_TARGET.replace(batch_fusion=False)
    program, stats = lower_program(g, target)
    assert [s.stage for s in stats] == [s.name for s in LOOP_PIPELINE]
    skipped = {s.stage for s in stats if s.skipped}
    assert skipped == {"fuse_batch_producers"}
    assert stats[-1].kernels == len(program.kernels)
    assert stats[-1].arena_bytes == program.arena_bytes


def test_target_rejects_unknown_policies() -> None:
    with pytest.raises(ValueError, match="reduction"):
        Target("x", reduction="random")
    with pytest.raises(ValueError, match="alignment"):
        Target("x", alignment=48)


# --- one test per stage ------------------------------------------------------------------


def test_plan_fusion_stage_reads_the_target() -> None:
    g = _graph(lambda x, w, b: sg.relu(x @ w + b), _f32(4, 3), _f32(3, 5), _f32(5))
    fused = stage_plan_fusion(LoopUnit(g, C_TARGET, "t")).plan
    plain = stage_plan_fusion(LoopUnit(g, C_TARGET.replace(fuse_epilogues=False), "t")).plan
    assert fused is not None and plain is not None
    assert len(fused.epilogue_of) == 1 and not plain.epilogue_of


def test_build_kernels_reductions_are_reduce_statements() -> None:
    program = _built(
        _graph(lambda x: (x * 2.0).sum(axis=1), _f32(4, 64)), C_TARGET.replace(row_form=False)
    )
    reduces = [s for s in _stmts(program) if isinstance(s, L.Reduce)]
    assert len(reduces) == 1 and reduces[0].op == "add" and reduces[0].vars[0].extent == 64
    # a full reduction to a scalar (the loss mean) is one Reduce a renderer may run as a tree
    program = _built(_graph(lambda x: x.mean(), _f32(1000)))
    (reduce,) = [s for s in _stmts(program) if isinstance(s, L.Reduce)]
    assert [v.extent for v in reduce.vars] == [1000]


def test_build_kernels_contraction_threshold_and_dtypes_come_from_the_target() -> None:
    g = _graph(lambda a, b: a @ b, _f32(8, 8), _f32(8, 8))
    assert not any(isinstance(s, L.Contract) for s in _stmts(_built(g)))  # 512 MACs < 4096
    small = C_TARGET.replace(contract_min_macs=1)
    assert any(isinstance(s, L.Contract) for s in _stmts(_built(g, small)))
    no_f32 = small.replace(contract_dtypes=frozenset({"float64"}))
    assert not any(isinstance(s, L.Contract) for s in _stmts(_built(g, no_f32)))


def test_build_kernels_scatter_stores_are_commutative_and_indices_checked() -> None:
    def f(table: sg.Tensor, idx: sg.Tensor) -> sg.Tensor:
        return sg.grad(lambda t: (sg.take(t, idx, axis=0) ** 2).sum())(table)

    idx = np.array([0, 2, 2, 1], np.int32)
    program = _built(_graph(f, _f32(3, 4), idx))
    scatters = [s for s in _stmts(program) if isinstance(s, L.Store) and s.accumulate]
    assert scatters and all(s.commutative for s in scatters)
    checks = [s for s in _stmts(program) if isinstance(s, L.CheckBounds)]
    assert checks and all(c.code in program.errors for c in checks)
    assert all("out of range [-3, 3)" in program.errors[c.code] for c in checks)


def test_fuse_batch_producers_stage_and_its_switch() -> None:
    def conv(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return sg.conv2d(x, w, padding=1).sum()

    g = _graph(conv, _f32(8, 4, 3, 3), _f32(64, 4, 16, 16))
    on = lower_program(g, C_TARGET)[0]
    off = lower_program(g, C_TARGET.replace(batch_fusion=False))[0]
    assert any(isinstance(s, L.BatchFused) for s in _stmts(on))
    assert not any(isinstance(s, L.BatchFused) for s in _stmts(off))
    assert on.arena_bytes < off.arena_bytes  # the patch buffer is gone


def test_hoist_bounds_checks_moves_input_checks_first_only() -> None:
    def f(table: sg.Tensor, idx: sg.Tensor) -> sg.Tensor:
        computed = sg.minimum(idx, 4)  # an index computed inside the program
        return sg.take(sg.exp(table), idx, axis=0).sum() + sg.take(table, computed, axis=0).sum()

    program = _built(_graph(f, _f32(5, 3), np.array([1, 4], np.int32)))
    before = [s for s in _stmts(program) if isinstance(s, L.CheckBounds)]
    assert len(before) == 2
    hoist_bounds_checks(program)
    first = program.kernels[0]
    assert first.name == "k_checks"
    (hoisted,) = first.body
    assert isinstance(hoisted, L.CheckBounds) and hoisted.buffer == program.inputs[1]
    later = [s for k in program.kernels[1:] for s in L.walk(k.body) if isinstance(s, L.CheckBounds)]
    assert len(later) == 1 and later[0].buffer != program.inputs[1]


def test_pack_arena_uses_the_target_alignment() -> None:
    g = _graph(lambda x: sg.exp(sg.exp(x) @ x) @ x, _f32(5, 5))
    program = lower_program(g, C_TARGET.replace(alignment=256, contract_min_macs=1))[0]
    temps = [b for b in program.buffers.values() if b.kind == "temp"]
    assert temps and all(b.offset % 256 == 0 for b in temps)


def test_assign_slots_numbers_inputs_outputs_then_constants() -> None:
    const = _f32(4, seed=9)
    program = _built(_graph(lambda x: (x * const, x + 1.0), _f32(4)))
    assign_slots(program)
    kinds = {b.slot: b.kind for b in program.buffers.values() if b.slot >= 0}
    order = [kinds[s] for s in range(program.n_slots)]
    assert order == sorted(order, key=["input", "state", "output", "const"].index)
    assert program.n_slots == len(order) and "const" in order


def test_debug_dump_shows_every_loop_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path))
    fn = sg.compile(lambda x: sg.exp(x).sum(), backend="c", name="dumped")
    fn(sg.tensor(_f32(8)))
    files = sorted(os.listdir(next(tmp_path.iterdir())))
    stages = [m.group(1) for f in files if (m := re.fullmatch(r"dumped\.loop\d\d_(\w+)\.txt", f))]
    ran = [s.name for s in LOOP_PIPELINE if s.name != "fuse_batch_producers"]
    assert [s for s in stages if s != "fuse_batch_producers"] == ran
    assert "dumped.c" in files and "dumped.loops.txt" in files
    # the threading plan the renderer printed (backends/c/schedule.py)
    plan = (next(tmp_path.iterdir()) / "dumped.schedule.txt").read_text()
    assert plan.startswith("sg_body: fork mode: ") and "k0: serial" in plan


# --- the visitor -----------------------------------------------------------------------------


def _batch_fused() -> L.BatchFused:
    b, r = L.Var("b", 2), L.Var("r", 4)
    producer = (
        L.Loop(
            b,
            "parallel",
            (
                L.Loop(
                    r,
                    "parallel",
                    (L.Store("s", L.var(r), L.Load(float32, "x", L.var(b) * 4 + L.var(r))),),
                ),
            ),
        ),
    )
    contract = L.Contract("s", "w", "y", 2, 2, 2, False, False, 2, 2, 0, 0, 2, 4, 0, 4, float32)
    return L.BatchFused(producer, contract, "a", "s", 4, 2)


def test_visitor_sees_inside_batch_fused_and_products() -> None:
    body = (_batch_fused(),)
    assert {type(s).__name__ for s in L.walk(body)} >= {"BatchFused", "Loop", "Store", "Contract"}
    assert L.reads(body) == {"x", "s", "w"}
    assert L.writes(body) == {"s", "y"}
    renamed = L.rename_buffers(body, lambda n: n.upper())
    assert L.reads(renamed) == {"X", "S", "W"} and L.writes(renamed) == {"S", "Y"}


def test_map_expr_is_bottom_up() -> None:
    x = L.Load(float32, "x", L.const(0))
    e = L.Binary(float32, "add", L.Unary(float32, "neg", x), L.Const(float32, 1.0))
    seen: list[str] = []

    def visit(node: L.Expr) -> L.Expr:
        seen.append(type(node).__name__)
        return node

    assert L.map_expr(e, visit) == e
    assert seen == ["Load", "Unary", "Const", "Binary"]


# --- renderers -------------------------------------------------------------------------------


def test_c_renderer_has_a_rule_for_every_statement() -> None:
    i = L.Var("i", 4)
    x = L.Load(float32, "x", L.var(i))
    samples: list[L.Stmt] = [
        L.Loop(i, "parallel", (L.Store("y", L.var(i), x),)),
        L.Block("i = 2", (L.Store("y", L.const(2), x),)),
        L.Store("y", L.const(0), x, "add", commutative=True),
        L.Reduce("acc", "max", L.Const(float32, -np.inf), (i,), x),
        L.Local("row", float32, 4),
        L.IndexLoad(L.Var("g", 3), "ix", L.const(0)),
        L.CheckBounds("ix", 4, 3, 1),
        _batch_fused().contract,
        _batch_fused(),
        L.Collective("all_reduce", "x", "y", 4, float32, 0, "sum", 1, 2),
        L.LayerLoop(L.Program("body", {}, []), 3, True, (L.LayerSlot("y", 0, 4, True),), "ar"),
        L.SortRow("x", L.var(i) * 5, 1, 5, "ix", L.var(i) * 2, 1, 2, "w", L.var(i) * 10,
                  float32, True, "merge"),
    ]
    assert {type(s) for s in samples} == set(L.stmt_types())
    renderer = CRenderer(L.Program("p", {}, []))
    for s in samples:
        renderer.stmt(s, 1, parallel_ok=False)
    text = "\n".join(renderer.lines)
    assert "return 1;" in text and "sg_maxf(acc, x[" in text and "sgemm" in text
    assert "{ /* i = 2 */" in text and "y[2] = x[i];" in text
    assert "{ /* i = 2 */" in text and "y[2] = x[i];" in text
    assert "sg_mpi_allreduce(x, y, 4," in text and "sg_rank != 1" in text
    assert "sg_layer0(sg_sub, (char *)ar)" in text and len(renderer.functions) == 1
    assert "argsort (merge, descending): 2 of 5 positions" in text and "ix[2 * i + 1 * sg_t]" in text


def test_negative_constants_render_parenthesised() -> None:
    program = _built(_graph(lambda x: -sg.pad(x, 1, constant_values=-2.0), _f32(3)))
    source = render_c(assign_slots(program))
    assert "--" not in source.replace("/*--", "")


def test_function_names_cannot_escape_the_c_comment() -> None:
    program = _built(_graph(lambda x: x + 1.0, _f32(3)))
    program.name = "evil */ int x = 1; /*"
    source = render_c(assign_slots(program))
    assert "*/ int x" not in source


# --- the error-flag contract in K-step runs ------------------------------------------------


@needs_cc
def test_out_of_range_gather_in_k_steps_names_the_step_and_keeps_earlier_steps() -> None:
    def step(table: sg.Tensor, idx: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        loss, g = sg.value_and_grad(lambda t: (sg.take(t, idx, axis=0) ** 2).sum())(table)
        return table - 0.1 * g, loss

    table = _f32(5, 3)
    good = np.array([[0, 4], [1, 2], [3, 3], [2, 0]], np.int32)
    bad = good.copy()
    bad[2, 1] = 7  # step 2 of 4 is out of range
    exe = sg.compile(step, backend="c", donate_argnums=0).lower(table, good[0]).executable
    reference = exe.bind([table])
    reference.run_steps(good[:2])
    expected_state = reference.state[0].copy()  # after steps 0 and 1

    bound = exe.bind([table])
    with pytest.raises(
        IndexError, match=r"at step 2 of 4 \(steps 0\.\.1 were applied, step 2 changed nothing\)"
    ):
        bound.run_steps(bad)
    np.testing.assert_array_equal(bound.state[0], expected_state)
    # the executable stays usable: the next good run continues from that state
    bound.run_steps(good[2:])
    reference.run_steps(good[2:])
    np.testing.assert_array_equal(bound.state[0], reference.state[0])


@needs_cc
def test_single_call_out_of_range_raises_and_changes_no_state() -> None:
    def step(table: sg.Tensor, idx: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return table * 0.5, sg.take(table, idx, axis=0).sum()

    table = _f32(4, 2)
    exe = (
        sg.compile(step, backend="c", donate_argnums=0)
        .lower(table, np.array([1], np.int32))
        .executable
    )
    bound = exe.bind([table])
    with pytest.raises(IndexError, match=r"gather index out of range \[-4, 4\)"):
        bound(np.array([9], np.int32))
    np.testing.assert_array_equal(bound.state[0], table)


def test_error_table_is_part_of_the_dump() -> None:
    program = _built(
        _graph(lambda t, i: sg.take(t, i, axis=0), _f32(3, 2), np.array([0], np.int32))
    )
    assert "error 1: gather index out of range [-3, 3)" in program.format()
    assert program.buffers[program.inputs[1]].dtype == int32
    assert any(
        n.prim is Prim.GATHER
        for n in _graph(
            lambda t, i: sg.take(t, i, axis=0), _f32(3, 2), np.array([0], np.int32)
        ).nodes()
    )
