"""Winograd F(2x2, 3x3) convolution (``sg.conv2d(..., algorithm="winograd")``, issue 12).

Values against the direct NumPy reference and im2col (float64 and float32, odd sizes,
padding 0/1, batch 1, one channel), gradients against float64 central differences
along a random direction with a random cotangent, eager and compiled C, and the
``algorithm`` option's rule and errors.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Callable

import numpy as np
import pytest

import references as R
import shapegrad as sg

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


def test_auto_picks_winograd_only_for_wide_stride_1_3x3_float_traced_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wide = conv_module.WINOGRAD_MIN_CHANNELS
    choose = conv_module._choose_algorithm
    picked: dict[str, str] = {}

    def f(x: sg.Tensor, w: sg.Tensor, narrow: sg.Tensor, w5: sg.Tensor) -> sg.Tensor:
        picked["wide"] = choose("auto", x, w, (1, 1))
        picked["narrow"] = choose("auto", x, narrow, (1, 1))
        picked["stride 2"] = choose("auto", x, w, (2, 2))
        picked["5x5"] = choose("auto", x, w5, (1, 1))
        picked["forced"] = choose("im2col", x, w, (1, 1))
        return sg.conv2d(x, w, padding=1)

    monkeypatch.setattr(conv_module, "WINOGRAD_AUTO", True)  # the rule, when turned on
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, wide, 3, 5)).astype(np.float32)
    w = (rng.standard_normal((wide, wide, 3, 3)) / wide).astype(np.float32)
    zeros = (np.zeros((wide - 1, wide, 3, 3), np.float32), np.zeros((wide, wide, 5, 5), np.float32))
    got = sg.compile(f, backend="numpy")(*map(sg.tensor, (x, w, *zeros))).numpy()
    assert picked == {
        "wide": "winograd",
        "narrow": "im2col",
        "stride 2": "im2col",
        "5x5": "im2col",
        "forced": "im2col",
    }
    want = R.conv2d(x.astype(np.float64), w.astype(np.float64), padding=(1, 1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Eager mode runs im2col under "auto" (Winograd's many small NumPy calls are slower).
    assert choose("auto", sg.tensor(x), sg.tensor(w), (1, 1)) == "im2col"
    assert choose("winograd", sg.tensor(x), sg.tensor(w), (1, 1)) == "winograd"
    monkeypatch.setattr(conv_module, "WINOGRAD_AUTO", False)  # the default: im2col
    assert sg.compile(f, backend="numpy")(*map(sg.tensor, (x, w, *zeros))) is not None
    assert picked["wide"] == "im2col"


def test_bad_algorithm_names_and_unsupported_shapes_are_clear_errors() -> None:
    x, w = sg.zeros((1, 2, 6, 6)), sg.zeros((3, 2, 3, 3))
    with pytest.raises(ValueError, match=r"conv2d: algorithm must be one of .*got 'fft'"):
        sg.conv2d(x, w, algorithm="fft")
    with pytest.raises(ValueError, match=r"winograd.*stride \(2, 2\)"):
        sg.conv2d(x, w, stride=2, algorithm="winograd")
    with pytest.raises(ValueError, match=r"winograd.*weight \[3, 2, 5, 5\]|winograd.*3, 2, 5, 5"):
        sg.conv2d(x, sg.zeros((3, 2, 5, 5)), algorithm="winograd")
