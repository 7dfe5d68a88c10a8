"""Loop IR, fusion and memory planning: structure tests on real traced graphs.

Values are checked elsewhere (tests/test_ops.py in "c" mode, test_c_backend.py);
here we check the decisions: what is inlined, what is a kernel root, where
buffers live, and that index arithmetic simplifies the way renderers rely on.
"""

from __future__ import annotations

import numpy as np

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.fusion import plan_fusion
from shapegrad.compiler.memory import buffers_read, buffers_written
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import C_TARGET
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim


def _graph(fn, *args, **kw) -> Graph:  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy", **kw).graph(*args)


def _lower(graph: Graph, **target_changes: object) -> L.Program:
    return lower_program(graph, C_TARGET.replace(**target_changes))[0]


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- index expressions -----------------------------------------------------------------


def test_flatten_unflatten_round_trip_is_exact_for_loop_variables() -> None:
    i, j, k = L.Var("i", 3), L.Var("j", 4), L.Var("k", 5)
    index = (L.var(i), L.var(j), L.var(k))
    flat = L.flatten(index, (3, 4, 5))
    assert flat == L.var(i) * 20 + L.var(j) * 5 + L.var(k)
    assert L.unflatten(flat, (3, 4, 5)) == index
    # regrouping [3,4,5] as [12,5] keeps everything affine
    assert L.unflatten(flat, (12, 5)) == (L.var(i) * 4 + L.var(j), L.var(k))


def test_div_mod_stay_when_ranges_do_not_allow_simplification() -> None:
    v = L.Var("v", 60)
    q = L.floordiv(L.var(v), 5)
    r = L.mod(L.var(v), 5)
    assert any(isinstance(a, L.DivMod) for a in q.atoms())
    assert any(isinstance(a, L.DivMod) for a in r.atoms())
    for value in range(60):  # evaluate by substituting the range bounds trick: brute force
        assert value // 5 * 5 + value % 5 == value
    assert q.bounds() == (0, 11) and r.bounds() == (0, 4)


# --- fusion ----------------------------------------------------------------------------


def test_matmul_bias_relu_is_one_kernel_with_epilogue() -> None:
    g = _graph(lambda x, w, b: sg.relu(x @ w + b), _f32(4, 3), _f32(3, 5), _f32(5))
    plan = plan_fusion(g)
    (einsum,) = [n for n in g.nodes() if n.prim is Prim.EINSUM]
    assert einsum.id in plan.epilogue_of and einsum.id not in plan.materialized
    program = _lower(g, contract_min_macs=10**9)
    (kernel,) = program.kernels
    assert "add" in " ".join(kernel.inlined) and "maximum" in " ".join(kernel.inlined)
    assert "inlined:" in program.format()


def test_epilogue_after_blas_contract_stays_in_the_same_kernel() -> None:
    g = _graph(lambda x, w, b: sg.relu(x @ w + b), _f32(4, 3), _f32(3, 5), _f32(5))
    (kernel,) = _lower(g, contract_min_macs=0).kernels
    kinds = [type(s).__name__ for s in kernel.body]
    assert kinds == ["Contract", "Loop"]


def test_shared_expensive_value_is_materialized_cheap_one_recomputed() -> None:
    def f(x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        e = sg.exp(x)
        a = x * 2.0
        return e.sum() + (e * 3.0).sum(), (a + 1.0) * (a - 1.0)

    g = _graph(f, _f32(8))
    plan = plan_fusion(g)
    exp = next(n for n in g.nodes() if n.prim is Prim.EXP)
    mul2 = next(n for n in g.nodes() if n.prim is Prim.MUL and n.id not in plan.materialized)
    assert exp.id in plan.materialized
    assert mul2.id not in plan.materialized


def test_nontrivial_einsum_operand_is_materialized_views_are_not() -> None:
    g = _graph(lambda x, w: sg.exp(x) @ w.T, _f32(4, 3), _f32(5, 3))
    plan = plan_fusion(g)
    exp = next(n for n in g.nodes() if n.prim is Prim.EXP)
    permute = [n for n in g.nodes() if n.prim is Prim.PERMUTE]
    assert exp.id in plan.materialized
    assert all(p.id not in plan.materialized for p in permute)


def test_layout_ops_are_index_maps_not_copies() -> None:
    def f(x: sg.Tensor) -> sg.Tensor:
        return (x.T.reshape((6, 2))[1:5] * 2.0).sum()

    g = _graph(f, _f32(3, 4))
    program = _lower(g)
    (kernel,) = program.kernels  # transpose/reshape/slice all inlined into the sum
    loads = list(L.loads_in(kernel.body))
    assert {ld.buffer for ld in loads} == {program.inputs[0]}


# --- memory ----------------------------------------------------------------------------


def test_arena_reuses_dead_temps() -> None:
    def f(x: sg.Tensor) -> sg.Tensor:
        for _ in range(6):
            x = sg.exp(x) @ sg.tanh(x)  # each step materializes two temps that die quickly
        return x

    g = _graph(f, _f32(16, 16))
    program = _lower(g)
    temps = [b for b in program.buffers.values() if b.kind == "temp"]
    total = sum(b.size * 4 for b in temps)
    assert len(temps) >= 6
    assert program.arena_bytes < total / 2


def test_live_temps_never_overlap() -> None:
    def f(x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        a, b = sg.exp(x), sg.tanh(y)
        return (a @ b) @ (sg.exp(a) @ b)

    program = _lower(_graph(f, _f32(8, 8), _f32(8, 8, seed=1)))
    span: dict[str, tuple[int, int]] = {}
    for n, k in enumerate(program.kernels):
        for name in buffers_read(k) | buffers_written(k):
            lo, _ = span.get(name, (n, n))
            span[name] = (lo, n)
    temps = [b for b in program.buffers.values() if b.kind == "temp"]
    for a in temps:
        for b in temps:
            if a.name >= b.name:
                continue
            (a0, a1), (b0, b1) = span[a.name], span[b.name]
            if a1 < b0 or b1 < a0:
                continue
            assert a.offset + a.size * 4 <= b.offset or b.offset + b.size * 4 <= a.offset


def test_sgd_update_is_written_in_place_into_the_parameter_buffer() -> None:
    def step(w: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        loss, g = sg.value_and_grad(lambda w: ((x @ w) ** 2).sum())(w)
        return w - 0.1 * g, loss

    g = _graph(step, _f32(3, 2), _f32(4, 3), donate_argnums=0)
    assert g.aliases
    program = _lower(g)
    (k_out, i_in) = g.aliases[0]
    state = program.inputs[i_in]
    assert program.outputs[k_out] == state
    writers = [k for k in program.kernels if state in buffers_written(k)]
    assert len(writers) == 1 and not writers[0].root.startswith("copy")
    assert writers[0] is program.kernels[-1]
