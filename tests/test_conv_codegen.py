"""Convolution code generation in the C backend (issue 12, CNN step): the weight gradient's
per-thread partials, checked on the generated code and against the NumPy backend at
several team sizes, with and without batch fusion of the patches."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import CompileOptions
from shapegrad.backends.c import COptions, generate
from shapegrad.compiler.target import C_TARGET

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

TARGETS = {
    "c": C_TARGET,
    "plain": C_TARGET.replace(batch_fusion=False, row_form=False),
}


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
    return (sg.relu(sg.conv2d(x, w, b, padding=1)) ** 2).mean()


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_weight_gradient_partials_are_tall_and_match_numpy(target: str, threads: int) -> None:
    # weight gradient: m = 8 output channels < n = 6 * 9 patch rows, summed over 24 images
    args = (_f32(8, 6, 3, 3), _f32(8, seed=1), _f32(24, 6, 14, 14, seed=2))
    vg = sg.value_and_grad(_conv_loss, argnums=(0, 1, 2))
    graph = sg.compile(vg, backend="numpy").graph(*args)
    options = CompileOptions(backend_options=COptions(target=TARGETS[target]))
    _, source = generate(graph, options)
    assert "part[j * 8 + r]" in source  # the 8 x 54 partial is kept as 54 x 8
    fn = sg.compile(vg, backend="c", target=TARGETS[target])
    exe = fn.lower(*args).executable
    exe.lib.sg_set_threads(threads, 0)
    try:
        value, got = fn(*map(sg.tensor, args))
    finally:
        exe.lib.sg_set_threads(1, 0)
    ref_value, ref = sg.compile(vg, backend="numpy")(*map(sg.tensor, args))
    np.testing.assert_allclose(value.numpy(), ref_value.numpy(), rtol=1e-5)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def _pool_loss(kind: str):  # type: ignore[no-untyped-def]
    pool = sg.max_pool2d if kind == "max" else sg.avg_pool2d
    return lambda x, c: (pool(sg.relu(x), 2) * c).sum()


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_gradient_has_no_div_mod_indexing(kind: str) -> None:
    # stride == kernel: the windows are a reshape of x, so the backward pass is elementwise;
    # the reshape back to [N, C, H, W] indexes by h // 2 and h % 2, which the renderer
    # removes by running h as 2*h_2 + r
    x, c = _f32(4, 3, 12, 10), _f32(4, 3, 6, 5, seed=1)
    grad = sg.grad(_pool_loss(kind))
    _, source = generate(sg.compile(grad, backend="numpy").graph(x, c))
    body = source[source.index("sg_body") :]
    assert "/ 2)" not in body and "% 2)" not in body
    got = sg.compile(grad, backend="c")(sg.tensor(x), sg.tensor(c)).numpy()
    want = sg.compile(grad, backend="numpy")(sg.tensor(x), sg.tensor(c)).numpy()
    np.testing.assert_array_equal(got, want)


def test_max_pool_ties_share_the_gradient_evenly() -> None:
    x = np.array([[[[1, 1, 0, 2], [1, 0, 2, 2], [5, 5, 3, 0], [5, 5, 1, 3]]]], np.float32)
    want = np.array(
        [
            [
                [
                    [1 / 3, 1 / 3, 0, 1 / 3],
                    [1 / 3, 0, 1 / 3, 1 / 3],
                    [1 / 4] * 2 + [1 / 2, 0],
                    [1 / 4] * 2 + [0, 1 / 2],
                ]
            ]
        ],
        np.float32,
    )
    loss = lambda x: sg.max_pool2d(x, 2).sum()  # noqa: E731
    eager = sg.grad(loss)(sg.tensor(x)).numpy()
    compiled = sg.compile(sg.grad(loss), backend="c")(sg.tensor(x)).numpy()
    np.testing.assert_allclose(eager, want, rtol=1e-6)
    np.testing.assert_allclose(compiled, want, rtol=1e-6)


def test_div_split_runs_a_variable_as_outer_times_factor_plus_rest() -> None:
    from shapegrad.compiler import loops as L
    from shapegrad.compiler.segments import div_split, split_var

    h, w = L.Var("h", 12), L.Var("w", 10)
    flat = L.var(h) * 10 + L.var(w)
    src = L.floordiv(flat, 20) * 5 + L.floordiv(L.var(w), 2)  # [h // 2, w // 2] of a 6 x 5 grid
    inner = L.Loop(w, "parallel", (L.Store("dst", flat, L.Load(sg.float32, "src", src)),))
    assert div_split(L.Loop(h, "parallel", (inner,))) == 2
    assert div_split(inner) is None  # (10 h + w) // 20 needs a factor 20 of w: too many copies
    h2 = L.Var("h_2", 6)
    (split,) = split_var((inner,), h, h2, 2, 1)
    assert isinstance(split, L.Loop) and div_split(split) == 2
    (store,) = split.body
    assert isinstance(store, L.Store) and isinstance(store.value, L.Load)
    assert store.value.index == L.var(h2) * 5 + L.floordiv(L.var(w), 2)
    assert store.index == L.var(h2) * 20 + L.var(w) + 10
    # an extent the factor does not divide is left alone
    odd = L.Var("o", 7)
    load = L.Load(sg.float32, "src", L.floordiv(L.var(odd), 2))
    assert div_split(L.Loop(odd, "parallel", (L.Store("dst", L.var(odd), load),))) is None


def test_segments_resolve_div_mod_that_is_constant_on_a_segment() -> None:
    from shapegrad.compiler import loops as L
    from shapegrad.compiler.segments import segments, specialize

    # a strided convolution's input gradient: (w - 1) // 14 and its rest, and a flat index
    # whose quotient is only constant once w >= 1
    h, w = L.Var("h", 6), L.Var("w", 16)
    q = L.floordiv(L.var(w) + (-1), 14)
    flat = L.floordiv(L.var(h) * 16 + L.var(w) + (-1), 96)
    load = L.Load(sg.float32, "src", q * 100 + L.mod(L.var(w) + (-1), 14) + flat)
    loop = L.Loop(w, "parallel", (L.Store("dst", L.var(h) * 16 + L.var(w), load),))
    segs = segments(loop)
    assert segs == [(0, 1), (1, 15), (15, 16)]
    (store,) = specialize(loop.body, w, 1, 15)
    assert isinstance(store, L.Store) and isinstance(store.value, L.Load)
    assert store.value.index == L.var(w) + (-1)  # quotient 0, rest w - 1, flat // 96 = 0
    (store,) = specialize(loop.body, w, 15, 16)
    assert isinstance(store, L.Store) and isinstance(store.value, L.Load)
    assert store.value.index == L.var(w) + 85  # 100 + (w - 1 - 14) + 0
    # values agree with Python's floor division and modulo on every point
    for lo, hi in segs:
        (s,) = specialize(loop.body, w, lo, hi)
        assert isinstance(s, L.Store) and isinstance(s.value, L.Load)
        for hv in range(6):
            for wv in range(lo, hi):
                got = L.substitute(L.substitute(s.value.index, w, wv), h, hv)
                want = (wv - 1) // 14 * 100 + (wv - 1) % 14 + (hv * 16 + wv - 1) // 96
                assert got == L.const(want)


@pytest.mark.parametrize("target", list(TARGETS))
def test_strided_conv_gradients_match_numpy(target: str) -> None:
    def loss(x: sg.Tensor, w: sg.Tensor, c: sg.Tensor) -> sg.Tensor:
        return (sg.relu(sg.conv2d(x, w, padding=1, stride=2)) * c).sum()

    args = (_f32(4, 3, 16, 15), _f32(6, 3, 3, 3, seed=1), _f32(4, 6, 8, 8, seed=2))
    grad = sg.grad(loss, argnums=(0, 1))
    got = sg.compile(grad, backend="c", target=TARGETS[target])(*map(sg.tensor, args))
    want = sg.compile(grad, backend="numpy")(*map(sg.tensor, args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_strided_conv_input_gradient_is_split_inside_out_without_div_mod() -> None:
    # the strided slices' gradient interleaves zeros through reshapes and pads: indices
    # like ((224 h + 14 w + v - 1) // 3584 + n + 63) % 64 that only simplify once the inner
    # loop is cut into segments; presplit cuts from the inside out
    def loss(x: sg.Tensor, w: sg.Tensor, c: sg.Tensor) -> sg.Tensor:
        return (sg.conv2d(x, w, padding=1, stride=2) * c).sum()

    args = (_f32(4, 3, 16, 16), _f32(6, 3, 3, 3, seed=1), _f32(4, 6, 8, 8, seed=2))
    grad = sg.grad(loss, argnums=0)
    _, source = generate(sg.compile(grad, backend="numpy").graph(*args))
    body = source[source.index("sg_body") :]
    assert not re.search(r"\) [/%] \d+\)", body), "div/mod left in the generated indices"
    assert "_s0" in body  # segment loops made by presplit
    got = sg.compile(grad, backend="c")(*map(sg.tensor, args)).numpy()
    want = sg.compile(grad, backend="numpy")(*map(sg.tensor, args)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pooling_window_runs_as_a_row_with_unchanged_values(kind: str) -> None:
    # the window (2 x 2 terms) is combined per output in the same order, but the loop over
    # outputs is the inner one, so it vectorizes
    pool = sg.max_pool2d if kind == "max" else sg.avg_pool2d
    x = _f32(4, 3, 12, 10)
    x[0, 0, :2, :2] = np.nan  # NaN propagates through the window's max
    f = lambda x: pool(sg.relu(x), 2)  # noqa: E731
    _, source = generate(sg.compile(f, backend="numpy").graph(x))
    assert re.search(r"float acc\d+_row\[5\];", source)
    got = sg.compile(f, backend="c")(sg.tensor(x)).numpy()
    want = sg.compile(f, backend="numpy")(sg.tensor(x)).numpy()
    if kind == "max":  # exact: a max is the max in any order
        np.testing.assert_array_equal(got, want)
    else:  # the reference sums in NumPy's order
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.isnan(got[0, 0, 0, 0])


# --- index-set splitting as a loop stage (compiler/splitting.py) -----------------------------


def _padded_conv_grad():  # type: ignore[no-untyped-def]
    # the pads run as segments, the pooling gradient's h // 2, h % 2 as 2*h_2 + r copies
    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.max_pool2d(sg.relu(sg.conv2d(x, w, padding=1)), 2).mean()

    return sg.grad(loss, argnums=(0, 1)), (_f32(4, 3, 10, 8), _f32(5, 3, 3, 3, seed=1))


def test_split_stage_output_is_what_the_renderer_prints() -> None:
    from shapegrad.backends.c import lower
    from shapegrad.backends.c.render import render_c
    from shapegrad.compiler import loops as L

    grad, args = _padded_conv_grad()
    program = lower(sg.compile(grad, backend="numpy").graph(*args), CompileOptions())
    stmts = [s for k in program.kernels for s in L.walk(k.body)]
    segments = [s for s in stmts if isinstance(s, L.Loop) and (s.start or s.stop is not None)]
    copies = [s for s in stmts if isinstance(s, L.Block)]
    assert segments and copies
    text = program.format()  # what SHAPEGRAD_DEBUG's loops.txt shows
    assert all(f"copy ({c.note}):" in text for c in copies)
    source = render_c(program)
    body = source[source.index("static int sg_body(") :]
    for s in segments:  # every segment of the IR is one loop of the C, as it is
        assert f"for (int64_t {s.var.name} = {s.start}; {s.var.name} < {s.end};" in body
    assert body.count("{ /* ") == len(copies)


def test_without_the_split_stage_the_renderer_splits_nothing() -> None:
    grad, args = _padded_conv_grad()
    unsplit = C_TARGET.replace(skip_stages=C_TARGET.skip_stages | {"split_index_sets"})
    graph = sg.compile(grad, backend="numpy").graph(*args)
    _, source = generate(graph, CompileOptions(backend_options=COptions(target=unsplit)))
    body = source[source.index("static int sg_body(") :]
    assert "{ /* " not in body  # no unrolled or div-split copies
    assert not re.search(r"for \(int64_t \w+ = [1-9]", body)  # no segments
    want = sg.compile(grad, backend="numpy")(*map(sg.tensor, args))
    for target in (C_TARGET, unsplit):  # same values with and without the stage
        got = sg.compile(grad, backend="c", target=target)(*map(sg.tensor, args))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


def test_split_limits_come_from_the_target_tuning() -> None:
    from shapegrad.backends.c import lower
    from shapegrad.compiler import loops as L

    grad, args = _padded_conv_grad()
    graph = sg.compile(grad, backend="numpy").graph(*args)
    no_unroll = C_TARGET.replace(tuning=replace(C_TARGET.tuning, max_unroll=1))
    program = lower(graph, CompileOptions(backend_options=COptions(target=no_unroll)))
    assert not any(isinstance(s, L.Block) for k in program.kernels for s in L.walk(k.body))
    got = sg.compile(grad, backend="c", target=no_unroll)(*map(sg.tensor, args))
    want = sg.compile(grad, backend="numpy")(*map(sg.tensor, args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)
