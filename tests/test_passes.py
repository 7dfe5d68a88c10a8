"""Each optimizer pass: what it rewrites, and that random graphs evaluate the same after it."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.numpy_ref import NumpyExecutable
from shapegrad.compiler.passes import (
    PIPELINE,
    count_nodes,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_constants,
    optimize,
    simplify_algebra,
    splat_value,
)
from shapegrad.dtypes import int32
from shapegrad.ir import Graph, Node
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.prims import bind, constant
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.tensor import Tensor

F64 = sg.float64
SHAPE = (3, 4)


def trace(fn: Callable[..., Tensor | Sequence[Tensor]], *shapes: tuple[int, ...]) -> Graph:
    ops = GraphOps()
    xs = [ops.add_input(f"x{i}", AVal(s, F64)) for i, s in enumerate(shapes)]
    out = fn(*xs)
    return ops.to_graph(list(out) if isinstance(out, list | tuple) else [out])


def run(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    return NumpyExecutable(graph)(inputs)


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n.shape).astype(n.aval.dtype.numpy) for n in graph.inputs]


def assert_same_semantics(before: Graph, after: Graph, seeds: int = 3) -> None:
    assert [n.aval for n in before.outputs] == [n.aval for n in after.outputs]
    for seed in range(seeds):
        inputs = random_inputs(before, seed)
        for a, b in zip(run(before, inputs), run(after, inputs), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def prims_of(graph: Graph) -> list[Prim]:
    return [n.prim for n in graph.nodes() if n.prim is not Prim.INPUT]


# --- a generator of random graphs full of rewrite opportunities ------------------------


def _reshape_chain(x: Tensor) -> Tensor:
    y = bind(Prim.RESHAPE, [x], shape=(12,))
    y = bind(Prim.RESHAPE, [y], shape=(4, 3))
    return bind(Prim.RESHAPE, [y], shape=SHAPE)


def _permute_chain(x: Tensor) -> Tensor:
    y = bind(Prim.PERMUTE, [x], perm=(1, 0))
    return bind(Prim.PERMUTE, [sg.tanh(y)], perm=(1, 0))


def _broadcast_chain(x: Tensor) -> Tensor:
    row = x.sum(axis=0)  # [4]
    b1 = bind(Prim.BROADCAST, [row], shape=(3, 4), dims=(1,))
    b2 = bind(Prim.BROADCAST, [b1], shape=(2, 3, 4), dims=(1, 2))
    return bind(Prim.REDUCE_SUM, [b2], axes=(0,)) * 0.25


def _sum_of_broadcast(x: Tensor) -> Tensor:
    col = bind(Prim.RESHAPE, [x.sum(axis=1)], shape=(3, 1))
    wide = bind(Prim.BROADCAST, [col], shape=(5, 3, 4), dims=(1, 2))
    return bind(Prim.REDUCE_SUM, [wide], axes=(0, 2)).reshape(3, 1) + x


UNARY_GENERATORS: list[Callable[[Tensor], Tensor]] = [
    lambda x: x * 1.0,
    lambda x: 1.0 * x,
    lambda x: x + 0.0,
    lambda x: 0.0 + x,
    lambda x: x - 0.0,
    lambda x: 0.0 - x,
    lambda x: x / 1.0,
    lambda x: sg.neg(sg.neg(x)),
    lambda x: x * -1.0,
    lambda x: sg.neg(x * 3.0),
    lambda x: sg.neg(x) * 0.5,
    lambda x: x - x,
    lambda x: sg.tanh(x),
    lambda x: sg.stop_gradient(x),
    lambda x: x * (constant(2.0, F64, like=x) + constant(3.0, F64, like=x)),
    lambda x: sg.where(x > 0, x, x),
    _reshape_chain,
    _permute_chain,
    _broadcast_chain,
    _sum_of_broadcast,
]

BINARY_GENERATORS: list[Callable[[Tensor, Tensor], Tensor]] = [
    lambda a, b: a + b,
    lambda a, b: a - b,
    lambda a, b: sg.tanh(a * b),
    lambda a, b: a + (-b),
    lambda a, b: a - (-b),
    lambda a, b: sg.exp(a) + sg.exp(a),  # duplicate subexpressions
]


def random_graph(seed: int, steps: int = 25) -> Graph:
    rng = np.random.default_rng(seed)

    def body(x0: Tensor, x1: Tensor) -> list[Tensor]:
        pool = [x0, x1]
        for _ in range(steps):
            if rng.random() < 0.6:
                fn = UNARY_GENERATORS[rng.integers(len(UNARY_GENERATORS))]
                pool.append(fn(pool[rng.integers(len(pool))]))
            else:
                gn = BINARY_GENERATORS[rng.integers(len(BINARY_GENERATORS))]
                pool.append(gn(pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]))
        return pool[-3:]

    return trace(body, SHAPE, SHAPE)


@pytest.mark.parametrize("name_and_pass", PIPELINE, ids=[n for n, _ in PIPELINE])
@pytest.mark.parametrize("seed", range(12))
def test_each_pass_preserves_semantics_on_random_graphs(
    name_and_pass: tuple[str, Callable[[Graph], Graph]], seed: int
) -> None:
    graph = random_graph(seed)
    _, run_pass = name_and_pass
    after = run_pass(graph)
    assert after.inputs == graph.inputs
    assert_same_semantics(graph, after)


@pytest.mark.parametrize("seed", range(12))
def test_pipeline_preserves_semantics_and_never_grows(seed: int) -> None:
    graph = random_graph(seed)
    optimized, stats = optimize(graph)
    assert_same_semantics(graph, optimized)
    assert count_nodes(optimized) <= count_nodes(graph)
    assert stats[0].nodes_before == count_nodes(graph)
    assert stats[-1].nodes_after == count_nodes(optimized)


# --- targeted rewrites ---------------------------------------------------------------


def test_fold_constants_evaluates_constant_subgraphs() -> None:
    def fn(x: Tensor) -> Tensor:
        two, three = constant(2.0, F64, like=x), constant(3.0, F64, like=x)  # graph constants
        return x * sg.exp(two + three)

    graph = trace(fn, SHAPE)
    assert Prim.EXP in prims_of(graph)
    folded = fold_constants(graph)
    assert Prim.EXP not in prims_of(folded) and Prim.ADD not in prims_of(folded)
    values = [n.attr["value"].array for n in folded.nodes() if n.prim is Prim.CONSTANT]
    assert any(np.isclose(v, np.exp(5.0)).all() for v in values)
    assert_same_semantics(graph, folded)


def test_fold_constants_does_not_materialize_large_broadcasts() -> None:
    big = (512, 512)
    graph = trace(lambda x: x + sg.tensor(1.0, dtype=F64), big)
    folded = fold_constants(graph)
    constants = [n for n in folded.nodes() if n.prim is Prim.CONSTANT]
    assert all(n.attr["value"].array.size == 1 for n in constants)


@pytest.mark.parametrize(
    ("fn", "expect_prims"),
    [
        (lambda x: x * 1.0, []),
        (lambda x: 1.0 * x, []),
        (lambda x: x + 0.0, []),
        (lambda x: x - 0.0, []),
        (lambda x: x / 1.0, []),
        (lambda x: sg.neg(sg.neg(x)), []),
        (lambda x: sg.stop_gradient(x), []),
        (lambda x: 0.0 - x, [Prim.NEG]),
        (lambda x: x * -1.0, [Prim.NEG]),
        (lambda x: sg.where(x > 0, x, x), []),
        (_reshape_chain, []),
        (lambda x: bind(Prim.PERMUTE, [bind(Prim.PERMUTE, [x], perm=(1, 0))], perm=(1, 0)), []),
    ],
)
def test_simplify_removes_identities(
    fn: Callable[[Tensor], Tensor], expect_prims: list[Prim]
) -> None:
    graph = trace(fn, SHAPE)
    simplified = simplify_algebra(graph)
    assert prims_of(simplified) == expect_prims
    assert_same_semantics(graph, simplified)


@pytest.mark.parametrize(
    "fn", [lambda x: sg.neg(x * 2.0), lambda x: sg.neg(2.0 * x), lambda x: sg.neg(x) * 2.0]
)
def test_simplify_folds_negation_into_a_constant_scale(fn: Callable[[Tensor], Tensor]) -> None:
    graph = trace(fn, SHAPE)
    simplified = simplify_algebra(graph)
    assert Prim.NEG not in prims_of(simplified)
    (mul,) = [n for n in simplified.nodes() if n.prim is Prim.MUL]
    assert splat_value(mul.inputs[1]) == -2.0
    assert_same_semantics(graph, simplified)


def test_simplify_x_minus_x_is_a_zero_splat_for_integers_only() -> None:
    ops = GraphOps()
    x = ops.add_input("x0", AVal(SHAPE, int32))
    simplified = simplify_algebra(ops.to_graph([x - x]))
    assert Prim.SUB not in prims_of(simplified)
    # For floats NaN - NaN and inf - inf are NaN, not 0 (found by tests/test_fuzz.py).
    graph = trace(lambda x: x - x, SHAPE)
    simplified = simplify_algebra(graph)
    assert Prim.SUB in prims_of(simplified)
    x_bad = np.array([[np.nan, np.inf, -np.inf, 1.0]] * 3)
    assert np.isnan(run(simplified, [x_bad])[0][:, :3]).all()


def test_simplify_merges_broadcast_of_broadcast() -> None:
    def fn(x: Tensor) -> Tensor:
        b1 = bind(Prim.BROADCAST, [x], shape=(3, 4), dims=(1,))
        return bind(Prim.BROADCAST, [b1], shape=(2, 3, 4), dims=(1, 2))

    graph = trace(fn, (4,))
    simplified = simplify_algebra(graph)
    (node,) = [n for n in simplified.nodes() if n.prim is not Prim.INPUT]
    assert node.prim is Prim.BROADCAST and node.attr["dims"] == (2,)
    assert_same_semantics(graph, simplified)


def test_simplify_sum_of_broadcast_becomes_a_scale() -> None:
    def fn(x: Tensor) -> Tensor:
        wide = bind(Prim.BROADCAST, [x], shape=(5, 3, 4), dims=(1, 2))
        return bind(Prim.REDUCE_SUM, [wide], axes=(0,))

    graph = trace(fn, SHAPE)
    simplified = simplify_algebra(graph)
    assert Prim.REDUCE_SUM not in prims_of(simplified)
    assert Prim.MUL in prims_of(simplified)
    assert_same_semantics(graph, simplified)


def test_simplify_sum_over_expanded_unit_axis() -> None:
    graph = trace(_sum_of_broadcast, SHAPE)
    simplified = simplify_algebra(graph)
    sums = [n for n in simplified.nodes() if n.prim is Prim.REDUCE_SUM]
    assert len(sums) == 1  # only the x.sum(axis=1) of the input remains
    assert_same_semantics(graph, simplified)


def test_simplify_runs_elementwise_ops_before_broadcasting() -> None:
    graph = trace(lambda v: sg.exp(bind(Prim.BROADCAST, [v], shape=(3, 4), dims=(1,))), (4,))
    simplified = simplify_algebra(graph)
    exp_node = next(n for n in simplified.nodes() if n.prim is Prim.EXP)
    assert exp_node.shape == (4,)
    assert_same_semantics(graph, simplified)


def _duplicated_graph() -> tuple[Graph, Node]:
    ops = GraphOps()
    x = ops.add_input("x", AVal(SHAPE, F64))._payload
    aval = x.aval
    # Built without the hash-consing table: two structurally equal exp nodes.
    e1 = Node(Prim.EXP, (x,), (), aval)
    e2 = Node(Prim.EXP, (x,), (), aval)
    s = Node(Prim.ADD, (e1, e2), (), aval)
    return Graph([x], [s]), x


def test_cse_merges_structurally_equal_nodes() -> None:
    graph, _ = _duplicated_graph()
    assert prims_of(graph).count(Prim.EXP) == 2
    merged = eliminate_common_subexpressions(graph)
    assert prims_of(merged).count(Prim.EXP) == 1
    add = merged.outputs[0]
    assert add.inputs[0] is add.inputs[1]
    assert_same_semantics(graph, merged)


def test_dce_drops_dead_nodes_from_the_table_but_keeps_inputs() -> None:
    def fn(x: Tensor, unused: Tensor) -> Tensor:
        _dead = sg.exp(x) * 3.0
        return sg.tanh(x)

    graph = trace(fn, SHAPE, SHAPE)
    live = graph.nodes()
    assert len(graph.table.table) > len(live)
    pruned = eliminate_dead_code(graph)
    assert len(pruned.table.table) == count_nodes(pruned) == 1
    assert len(pruned.inputs) == 2
    assert_same_semantics(graph, pruned)


def test_optimize_reaches_a_fixed_point_and_reports_stats() -> None:
    graph = random_graph(3)
    optimized, stats = optimize(graph)
    names = [s.name for s in stats]
    assert names[: len(PIPELINE)] == [n for n, _ in PIPELINE]
    last_round = [s for s in stats if s.round == stats[-1].round]
    assert all(s.nodes_before == s.nodes_after for s in last_round)
    again, _ = optimize(optimized)
    assert again.format() == optimized.format()
    assert "fold_constants" in str(stats[0])


def test_rewrite_keeps_outputs_that_are_inputs() -> None:
    graph = trace(lambda x, y: (x * 1.0, y), SHAPE, SHAPE)
    optimized, _ = optimize(graph)
    assert optimized.outputs == optimized.inputs
    assert_same_semantics(graph, optimized)
