"""Winograd F(2x2, 3x3) convolution (``sg.conv2d(..., algorithm="winograd")``, issue 12).

Values against the direct NumPy reference and im2col (float64 and float32, odd sizes,
padding 0/1, batch 1, one channel), gradients against float64 central differences
along a random direction with a random cotangent, eager and compiled C, and the
``algorithm`` option's rule (``"auto"``: the Target's ``choose_conv_algorithm``
rewrite) and errors.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable

import numpy as np
import pytest

import references as R
import shapegrad as sg
from shapegrad.compiler.conv_algorithm import choose_conv_algorithm
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import C_TARGET, CUDA_TARGET
from shapegrad.ir import Graph
from shapegrad.ops.protocol import Prim

# The module, not the sg.conv2d function re-exported under the package.
conv_module = importlib.import_module("shapegrad._conv")

HAVE_CC = shutil.which("cc") is not None

# (N, Cin, H, W, Cout, padding): odd and even output sizes, batch 1, one channel,
# a 1x1 output, non-square inputs.
SHAPES = [
    (2, 3, 8, 8, 4, 1),
    (2, 3, 7, 9, 5, 1),
    (1, 1, 5, 5, 1, 0),
    (1, 4, 6, 5, 1, 0),
    (3, 1, 3, 3, 2, 0),
    (1, 2, 4, 3, 3, 1),
]


def _args(shape: tuple[int, ...], dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w, o, _ = shape
    rng = np.random.default_rng(seed)
    return (
        rng.standard_normal((n, c, h, w)).astype(dtype),
        rng.standard_normal((o, c, 3, 3)).astype(dtype),
    )


def _conv(algorithm: str, padding: int) -> Callable[[sg.Tensor, sg.Tensor], sg.Tensor]:
    def f(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.conv2d(x, w, padding=padding, algorithm=algorithm)

    return f


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_float64_matches_direct_reference_and_im2col(shape: tuple[int, ...]) -> None:
    x, w = _args(shape, "float64")
    pad = shape[5]
    want = R.conv2d(x, w, padding=(pad, pad))
    got = sg.conv2d(sg.tensor(x), sg.tensor(w), padding=pad, algorithm="winograd").numpy()
    im2col = sg.conv2d(sg.tensor(x), sg.tensor(w), padding=pad, algorithm="im2col").numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, im2col, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_float32_error_is_a_few_ulps_times_the_transform_constants(shape: tuple[int, ...]) -> None:
    x, w = _args(shape, "float32", seed=1)
    pad = shape[5]
    want = R.conv2d(x.astype(np.float64), w.astype(np.float64), padding=(pad, pad))
    got = sg.conv2d(sg.tensor(x), sg.tensor(w), padding=pad, algorithm="winograd").numpy()
    assert got.dtype == np.float32
    # Error scale: the sum of |terms| of each output, times float32 epsilon.
    scale = R.conv2d(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), padding=(pad, pad))
    err = np.abs(got - want) / (scale * np.finfo(np.float32).eps)
    assert err.max() < 32, err.max()


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[3]], ids=str)
def test_compiled_c_matches_eager_values_and_gradients(shape: tuple[int, ...]) -> None:
    x, w = _args(shape, "float32", seed=2)
    pad = shape[5]
    c = np.random.default_rng(3).standard_normal(R.conv2d(x, w, padding=(pad, pad)).shape)
    cot = sg.tensor(c.astype(np.float32))

    def loss(x: sg.Tensor, w: sg.Tensor, cot: sg.Tensor) -> sg.Tensor:
        return (sg.relu(_conv("winograd", pad)(x, w)) * cot).sum()

    vg = sg.value_and_grad(loss, argnums=(0, 1))
    args = (sg.tensor(x), sg.tensor(w), cot)
    (v_eager, g_eager), (v_c, g_c) = vg(*args), sg.compile(vg, backend="c")(*args)
    np.testing.assert_allclose(v_c.numpy(), v_eager.numpy(), rtol=1e-5)
    for a, b in zip(g_c, g_eager, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[2], SHAPES[5]], ids=str)
def test_gradients_match_float64_central_differences(shape: tuple[int, ...]) -> None:
    x, w = _args(shape, "float64", seed=4)
    pad = shape[5]
    rng = np.random.default_rng(5)
    cot = rng.standard_normal(R.conv2d(x, w, padding=(pad, pad)).shape)
    dx, dw = rng.standard_normal(x.shape), rng.standard_normal(w.shape)

    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (_conv("winograd", pad)(x, w) * sg.tensor(cot)).sum()

    gx, gw = sg.grad(loss, argnums=(0, 1))(sg.tensor(x), sg.tensor(w))
    eps = 1e-6

    def f(t: float) -> float:
        return float(loss(sg.tensor(x + t * dx), sg.tensor(w + t * dw)).numpy())

    numeric = (f(eps) - f(-eps)) / (2 * eps)
    analytic = float(np.sum(gx.numpy() * dx) + np.sum(gw.numpy() * dw))
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-8)

    # And each gradient against im2col's (same VJP rules, other decomposition).
    def loss_im2col(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (_conv("im2col", pad)(x, w) * sg.tensor(cot)).sum()

    hx, hw = sg.grad(loss_im2col, argnums=(0, 1))(sg.tensor(x), sg.tensor(w))
    np.testing.assert_allclose(gx.numpy(), hx.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw.numpy(), hw.numpy(), rtol=1e-10, atol=1e-10)


def test_bias_is_added_once() -> None:
    x, w = _args((2, 3, 6, 6, 4, 1), "float64", seed=6)
    b = np.arange(4.0)
    got = sg.conv2d(sg.tensor(x), sg.tensor(w), sg.tensor(b), padding=1, algorithm="winograd")
    np.testing.assert_allclose(
        got.numpy(), R.conv2d(x, w, b, padding=(1, 1)), rtol=1e-12, atol=1e-12
    )


def _products(graph: Graph) -> list[str]:
    return [n.attr["spec"] for n in graph.nodes() if n.prim is Prim.EINSUM]


def test_auto_picks_winograd_only_for_wide_stride_1_3x3_float_convs_by_the_target() -> None:
    """``"auto"`` is decided after tracing by the backend's Target (the
    ``choose_conv_algorithm`` loop stage); the rule, when a Target turns it on: 3x3, stride 1, float, both channel
    counts at least ``Target.winograd_min_channels``."""
    wide = conv_module.WINOGRAD_MIN_CHANNELS
    on = C_TARGET.replace(winograd_min_channels=wide)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, wide, 3, 5)).astype(np.float32)
    w = (rng.standard_normal((wide, wide, 3, 3)) / wide).astype(np.float32)
    narrow = np.zeros((wide - 1, wide, 3, 3), np.float32)
    w5 = np.zeros((wide, wide, 5, 5), np.float32)
    cases: dict[str, tuple[Callable[..., sg.Tensor], tuple[np.ndarray, ...]]] = {
        "wide": (lambda x, w: sg.conv2d(x, w, padding=1), (x, w)),
        "narrow": (lambda x, w: sg.conv2d(x, w, padding=1), (x, narrow)),
        "stride 2": (lambda x, w: sg.conv2d(x, w, stride=2, padding=1), (x, w)),
        "5x5": (lambda x, w: sg.conv2d(x, w, padding=1), (x, w5)),
        "forced": (lambda x, w: sg.conv2d(x, w, padding=1, algorithm="im2col"), (x, w)),
    }
    picked = {}
    for name, (f, args) in cases.items():
        graph = sg.compile(f, backend="numpy").lower(*args).graph
        # no backend turns the rule on: the graph is left as it is
        for target in (C_TARGET, CUDA_TARGET):
            assert choose_conv_algorithm(graph, target) is graph
        chosen = choose_conv_algorithm(graph, on)
        picked[name] = "im2col" if conv_module.CONV_SPEC in _products(chosen) else "winograd"
    assert picked == {
        "wide": "winograd",
        "narrow": "im2col",
        "stride 2": "im2col",
        "5x5": "im2col",
        "forced": "im2col",
    }
    # The choice is what runs: values of the rewritten graph (C, the rule on) and the dump
    # of the stage that made it.
    dumps: dict[str, str] = {}
    graph = sg.compile(cases["wide"][0], backend="numpy").lower(x, w).graph
    lower_program(graph, on, "t", on_stage=dumps.__setitem__)
    assert conv_module.CONV_SPEC not in dumps["choose_conv_algorithm"]
    lower_program(graph, C_TARGET, "t", on_stage=dumps.__setitem__)
    assert f"conv='auto', spec='{conv_module.CONV_SPEC}'" in dumps["choose_conv_algorithm"]
    want = R.conv2d(x.astype(np.float64), w.astype(np.float64), padding=(1, 1))
    if HAVE_CC:
        got = sg.compile(cases["wide"][0], backend="c", target=on)(x, w).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Eager "auto" is im2col: the same product as algorithm="im2col", bit for bit.
    eager = sg.conv2d(sg.tensor(x), sg.tensor(w), padding=1).numpy()
    forced = sg.conv2d(sg.tensor(x), sg.tensor(w), padding=1, algorithm="im2col").numpy()
    np.testing.assert_array_equal(eager, forced)
    np.testing.assert_allclose(eager, want, rtol=1e-4, atol=1e-5)


def test_a_target_rewrites_auto_convs_in_training_steps_with_the_same_gradients() -> None:
    """The rewrite replaces the forward product; gradients (built before any Target was
    known) keep im2col's products and stay exact."""
    if not HAVE_CC:
        pytest.skip("no C compiler (cc) on PATH")
    on = C_TARGET.replace(winograd_min_channels=4)
    x, w = _args((2, 4, 7, 6, 5, 1), "float64", seed=8)
    cot = np.random.default_rng(9).standard_normal((2, 5, 7, 6))

    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (sg.conv2d(x, w, padding=1) * sg.tensor(cot)).sum()

    step = sg.value_and_grad(loss, argnums=(0, 1))  # the forward product is live
    graph = sg.compile(step, backend="numpy").lower(x, w).graph
    chosen = choose_conv_algorithm(graph, on)
    assert _products(graph).count(conv_module.CONV_SPEC) == 1
    assert conv_module.CONV_SPEC not in _products(chosen)
    value, grads = sg.compile(step, backend="c", target=on)(x, w)
    want_value, want_grads = step(sg.tensor(x), sg.tensor(w))
    for g, e in zip([value, *grads], [want_value, *want_grads], strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-10, atol=1e-10)


def test_bad_algorithm_names_and_unsupported_shapes_are_clear_errors() -> None:
    x, w = sg.zeros((1, 2, 6, 6)), sg.zeros((3, 2, 3, 3))
    with pytest.raises(ValueError, match=r"conv2d: algorithm must be one of .*got 'fft'"):
        sg.conv2d(x, w, algorithm="fft")
    with pytest.raises(ValueError, match=r"winograd.*stride \(2, 2\)"):
        sg.conv2d(x, w, stride=2, algorithm="winograd")
    with pytest.raises(ValueError, match=r"winograd.*weight \[3, 2, 5, 5\]|winograd.*3, 2, 5, 5"):
        sg.conv2d(x, sg.zeros((3, 2, 5, 5)), algorithm="winograd")
