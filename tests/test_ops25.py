"""Issue 25's ops against PyTorch (values and gradients), their argument errors, and the
numerical edges the op table does not reach (softplus/elu at large magnitudes)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

torch = pytest.importorskip("torch", reason="PyTorch parity needs torch")
TF = torch.nn.functional

RNG = np.random.default_rng(25)


def _grads(fn: Callable[..., Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [g.numpy() for g in sg.grad(lambda *xs: sg.sum(fn(*xs)), argnums=tuple(range(len(arrays))))(*map(sg.tensor, arrays))]  # fmt: skip


def _torch(fn: Callable[..., Any], arrays: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


PARITY: list[tuple[str, Callable[..., Any], Callable[..., Any], list[tuple[int, ...]]]] = [
    ("silu", sg.silu, TF.silu, [(4, 5)]),
    ("softplus", sg.softplus, TF.softplus, [(4, 5)]),
    ("softplus[beta]", lambda x: sg.softplus(x * 9.0, beta=0.5, threshold=3.0), lambda x: TF.softplus(x * 9.0, beta=0.5, threshold=3.0), [(6, 5)]),
    ("elu", lambda x: sg.elu(x, 1.3), lambda x: TF.elu(x, 1.3), [(4, 5)]),
    ("leaky_relu", lambda x: sg.leaky_relu(x, 0.1), lambda x: TF.leaky_relu(x, 0.1), [(4, 5)]),
    ("erf", sg.erf, torch.erf, [(4, 5)]),
    ("gelu[none]", lambda x: sg.gelu(x, approximate="none"), TF.gelu, [(4, 5)]),
    ("gelu[tanh]", sg.gelu, lambda x: TF.gelu(x, approximate="tanh"), [(4, 5)]),
    ("norm", lambda x: sg.norm(x, 3, axis=1), lambda x: torch.linalg.vector_norm(x, 3, dim=1), [(4, 5)]),
    ("norm[fro]", lambda x: sg.norm(x, "fro"), lambda x: torch.linalg.norm(x, "fro"), [(4, 5)]),
    ("cumsum", lambda x: sg.cumsum(x, 0), lambda x: torch.cumsum(x, 0), [(9, 2)]),
    ("roll", lambda x: sg.roll(x, (2, -1), (0, 1)), lambda x: torch.roll(x, (2, -1), (0, 1)), [(4, 5)]),
    ("flip", lambda x: sg.flip(x, 1), lambda x: torch.flip(x, (1,)), [(4, 5)]),
    ("tril", lambda x: sg.tril(x, 1), lambda x: torch.tril(x, 1), [(3, 4, 5)]),
    ("repeat", lambda x: sg.repeat(x, 3, axis=0), lambda x: torch.repeat_interleave(x, 3, dim=0), [(2, 3)]),
    ("tile", lambda x: sg.tile(x, (2, 3)), lambda x: x.tile((2, 3)), [(2, 3)]),
    ("conv1d", lambda x, w, b: sg.conv1d(x, w, b, stride=2, padding=2), lambda x, w, b: TF.conv1d(x, w, b, stride=2, padding=2), [(2, 3, 11), (4, 3, 5), (4,)]),
    ("conv_transpose2d", lambda x, w: sg.conv_transpose2d(x, w, stride=(2, 1), padding=(0, 1), output_padding=(1, 0)), lambda x, w: TF.conv_transpose2d(x, w, stride=(2, 1), padding=(0, 1), output_padding=(1, 0)), [(2, 3, 4, 5), (3, 2, 3, 3)]),
    ("interpolate[bilinear_fraction]", lambda x: sg.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear"), lambda x: TF.interpolate(x, scale_factor=(1.7, 0.6), mode="bilinear"), [(1, 2, 5, 7)]),
    ("interpolate[nearest_size]", lambda x: sg.interpolate(x, size=(7, 3)), lambda x: TF.interpolate(x, size=(7, 3)), [(1, 2, 5, 7)]),
    ("interpolate[linear_corners]", lambda x: sg.interpolate(x, size=9, mode="linear", align_corners=True), lambda x: TF.interpolate(x, size=9, mode="linear", align_corners=True), [(2, 1, 4)]),
    ("sort[desc]", lambda x: sg.sort(x, axis=0, descending=True) ** 2, lambda x: torch.sort(x, dim=0, descending=True, stable=True).values ** 2, [(5, 4)]),
    ("topk", lambda x: sg.topk(x, 2, axis=1)[0] * sg.arange(2.0).astype(sg.float64), lambda x: torch.topk(x, 2, dim=1).values * torch.arange(2.0, dtype=torch.float64), [(4, 6)]),
    ("topk[smallest_select]", lambda x: sg.topk(x, 3, largest=False)[0] ** 3, lambda x: torch.topk(x, 3, largest=False).values ** 3, [(2, 40)]),
]  # fmt: skip


@pytest.mark.parametrize("name, ours, theirs, shapes", PARITY, ids=[p[0] for p in PARITY])
def test_matches_pytorch_values_and_gradients(
    name: str, ours: Callable[..., Any], theirs: Callable[..., Any], shapes: list[tuple[int, ...]]
) -> None:
    arrays = [RNG.standard_normal(s) for s in shapes]
    want, want_grads = _torch(theirs, arrays)
    got = ours(*map(sg.tensor, arrays)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)
    for g, w in zip(_grads(ours, arrays), want_grads, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11, err_msg=f"{name} gradient")


@pytest.mark.parametrize("soft", [False, True])
def test_cross_entropy_over_nchw_logits_matches_pytorch(soft: bool) -> None:
    logits = RNG.standard_normal((2, 5, 3, 4))
    if soft:
        labels = np.moveaxis(np.exp(RNG.standard_normal((2, 3, 4, 5))), -1, 1)
        labels = labels / labels.sum(axis=1, keepdims=True)
    else:
        labels = RNG.integers(0, 5, (2, 3, 4)).astype(np.int32)
    t = torch.tensor(logits, requires_grad=True)
    want = TF.cross_entropy(t, torch.tensor(labels if soft else labels.astype(np.int64)))
    want.backward()
    loss, grad = sg.value_and_grad(lambda x: sg.cross_entropy(x, sg.tensor(labels), axis=1))(
        sg.tensor(logits)
    )
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-12)
    np.testing.assert_allclose(grad.numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-13)


def test_cross_entropy_nd_checks_labels_in_compiled_code() -> None:
    fn = sg.compile(lambda x, y: sg.cross_entropy(x, y, axis=1), backend="numpy")
    logits = sg.tensor(np.zeros((1, 3, 2), np.float32))
    assert fn(logits, sg.tensor(np.array([[0, 2]], np.int32))).item() == pytest.approx(math.log(3))
    with pytest.raises(IndexError, match=r"labels must lie in \[0, 3\)"):
        fn(logits, sg.tensor(np.array([[0, 3]], np.int32)))


def test_softplus_and_elu_stay_finite_at_large_magnitudes() -> None:
    x = np.array([-1e4, -100.0, -30.0, 0.0, 19.9, 30.0, 1e4], np.float32)
    for ours, theirs in ((sg.softplus, TF.softplus), (sg.elu, TF.elu), (sg.silu, TF.silu)):
        got = ours(sg.tensor(x)).numpy()
        want = theirs(torch.tensor(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
        (g,) = _grads(ours, [x])
        assert np.all(np.isfinite(g)), (ours.__name__, g)
    # softplus keeps its relative precision far into the left tail (log1p, not log(1 + e))
    tail = np.array([-30.0, -200.0])
    np.testing.assert_allclose(sg.softplus(sg.tensor(tail)).numpy(), np.log1p(np.exp(tail)), rtol=1e-14)


@pytest.mark.parametrize("ord", [None, 3.0])
def test_norm_of_a_zero_vector_has_a_zero_gradient_like_pytorch(ord: float | None) -> None:
    x = np.zeros((2, 3))
    x[1] = [1.0, -2.0, 0.5]
    t = torch.tensor(x, requires_grad=True)
    torch.linalg.vector_norm(t, 2 if ord is None else ord, dim=1).sum().backward()
    (g,) = _grads(lambda v: sg.norm(v, ord, axis=1), [x])
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_cumsum_accumulates_in_float32(dtype: str) -> None:
    x = sg.full((3000,), 1.0, dtype)  # a float16/bfloat16 running sum would stall at 2048/256
    got = sg.cumsum(x)
    assert got.dtype.name == dtype
    np.testing.assert_array_equal(got.numpy().astype(np.float64)[[0, 255, 2047]], [1, 256, 2048])
    assert float(got.numpy()[-1]) == float(np.asarray(3000.0, dtype=x.numpy().dtype))


def test_erf_runs_compiled_in_c() -> None:
    x = np.linspace(-4, 4, 33)
    fn = sg.compile(lambda t: sg.erf(t), backend="c")
    np.testing.assert_allclose(fn(sg.tensor(x)).numpy(), [math.erf(v) for v in x], rtol=1e-15, atol=1e-16)


def test_bool_reductions_and_argmin_match_numpy() -> None:
    x = RNG.standard_normal((3, 4, 5))
    for axis in (None, 0, (1, 2), -1):
        np.testing.assert_array_equal(sg.all(sg.tensor(x > -1.5), axis=axis).numpy(), np.all(x > -1.5, axis=axis))
        np.testing.assert_array_equal(sg.any(sg.tensor(x), axis=axis, keepdims=True).numpy(), np.any(x, axis=axis, keepdims=True))
    np.testing.assert_array_equal(sg.argmin(sg.tensor(x), axis=1).numpy(), np.argmin(x, axis=1))
    assert sg.any(sg.zeros((0,))).item() is False and sg.all(sg.zeros((0,))).item() is True


BAD: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (lambda: sg.softplus(sg.ones(2), beta=0.0), ValueError, r"softplus: beta must be non-zero"),
    (lambda: sg.silu(sg.tensor([1, 2])), sg.DTypeError, r"silu: needs a float tensor, got int32"),
    (lambda: sg.argmin(sg.ones((2, 3)), axis=2), sg.ShapeError, r"argmin.*axis 2 is out of range"),
    (lambda: sg.argmin(sg.ones((2, 0)), axis=1), sg.ShapeError, r"argmin.*empty"),
    (lambda: sg.all(sg.ones(3), axis=(0, 0)), sg.ShapeError, r"all.*repeated axis"),
    (lambda: sg.norm(sg.ones(3), ord=-2), ValueError, r"norm: ord must be"),
    (lambda: sg.norm(sg.ones(3), ord="nuc"), ValueError, r"norm: ord must be"),
    (lambda: sg.norm(sg.ones((2, 2, 2)), ord="fro", axis=0), ValueError, r"ord='fro' needs two axes"),
    (lambda: sg.tril(sg.ones(3)), sg.ShapeError, r"tril.*rank >= 2.*\[3\]"),
    (lambda: sg.triu(sg.ones((2, 2)), k=0.5), ValueError, r"triu: diagonal offset k must be an int"),  # type: ignore[arg-type]
    (lambda: sg.flip(sg.ones((2, 2)), axis=3), sg.ShapeError, r"flip.*axis 3 is out of range"),
    (lambda: sg.roll(sg.ones((2, 2)), (1, 2), axis=0), ValueError, r"roll: shift .* and axis .* differ"),
    (lambda: sg.repeat(sg.ones(3), [1, 2]), ValueError, r"repeat: repeats must be one int >= 0 or 3"),
    (lambda: sg.tile(sg.ones(3), (-1,)), ValueError, r"tile: reps must be >= 0"),
    (lambda: sg.cumsum(sg.ones(3), axis=1), sg.ShapeError, r"cumsum.*axis 1 is out of range"),
    (lambda: sg.conv1d(sg.ones((2, 3)), sg.ones((1, 3, 1))), sg.ShapeError, r"conv1d.*\[N, C, L\]"),
    (lambda: sg.conv1d(sg.ones((1, 3, 4)), sg.ones((1, 2, 1))), sg.ShapeError, r"conv2d"),
    (lambda: sg.conv_transpose2d(sg.ones((1, 3, 4, 4)), sg.ones((2, 3, 3, 3))), sg.ShapeError, r"Cin 2.*has 3 channels"),
    (lambda: sg.conv_transpose2d(sg.ones((1, 2, 4, 4)), sg.ones((2, 3, 3, 3)), stride=2, output_padding=2), ValueError, r"output_padding .* smaller than stride"),
    (lambda: sg.interpolate(sg.ones((1, 1, 4, 4)), size=3, scale_factor=2), ValueError, r"exactly one of size and scale_factor"),
    (lambda: sg.interpolate(sg.ones((1, 1, 4)), size=3, mode="bilinear"), sg.ShapeError, r"bilinear.*\[N, C, H, W\]"),
    (lambda: sg.interpolate(sg.ones((1, 1, 4, 4)), size=3, mode="cubic"), ValueError, r"mode must be one of"),
    (lambda: sg.interpolate(sg.ones((1, 1, 4, 4)), scale_factor=0.1), sg.ShapeError, r"shrinks"),
    (lambda: sg.cross_entropy(sg.ones((2, 3, 4)), sg.tensor(np.zeros((2, 3), np.int32)), axis=1), sg.ShapeError, r"labels \[2, 3\] must be class indices \[2, 4\]"),
    (lambda: sg.gelu(sg.ones(2), approximate="erf"), ValueError, r"approximate must be 'tanh' or 'none'"),
]  # fmt: skip


@pytest.mark.parametrize("make, kind, message", BAD, ids=[m for _, _, m in BAD])
def test_bad_arguments_raise_a_clear_error(
    make: Callable[[], Any], kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind, match=message):
        make()
