"""The collapse_loops stage: which nests become one loop (the IR), and compiled values with
and without it against NumPy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.collapse import collapse_loops, collapse_reduce
from shapegrad.compiler.target import C_TARGET, CUDA_TARGET
from shapegrad.dtypes import bool_, float32

# --- the IR --------------------------------------------------------------------------------

OUT, IN, MID = L.Var("i", 4), L.Var("j", 6), L.Var("h", 5)


def _v(v: L.Var, c: int = 1) -> L.Affine:
    return L.var(v) * c


def _load(index: L.Affine, buffer: str = "x") -> L.Load:
    return L.Load(float32, buffer, index)


def _nest(body: tuple[L.Stmt, ...], *vs: L.Var, kind: str = "parallel") -> L.Loop:
    stmt: L.Stmt = L.Loop(vs[-1], kind, body)
    for v in reversed(vs[:-1]):
        stmt = L.Loop(v, kind, (stmt,))
    assert isinstance(stmt, L.Loop)
    return stmt


def _run(*body: L.Stmt) -> tuple[L.Stmt, ...]:
    program = L.Program("p", {}, [L.Kernel("k", tuple(body), 1, "test")])
    collapse_loops(program, C_TARGET)
    return program.kernels[0].body


def _loops(body: tuple[L.Stmt, ...]) -> list[tuple[str, int]]:
    return [(s.var.name, s.var.extent) for s in L.walk(body) if isinstance(s, L.Loop)]


def _flat(store_index: L.Affine, value: L.Expr) -> L.Loop:
    return _nest((L.Store("out", store_index, value),), OUT, IN)


def test_lined_up_pair_becomes_one_loop_over_the_product() -> None:
    row = _v(OUT, 6) + _v(IN)
    body = _run(_flat(row, L.Binary(float32, "mul", _load(row), _load(row + 24, "y"))))
    assert _loops(body) == [("i_j", 24)]
    k = L.var(L.Var("i_j", 24))
    store = body[0].body[0]  # type: ignore[attr-defined]
    assert store == L.Store("out", k, L.Binary(float32, "mul", _load(k), _load(k + 24, "y")))


def test_three_levels_collapse_and_unrelated_indices_stay() -> None:
    index = _v(MID, 24) + _v(OUT, 6) + _v(IN)
    value = L.Binary(float32, "add", _load(index), _load(L.const(3), "bias"))
    body = _run(_nest((L.Store("out", index * 2, value),), MID, OUT, IN))
    assert _loops(body) == [("h_i_j", 120)]


@pytest.mark.parametrize(
    "index",
    [
        _v(OUT) + _v(IN, 4),  # a transpose
        _v(OUT, 12) + _v(IN),  # a strided slice (every other row)
        _v(OUT, 6) + _v(IN, 2),  # a stride along j
        _v(OUT),  # a broadcast along j (a per-row bias)
        L.floordiv(_v(OUT, 6) + _v(IN), 4),  # a div of the index
    ],
    ids=["transpose", "row_stride", "column_stride", "broadcast", "divmod"],
)
def test_indices_that_do_not_line_up_are_refused(index: L.Affine) -> None:
    row = _v(OUT, 6) + _v(IN)
    body = _run(_flat(row, _load(index)))
    assert _loops(body) == [("i", 4), ("j", 6)]


def test_a_range_test_on_the_variables_is_refused() -> None:
    row = _v(OUT, 6) + _v(IN)
    value = L.Select(float32, L.InRange(bool_, row + -1, 0, 24), _load(row), L.Const(float32, 0.0))
    assert _loops(_run(_flat(row, value))) == [("i", 4), ("j", 6)]


def test_refused_structures() -> None:
    row = _v(OUT, 6) + _v(IN)
    store = L.Store("out", row, _load(row))
    inner = L.Loop(IN, "parallel", (store,))
    row_sum = L.Store("rows", _v(OUT), L.Const(float32, 0.0))  # something per outer index
    cases = [
        L.Loop(OUT, "parallel", (row_sum, inner)),
        L.Loop(OUT, "reduction", (inner,)),  # kinds differ
        L.Loop(OUT, "parallel", (replace_stop(inner, 3),)),  # a segment
        L.Loop(OUT, "parallel", (L.Loop(IN, "parallel", (store, L.Local("s", float32, 4))),)),
    ]
    for nest in cases[:3]:
        assert ("i", 4) in _loops(_run(nest)), nest
    # a per-iteration scratch inside the inner body is private to (i, j) either way
    assert _loops(_run(cases[3])) == [("i_j", 24)]


def replace_stop(loop: L.Loop, stop: int) -> L.Loop:
    return L.Loop(loop.var, loop.kind, loop.body, 0, stop)


def test_reduction_over_both_loops_keeps_its_kind() -> None:
    store = L.Store("acc", L.const(0), _load(_v(OUT, 6) + _v(IN)), accumulate="add")
    body = _run(_nest((store,), OUT, IN, kind="reduction"))
    assert [(s.var.extent, s.kind) for s in body if isinstance(s, L.Loop)] == [(24, "reduction")]


def test_reduce_variables_merge_unless_summed_in_blocks() -> None:
    r, c = L.Var("r", 28), L.Var("c", 28)
    value = _load(_v(OUT, 784) + _v(r, 28) + _v(c))
    reduce = L.Reduce("acc", "add", L.Const(float32, 0.0), (r, c), value)
    merged = collapse_reduce(reduce, 1 << 14)
    assert [v.extent for v in merged.vars] == [784]
    assert merged.value == _load(_v(OUT, 784) + L.var(merged.vars[0]))
    assert collapse_reduce(reduce, 700) is reduce  # 784 terms: a blocked sum keeps its vars
    transposed = L.Reduce("acc", "add", reduce.init, (r, c), _load(_v(r) + _v(c, 28)))
    assert collapse_reduce(transposed, 1 << 14) is transposed


def test_cuda_skips_the_stage() -> None:
    assert C_TARGET.runs("collapse_loops")
    assert not CUDA_TARGET.runs("collapse_loops")


# --- compiled programs against NumPy -------------------------------------------------------

OFF = C_TARGET.replace(skip_stages=C_TARGET.skip_stages | {"collapse_loops"})
RNG = np.random.default_rng(7)
X = RNG.standard_normal((3, 4, 7, 6)).astype(np.float32)
G = RNG.standard_normal((3, 4, 7, 6)).astype(np.float32)
B = RNG.standard_normal(4).astype(np.float32)


def _bias_relu(x: Any, b: Any) -> Any:
    return sg.relu(x + b.reshape(1, 4, 1, 1))


def _masked_grad(x: Any, g: Any, b: Any) -> Any:
    """The CNN's ReLU-masked gradient: the mask of ``x + bias`` (a per-channel broadcast)."""
    return sg.where(x + b.reshape(1, 4, 1, 1) > 0, g, 0.0)


def _mean_hw(x: Any, b: Any) -> Any:
    return sg.relu(x + b.reshape(1, 4, 1, 1)).mean(axis=(2, 3))


def _every_other_row(x: Any, g: Any) -> Any:
    return x[:, :, ::2, :] * 2.0


def _transpose(x: Any, g: Any) -> Any:
    return sg.transpose(x, (0, 1, 3, 2)) + 1.0


CASES: list[tuple[str, Callable[..., Any], tuple[np.ndarray, ...], Callable[..., Any], bool]] = [
    ("bias_relu", _bias_relu, (X, B), lambda x, b: np.maximum(x + b[:, None, None], 0), True),
    (
        "masked_grad",
        _masked_grad,
        (X, G, B),
        lambda x, g, b: np.where(x + b[:, None, None] > 0, g, 0),
        True,
    ),
    (
        "mean_hw",
        _mean_hw,
        (X, B),
        lambda x, b: np.maximum(x + b[:, None, None], 0).mean(axis=(2, 3)),
        True,
    ),
    ("strided_slice", _every_other_row, (X, G), lambda x, g: x[:, :, ::2, :] * 2, False),
    ("transpose", _transpose, (X, G), lambda x, g: x.transpose(0, 1, 3, 2) + 1, False),
]


def _inner_joined(program: L.Program) -> bool:
    """Whether the innermost loop (or a reduction's last variable) runs over joined
    variables (named "i3_i4"): the image's rows and columns as one loop. Outer loops
    over whole contiguous images (batch and channel of a strided slice) may join anyway."""
    inner: list[str] = []
    for s in L.walk(s for k in program.kernels for s in k.body):
        if isinstance(s, L.Loop) and not any(isinstance(x, L.Loop) for x in s.body):
            inner.append(s.var.name)
        if isinstance(s, L.Reduce):
            inner.append(s.vars[-1].name)
    return any("_" in n for n in inner)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_compiled_values_with_and_without_the_stage(case: Any) -> None:
    name, fn, args, reference, collapses = case
    expected = reference(*(a.astype(np.float64) for a in args))
    results = []
    for target in (C_TARGET, OFF):
        compiled = sg.compile(fn, backend="c", target=target)
        program = compiled.lower(*args).program
        assert _inner_joined(program) == (collapses and target is C_TARGET), program.format()
        out = np.asarray(compiled(*args))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        results.append(out)
    if name != "mean_hw":  # elementwise: the same operations per element, bit for bit
        np.testing.assert_array_equal(results[0], results[1])


def test_batch_fused_nests_keep_their_outer_loop() -> None:
    bi = L.Var("b", 2)
    row = _v(OUT, 6) + _v(IN)
    nest = L.Loop(bi, "parallel", (_flat(row + _v(bi, 24), _load(row, "slice")),))
    contract = L.Contract(
        "a", "b", "slice", 4, 6, 3, False, False, 3, 6, 0, 0, 2, 12, 18, 24, float32
    )
    fused = L.BatchFused((), contract, "c", "slice", 24, 1, (nest,))
    (out,) = _run(fused)
    assert isinstance(out, L.BatchFused)
    assert _loops(out.consumer) == [("b", 2), ("i_j", 24)]


def test_a_kernel_subtracting_a_value_from_itself_keeps_its_loops_and_its_nans() -> None:
    """layer_norm over a size-1 axis computes x - x: collapsed, gcc folded it to 0 for
    inf/NaN (DESIGN debt 3); the stage leaves such kernels alone (fuzz seed 5008)."""
    x = np.array([1.0, np.inf, -np.inf, np.nan, 2.0, 3.0] * 4).reshape(4, 3, 2, 1)
    want = np.asarray(sg.layer_norm(sg.tensor(x)).numpy())
    got = np.asarray(sg.compile(sg.layer_norm, backend="c")(sg.tensor(x)).numpy())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], atol=0)
