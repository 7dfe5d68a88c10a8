"""``sg.checkpoint``: gradients equal the plain function's (eager and compiled), nested
regions, randomness replayed, and the C memory plan shows the saving."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES

POLICIES = ["recompute", "residuals"]


def _mode(name: str) -> Any:
    runner = MODES[name]
    reason = runner.unavailable()
    if reason:
        pytest.skip(reason)
    return runner


def _block(h: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
    return sg.gelu(h @ w) + sg.tanh(h) * 0.5


def _loss(wrap: Any) -> Any:
    def loss(x: sg.Tensor, w1: sg.Tensor, w2: sg.Tensor) -> sg.Tensor:
        h = wrap(_block)(x, w1)
        h = wrap(_block)(h, w2)
        return (h * h).mean()

    return loss


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(4, 6)), rng.normal(size=(6, 6)) * 0.5, rng.normal(size=(6, 6)) * 0.5]


@pytest.mark.parametrize("mode", ["eager", "numpy", "c"])
@pytest.mark.parametrize("policy", POLICIES)
def test_gradients_equal_the_plain_function(mode: str, policy: str) -> None:
    runner = _mode(mode)
    checkpointed = _loss(lambda f: sg.checkpoint(f, policy=policy))
    plain = _loss(lambda f: f)
    arrays = _arrays()
    (value,) = runner.call(checkpointed, arrays)
    (expected,) = MODES["eager"].call(plain, arrays)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-12)
    grads = runner.grad(checkpointed, arrays, (0, 1, 2))
    for g, e in zip(grads, MODES["eager"].grad(plain, arrays, (0, 1, 2)), strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "c"])
def test_nested_checkpoints(mode: str) -> None:
    runner = _mode(mode)

    def outer(h: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.checkpoint(_block)(sg.checkpoint(_block)(h, w), w) * 2.0

    def nested(x: sg.Tensor, w1: sg.Tensor, w2: sg.Tensor) -> sg.Tensor:
        return (sg.checkpoint(outer)(x, w1) * w2[0]).sum()

    def plain(x: sg.Tensor, w1: sg.Tensor, w2: sg.Tensor) -> sg.Tensor:
        return (_block(_block(x, w1), w1) * 2.0 * w2[0]).sum()

    arrays = _arrays()
    grads = runner.grad(nested, arrays, (0, 1, 2))
    for g, e in zip(grads, MODES["eager"].grad(plain, arrays, (0, 1, 2)), strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["eager", "c"])
def test_dropout_inside_a_region_replays_its_mask(mode: str) -> None:
    runner = _mode(mode)

    def region(h: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.dropout(sg.tanh(h @ w), 0.5, seed=7)

    def checkpointed(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (sg.checkpoint(region)(x, w) ** 2).sum()

    def plain(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (region(x, w) ** 2).sum()

    x, w, _ = _arrays()
    grads = runner.grad(checkpointed, [x, w], (0, 1))
    expected = MODES["eager"].grad(plain, [x, w], (0, 1))
    for g, e in zip(grads, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-12)
    # the mask is really there: about half of the gradient rows of w's product vanish
    (out,) = MODES["eager"].call(lambda x, w: region(x, w), [x, w])
    assert 0.2 < np.mean(out == 0.0) < 0.8


def test_composes_with_value_and_grad_and_vjp() -> None:
    x, w1, w2 = (sg.tensor(a) for a in _arrays())
    value, grads = sg.value_and_grad(_loss(sg.checkpoint), argnums=(1, 2))(x, w1, w2)
    value2, grads2 = sg.value_and_grad(_loss(lambda f: f), argnums=(1, 2))(x, w1, w2)
    assert value.item() == pytest.approx(value2.item(), abs=1e-14)
    out, pullback = sg.vjp(sg.checkpoint(_block), x, w1)
    ct = sg.tensor(np.random.default_rng(1).normal(size=out.shape))
    out2, pullback2 = sg.vjp(_block, x, w1)
    for a, b in zip(pullback(ct), pullback2(ct), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-12)
    for a, b in zip(grads, grads2, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-12)


def test_pytree_outputs_and_static_arguments() -> None:
    def region(h: sg.Tensor, scale: float) -> dict[str, sg.Tensor]:
        return {"a": sg.tanh(h) * scale, "b": (h * h).sum()}

    x = sg.tensor(np.random.default_rng(2).normal(size=(3, 2)))
    out = sg.checkpoint(region)(x, 3.0)
    np.testing.assert_allclose(out["a"].numpy(), np.tanh(x.numpy()) * 3.0)
    g = sg.grad(lambda x: sg.checkpoint(region)(x, 3.0)["b"])(x)
    np.testing.assert_allclose(g.numpy(), 2 * x.numpy())


def test_outputs_of_another_dtype_are_a_clear_error() -> None:
    with pytest.raises(TypeError, match="floating-point"):
        sg.checkpoint(lambda h: sg.argmax(h))(sg.tensor(np.ones((2, 3))))


def test_c_memory_plan_shows_the_saving() -> None:
    if MODES["c"].unavailable():
        pytest.skip(MODES["c"].unavailable())
    rng = np.random.default_rng(3)
    ws = [sg.tensor(rng.normal(size=(128, 128)).astype(np.float32) / 12) for _ in range(6)]
    x = sg.tensor(rng.normal(size=(64, 128)).astype(np.float32))

    def deep(h: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        for _ in range(4):
            h = sg.gelu(h @ w) + h
        return h

    arenas = {}
    for name, wrap in (("plain", lambda f: f), ("checkpoint", sg.checkpoint)):

        def loss(ws: list[sg.Tensor], x: sg.Tensor, wrap: Any = wrap) -> sg.Tensor:
            h = x
            for w in ws:
                h = wrap(deep)(h, w)
            return (h * h).mean()

        fast = sg.compile(sg.value_and_grad(loss), backend="c")
        stats = fast.stats(ws, x)
        arenas[name] = stats.arena_bytes
        assert stats.kernels and stats.compile_seconds > 0
        assert ("layer loops" in stats.summary()) and (stats.layer_loops > 0) == (name != "plain")
    assert arenas["checkpoint"] < 0.6 * arenas["plain"], arenas
