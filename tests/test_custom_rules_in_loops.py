"""``sg.custom_vjp`` / ``sg.custom_jvp`` inside ``sg.scan`` and ``sg.checkpoint`` bodies, and
under an outer ``sg.grad`` of ``sg.vmap``: eager, numpy and C, in float64.

References: the gradient-clipping and straight-through loops have their backward derived
by hand below (NumPy loops); rules that are the true derivative are checked against
central finite differences; vmap cases against a Python loop of per-example gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

MODES = ["eager", "numpy", "c"]
L, D = 3, 4


def f64(a: Any) -> sg.Tensor:
    return sg.tensor(np.asarray(a, dtype=np.float64), dtype="float64")


def run(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return fn if mode == "eager" else sg.compile(fn, backend=mode)


@sg.custom_vjp
def clip_gradient(x: sg.Tensor) -> sg.Tensor:
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (sg.clip(g, -1.0, 1.0),))


@sg.custom_vjp
def binarize(x: sg.Tensor) -> sg.Tensor:  # a straight-through estimator
    return sg.where(x > 0, 1.0, 0.0).astype(x.dtype)


binarize.defvjp(lambda x: (binarize(x), x), lambda x, g: (sg.where(sg.abs(x) <= 1.0, g, 0.0),))


@sg.custom_jvp
def log1pexp(x: sg.Tensor) -> sg.Tensor:
    return sg.log(1.0 + sg.exp(x))


log1pexp.defjvp(lambda p, t: (log1pexp(p[0]), sg.sigmoid(p[0]) * t[0]))


def _data(seed: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h0 = rng.normal(size=D)
    ws = rng.normal(size=(L, D, D)) * scale
    bs = rng.normal(size=(L, D)) * 0.3
    c = rng.normal(size=D) * 4.0  # large enough that some clipped cotangents are clipped
    return h0, ws, bs, c


# --- gradient clipping in a scan -----------------------------------------------------------


def _clipped_rnn_reference(h0: Any, ws: Any, bs: Any, c: Any) -> tuple[Any, ...]:
    """loss = sum(c * h_L) + sum_l sum(h_l), h_{l+1} = tanh(clip_gradient(h_l @ W_l) + b_l):
    the forward, then the backward by hand (clip applied to the cotangent of h_l @ W_l)."""
    hs = [h0]
    for w, b in zip(ws, bs, strict=True):
        hs.append(np.tanh(hs[-1] @ w + b))
    loss = float((c * hs[-1]).sum() + sum(h.sum() for h in hs[1:]))
    ct_h = c + 1.0
    g_ws, g_bs = np.zeros_like(ws), np.zeros_like(bs)
    for layer in reversed(range(L)):
        ct_u = ct_h * (1.0 - hs[layer + 1] ** 2)  # through tanh
        g_bs[layer] = ct_u
        ct_z = np.clip(ct_u, -1.0, 1.0)  # the custom backward
        g_ws[layer] = np.outer(hs[layer], ct_z)
        ct_h = ct_z @ ws[layer].T + (1.0 if layer > 0 else 0.0)
    return loss, ct_h, g_ws, g_bs


def _clipped_rnn(h0: sg.Tensor, ws: sg.Tensor, bs: sg.Tensor, c: sg.Tensor, policy: str) -> Any:
    def layer(h: sg.Tensor, wb: tuple[sg.Tensor, sg.Tensor]) -> tuple[sg.Tensor, sg.Tensor]:
        w, b = wb
        h = sg.tanh(clip_gradient(h @ w) + b)
        return h, h.sum()

    h, ys = sg.scan(layer, h0, (ws, bs), policy=policy)  # type: ignore[arg-type]
    return (c * h).sum() + ys.sum()


@pytest.mark.parametrize("policy", ["recompute", "residuals"])
@pytest.mark.parametrize("mode", MODES)
def test_gradient_clipping_in_a_scan(mode: str, policy: str) -> None:
    h0, ws, bs, c = _data(0, 1.5)
    loss, g_h0, g_ws, g_bs = _clipped_rnn_reference(h0, ws, bs, c)
    assert np.abs(np.clip(g_bs, -1, 1) - g_bs).max() > 0.1  # clipping is active

    def fn(*a: sg.Tensor) -> Any:
        return _clipped_rnn(*a, policy=policy)

    value, grads = run(sg.value_and_grad(fn, argnums=(0, 1, 2)), mode)(
        f64(h0), f64(ws), f64(bs), f64(c)
    )
    np.testing.assert_allclose(value.numpy(), loss, rtol=1e-12)
    for got, want in zip(grads, (g_h0, g_ws, g_bs), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


# --- a straight-through estimator in a scanned / checkpointed layer ------------------------


def _ste_reference(h0: Any, ws: Any, bs: Any, c: Any) -> tuple[Any, ...]:
    """h_{l+1} = binarize(h_l @ W_l + b_l), loss = sum(c * h_L): the STE's backward passes
    the cotangent where |z| <= 1 and stops it elsewhere."""
    hs, zs = [h0], []
    for w, b in zip(ws, bs, strict=True):
        zs.append(hs[-1] @ w + b)
        hs.append((zs[-1] > 0).astype(np.float64))
    ct_h = c
    g_ws, g_bs = np.zeros_like(ws), np.zeros_like(bs)
    for layer in reversed(range(L)):
        ct_z = np.where(np.abs(zs[layer]) <= 1.0, ct_h, 0.0)
        g_bs[layer] = ct_z
        g_ws[layer] = np.outer(hs[layer], ct_z)
        ct_h = ct_z @ ws[layer].T
    return float((c * hs[-1]).sum()), ct_h, g_ws, g_bs


def _ste_layer(h: sg.Tensor, wb: tuple[sg.Tensor, sg.Tensor]) -> tuple[sg.Tensor, None]:
    w, b = wb
    return binarize(h @ w + b), None


@pytest.mark.parametrize("form", ["scan", "checkpoint"])
@pytest.mark.parametrize("mode", MODES)
def test_straight_through_estimator_in_a_scanned_layer(mode: str, form: str) -> None:
    h0, ws, bs, c = _data(1, 0.6)
    loss, g_h0, g_ws, g_bs = _ste_reference(h0, ws, bs, c)
    assert np.abs(g_ws).max() > 0.1  # some cotangent passes the estimator

    def fn(h: sg.Tensor, w: sg.Tensor, b: sg.Tensor, c: sg.Tensor) -> sg.Tensor:
        if form == "scan":
            h, _ = sg.scan(_ste_layer, h, (w, b))
        else:
            block = sg.checkpoint(lambda h, w, b: _ste_layer(h, (w, b))[0])
            for layer in range(L):
                h = block(h, w[layer], b[layer])
        return (c * h).sum()

    value, grads = run(sg.value_and_grad(fn, argnums=(0, 1, 2)), mode)(
        f64(h0), f64(ws), f64(bs), f64(c)
    )
    np.testing.assert_allclose(value.numpy(), loss, rtol=1e-12)
    for got, want in zip(grads, (g_h0, g_ws, g_bs), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


# --- a custom_jvp (its rule is the true derivative) against finite differences -------------


def _softplus_rnn(h0: sg.Tensor, ws: sg.Tensor) -> sg.Tensor:
    def layer(h: sg.Tensor, w: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        h = log1pexp(h @ w) - 0.5
        return h, (h * h).sum()

    h, ys = sg.scan(layer, h0, ws)
    return h.sum() + ys.sum()


def _directional(fn: Callable[[np.ndarray], float], x: np.ndarray, v: np.ndarray) -> float:
    """Central finite difference of ``fn`` at ``x`` along ``v``."""
    eps = 1e-6
    return (fn(x + eps * v) - fn(x - eps * v)) / (2 * eps)


@pytest.mark.parametrize("mode", MODES)
def test_custom_jvp_in_a_scan_matches_finite_differences(mode: str) -> None:
    """Gradients against central differences along random directions (float64)."""
    h0, ws, _, _ = _data(2, 0.8)

    def value(h: np.ndarray, w: np.ndarray) -> float:
        return float(_softplus_rnn(f64(h), f64(w)).numpy())

    g_h0, g_ws = run(sg.grad(_softplus_rnn, argnums=(0, 1)), mode)(f64(h0), f64(ws))
    rng = np.random.default_rng(12)
    for _ in range(3):
        vh, vw = rng.standard_normal(h0.shape), rng.standard_normal(ws.shape)
        want_h = _directional(lambda h: value(h, ws), h0, vh)
        want_w = _directional(lambda w: value(h0, w), ws, vw)
        np.testing.assert_allclose(float((g_h0.numpy() * vh).sum()), want_h, rtol=1e-6)
        np.testing.assert_allclose(float((g_ws.numpy() * vw).sum()), want_w, rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "numpy"])
def test_jvp_through_a_checkpointed_custom_jvp(mode: str) -> None:
    h0, ws, _, _ = _data(3, 0.8)
    th = np.random.default_rng(4).normal(size=D)
    block = sg.checkpoint(lambda h, w: log1pexp(h @ w))

    def fn(h: sg.Tensor) -> sg.Tensor:
        for layer in range(L):
            h = block(h, f64(ws[layer]))
        return h

    _, tangent = run(lambda h, t: sg.jvp(fn, (h,), (t,)), mode)(f64(h0), f64(th))
    eps = 1e-6
    expected = (fn(f64(h0 + eps * th)).numpy() - fn(f64(h0 - eps * th)).numpy()) / (2 * eps)
    np.testing.assert_allclose(tangent.numpy(), expected, rtol=1e-6)


# --- closures, vmap --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_backward_closing_over_a_traced_value(mode: str) -> None:
    """The backward reads a value the forward never touches (lifted into the loop)."""
    h0, ws, bs, c = _data(5, 1.5)

    def fn(h: sg.Tensor, w: sg.Tensor, scale: sg.Tensor) -> sg.Tensor:
        @sg.custom_vjp
        def scaled_clip(x: sg.Tensor) -> sg.Tensor:
            return x

        scaled_clip.defvjp(lambda x: (x, None), lambda _, g: (sg.clip(g, -1.0, 1.0) * scale,))

        def layer(h: sg.Tensor, w: sg.Tensor) -> tuple[sg.Tensor, None]:
            return scaled_clip(h @ w), None

        return (sg.scan(layer, h, w)[0] * f64(c)).sum()

    got = run(sg.grad(fn), mode)(f64(h0), f64(ws), f64(0.5))
    ct = c
    for layer in reversed(range(L)):
        ct = (np.clip(ct, -1.0, 1.0) * 0.5) @ ws[layer].T
    np.testing.assert_allclose(got.numpy(), ct, rtol=1e-12)


def _per_example_loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
    def layer(h: sg.Tensor, wl: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        h = sg.tanh(clip_gradient(h @ wl) * 2.0)
        return h, binarize(h).sum()

    h, ys = sg.scan(layer, x, w)
    return (h * 3.0).sum() + ys.sum()


@pytest.mark.parametrize("mode", MODES)
def test_vmap_and_grad_of_a_scan_with_custom_rules_match_a_loop(mode: str) -> None:
    rng = np.random.default_rng(6)
    ws, xs = rng.normal(size=(L, D, D)), rng.normal(size=(5, D))
    per_example = [sg.grad(_per_example_loss)(f64(ws), f64(x)).numpy() for x in xs]
    inside = run(sg.vmap(sg.grad(_per_example_loss), in_axes=(None, 0)), mode)
    got = inside(f64(ws), f64(xs)).numpy()
    np.testing.assert_allclose(got, np.stack(per_example), rtol=1e-9, atol=1e-14)

    def total(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return sg.vmap(_per_example_loss, in_axes=(None, 0))(w, x).sum()

    outside = run(sg.grad(total), mode)(f64(ws), f64(xs))
    np.testing.assert_allclose(outside.numpy(), sum(per_example), rtol=1e-9, atol=1e-14)
