"""Row fusion (``compiler/rowfuse.py``): a softmax's max, exp, sum and divide, and
LayerNorm's passes, become one loop over the rows; a kernel reading another row of
what the group writes stays apart. Values are checked against NumPy in float64."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import C_TARGET, Target
from shapegrad.ir import Graph

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _program(fn, *args, target: Target = C_TARGET) -> L.Program:  # type: ignore[no-untyped-def]
    graph: Graph = sg.compile(fn, backend="numpy").graph(*(sg.tensor(a) for a in args))
    return lower_program(graph, target, "t")[0]


def _reducing(program: L.Program) -> list[L.Kernel]:
    return [k for k in program.kernels if any(isinstance(s, L.Reduce) for s in L.walk(k.body))]


def _softmax_np(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _softmax(x: sg.Tensor) -> sg.Tensor:
    return sg.softmax(x * 2.0, axis=-1)


@needs_cc
def test_softmax_is_one_row_kernel() -> None:
    x = _f32(2, 3, 16, 16)
    (kernel,) = _reducing(_program(_softmax, x))  # max and sum: both in one kernel
    assert len([s for s in L.walk(kernel.body) if isinstance(s, L.Reduce)]) == 2
    apart = C_TARGET.replace(skip_stages=C_TARGET.skip_stages | {"fuse_row_kernels"})
    assert len(_reducing(_program(_softmax, x, target=apart))) == 2  # without the stage
    out = sg.compile(_softmax, backend="c")(sg.tensor(x)).numpy()
    np.testing.assert_allclose(out, _softmax_np(x.astype(np.float64) * 2.0), rtol=1e-5)


@needs_cc
def test_layer_norm_forward_is_one_row_kernel() -> None:
    x, w, b = _f32(4, 8, 32), _f32(32, seed=1), _f32(32, seed=2)

    def fn(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
        return sg.layer_norm(x, w, b)

    assert len(_reducing(_program(fn, x, w, b))) == 1
    out = sg.compile(fn, backend="c")(sg.tensor(x), sg.tensor(w), sg.tensor(b)).numpy()
    x64 = x.astype(np.float64)
    mean, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    np.testing.assert_allclose(
        out, (x64 - mean) / np.sqrt(var + 1e-5) * w + b, rtol=1e-4, atol=1e-5
    )


@needs_cc
def test_softmax_gradient_matches_numpy() -> None:
    x, g = _f32(3, 4, 8, 8), _f32(3, 4, 8, 8, seed=1)

    def loss(x: sg.Tensor, g: sg.Tensor) -> sg.Tensor:
        return (sg.softmax(x, axis=-1) * g).sum()

    got = sg.compile(sg.grad(loss), backend="c")(sg.tensor(x), sg.tensor(g)).numpy()
    s = _softmax_np(x.astype(np.float64))
    ref = s * (g - (g * s).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


@needs_cc
def test_reading_another_row_of_the_group_stays_apart() -> None:
    # the last kernel reads row i+1 of the softmax while writing row i: merged into one
    # row loop it would read a row not yet computed
    x = _f32(2, 16, 16)

    def fn(x: sg.Tensor) -> sg.Tensor:
        s = sg.softmax(x, axis=-1)
        return sg.concatenate([s[:, 1:], s[:, :1]], axis=1) * 2.0 + s

    program = _program(fn, x)
    assert len(program.kernels) == 2  # the softmax, then the shifted read
    out = sg.compile(fn, backend="c")(sg.tensor(x)).numpy()
    s = _softmax_np(x.astype(np.float64))
    np.testing.assert_allclose(out, np.roll(s, -1, axis=1) * 2.0 + s, rtol=1e-5)
