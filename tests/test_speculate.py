"""``speculate_selects``: a select whose arms are safe to compute for every iteration is
marked (the C renderer computes both arms and blends, so the loop vectorizes); one whose
arm could read out of bounds, read at a data-dependent index or divide integers is not.
Values against NumPy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad.backends.c import generate
from shapegrad.compiler import loops as L
from shapegrad.compiler.speculate import speculate_selects
from shapegrad.dtypes import float32, int32

F32 = float32


def _program(value: Any, extra: tuple[L.Stmt, ...] = ()) -> L.Program:
    """``out[i] = value(i)`` for i in 0..8 over ``x: float32[8]``, ``k: int32[8]``."""
    i = L.Var("i", 8)
    store = L.Store("out", L.var(i), value(i))
    buffers = {
        "x": L.BufferSpec("x", F32, 8, "input"),
        "k": L.BufferSpec("k", int32, 8, "input"),
        "out": L.BufferSpec("out", F32, 8, "output"),
    }
    kernel = L.Kernel("k0", (L.Loop(i, "parallel", (*extra, store)),), 8, "where")
    return L.Program("p", buffers, [kernel], inputs=["x", "k"], outputs=["out"])


def _selects(program: L.Program) -> list[L.Select]:
    found: list[L.Select] = []

    def visit(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Select):
            found.append(e)
        return e

    for kernel in program.kernels:
        L.map_body(kernel.body, visit)
    return found


def _below(i: L.Var, n: int) -> L.Expr:
    return L.Binary(sg.bool_, "lt", L.IndexValue(int32, L.var(i)), L.Const(int32, n))


def test_a_select_of_in_bounds_loads_is_speculated() -> None:
    def value(i: L.Var) -> L.Expr:
        arm = L.Binary(F32, "div", L.Load(F32, "x", L.var(i)), L.Load(F32, "x", L.const(0)))
        return L.Select(F32, _below(i, 4), arm, L.Const(F32, 0.0))

    (select,) = _selects(speculate_selects(_program(value)))
    assert select.speculate


@pytest.mark.parametrize("case", ["out_of_bounds", "integer_division", "float_to_int"])
def test_unsafe_arms_are_not_speculated(case: str) -> None:
    def value(i: L.Var) -> L.Expr:
        if case == "out_of_bounds":  # x[i + 4] is only in bounds where i < 4
            arm: L.Expr = L.Load(F32, "x", L.var(i) + 4)
        elif case == "integer_division":
            quotient = L.Binary(int32, "div", L.Const(int32, 7), L.Load(int32, "k", L.var(i)))
            arm = L.Cast(F32, quotient)
        else:
            arm = L.Cast(F32, L.Cast(int32, L.Load(F32, "x", L.var(i))))
        return L.Select(F32, _below(i, 4), arm, L.Const(F32, 0.0))

    (select,) = _selects(speculate_selects(_program(value)))
    assert not select.speculate


def test_a_load_at_a_data_dependent_index_is_not_speculated() -> None:
    j = L.Var("j", 8)

    def value(i: L.Var) -> L.Expr:
        return L.Select(F32, _below(i, 4), L.Load(F32, "x", L.var(j)), L.Const(F32, 0.0))

    extra = (L.IndexLoad(j, "k", L.var(L.Var("i", 8))),)
    (select,) = _selects(speculate_selects(_program(value, extra)))
    assert not select.speculate


def _masked_softmax_backward(p: sg.Tensor, dp: sg.Tensor, s: sg.Tensor) -> sg.Tensor:
    """The causal softmax backward's shape: a row-invariant divisor under the mask."""
    t = p.shape[-1]
    mask = sg.arange(t).reshape((t, 1)) >= sg.arange(t).reshape((1, t))
    acc = (dp * p).sum(axis=-1, keepdims=True)
    return sg.where(mask, (dp / s + acc) * p, 0.0) * 0.5


def test_the_masked_softmax_backward_is_speculated_and_exact() -> None:
    runner = MODES["c"]
    reason = runner.unavailable()
    if reason:
        pytest.skip(reason)
    rng = np.random.default_rng(0)
    p = rng.random((3, 16, 16)).astype(np.float32)
    dp = rng.normal(size=(3, 16, 16)).astype(np.float32)
    s = rng.random((3, 16, 1)).astype(np.float32) + 0.5
    tensors = [sg.tensor(a) for a in (p, dp, s)]
    program, source = generate(sg.compile(_masked_softmax_backward, backend="c").graph(*tensors))
    assert any(sel.speculate for sel in _selects(program))
    assert "sg_a" in source
    (got,) = runner.call(_masked_softmax_backward, [p, dp, s])
    mask = np.tril(np.ones((16, 16), bool))
    acc = (dp * p).sum(-1, keepdims=True)
    want = np.where(mask, (dp / s + acc) * p, 0.0) * 0.5
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
