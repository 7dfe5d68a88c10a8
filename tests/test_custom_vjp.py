"""``sg.custom_vjp``: a hand-written backward honoured by the eager tape and by compiled
differentiation (numpy and C backends), checked against hand-computed gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

MODES = ["eager", "numpy", "c"]


def f64(a: Any) -> sg.Tensor:
    return sg.tensor(np.asarray(a, dtype=np.float64), dtype="float64")


def run(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return fn if mode == "eager" else sg.compile(fn, backend=mode)


# A straight-through estimator: a step forward, the identity backward inside |x| <= 1.
@sg.custom_vjp
def binarize(x: sg.Tensor) -> sg.Tensor:
    return sg.where(x > 0, 1.0, 0.0).astype(x.dtype)


def _binarize_fwd(x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    return binarize(x), x  # the decorated function, called from its own fwd, runs plainly


def _binarize_bwd(x: sg.Tensor, g: sg.Tensor) -> tuple[sg.Tensor]:
    return (sg.where(sg.abs(x) <= 1.0, g, 0.0),)


binarize.defvjp(_binarize_fwd, _binarize_bwd)


# Gradient clipping inside the graph: the identity forward, the cotangent clipped backward.
@sg.custom_vjp
def clip_gradient(x: sg.Tensor) -> sg.Tensor:
    return x


clip_gradient.defvjp(lambda x: (x, None), lambda _, g: (sg.clip(g, -1.0, 1.0),))

X = np.array([-1.5, -0.5, 0.25, 0.75, 2.0])
W = np.array([3.0, -0.2, 0.5, -4.0, 1.0])


@pytest.mark.parametrize("mode", MODES)
def test_straight_through_estimator(mode: str) -> None:
    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (binarize(x) * w).sum() * 2.0

    value, (gx, gw) = run(sg.value_and_grad(loss, argnums=(0, 1)), mode)(f64(X), f64(W))
    step = (X > 0).astype(np.float64)
    np.testing.assert_allclose(value.numpy(), 2.0 * np.sum(step * W), rtol=1e-12)
    # by hand: d/dx passes 2 w straight through where |x| <= 1; d/dw is 2 step(x)
    np.testing.assert_allclose(gx.numpy(), np.where(np.abs(X) <= 1.0, 2.0 * W, 0.0), rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), 2.0 * step, rtol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_gradient_clipping_in_the_backward(mode: str) -> None:
    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (sg.exp(clip_gradient(x * w)) * 3.0).sum()

    gx, gw = run(sg.grad(loss, argnums=(0, 1)), mode)(f64(X), f64(W))
    upstream = 3.0 * np.exp(X * W)  # the cotangent reaching clip_gradient
    clipped = np.clip(upstream, -1.0, 1.0)
    np.testing.assert_allclose(gx.numpy(), clipped * W, rtol=1e-12)
    np.testing.assert_allclose(gw.numpy(), clipped * X, rtol=1e-12)
    assert not np.allclose(clipped, upstream)  # the clip did act


@pytest.mark.parametrize("mode", MODES)
def test_pytree_arguments_and_outputs(mode: str) -> None:
    @sg.custom_vjp
    def polar(p: dict[str, sg.Tensor]) -> tuple[sg.Tensor, sg.Tensor]:
        return p["r"] * sg.cos(p["t"]), p["r"] * sg.sin(p["t"])

    def fwd(p: dict[str, sg.Tensor]) -> tuple[Any, Any]:
        return polar(p), p

    def bwd(p: dict[str, sg.Tensor], g: tuple[sg.Tensor, sg.Tensor]) -> tuple[Any]:
        gx, gy = g
        t = p["t"]
        # the true derivative, halved: shows the user's rule is the one applied
        return ({"r": 0.5 * (gx * sg.cos(t) + gy * sg.sin(t)), "t": None},)

    polar.defvjp(fwd, bwd)
    r, t = np.array([1.0, 2.0]), np.array([0.3, -1.2])

    def loss(p: dict[str, sg.Tensor]) -> sg.Tensor:
        x, y = polar(p)
        return (x * 2.0 + y * y).sum()

    g = run(sg.grad(loss), mode)({"r": f64(r), "t": f64(t)})
    gx, gy = 2.0, 2.0 * r * np.sin(t)
    np.testing.assert_allclose(g["r"].numpy(), 0.5 * (gx * np.cos(t) + gy * np.sin(t)), rtol=1e-12)
    np.testing.assert_allclose(g["t"].numpy(), 0.0)


def test_higher_order_through_residuals_and_forward_mode() -> None:
    @sg.custom_vjp
    def my_exp(x: sg.Tensor) -> sg.Tensor:
        return sg.exp(x)

    def fwd(x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        y = sg.exp(x)
        return y, y

    my_exp.defvjp(fwd, lambda y, g: (g * y,))
    x = f64([0.5, -1.0])
    # the residual is connected to x, so the backward is differentiated again
    h = sg.hessian(lambda x: my_exp(x).sum())(x)
    np.testing.assert_allclose(h.numpy(), np.diag(np.exp(x.numpy())), rtol=1e-12)
    h_c = sg.compile(sg.hessian(lambda x: my_exp(x).sum()), backend="c")(x)
    np.testing.assert_allclose(h_c.numpy(), np.diag(np.exp(x.numpy())), rtol=1e-12)
    # forward mode transposes the (linear) user backward: the STE's tangent passes through
    _, tangent = sg.jvp(binarize, (f64(X),), (f64(W),))
    np.testing.assert_allclose(tangent.numpy(), np.where(np.abs(X) <= 1.0, W, 0.0), rtol=1e-12)


def test_forward_only_and_nested_grad() -> None:
    out = binarize(f64(X))
    np.testing.assert_allclose(out.numpy(), (X > 0).astype(np.float64))
    compiled = sg.compile(lambda x: binarize(x) * 2.0, backend="c")(f64(X))
    np.testing.assert_allclose(compiled.numpy(), 2.0 * (X > 0))
    # an unused custom output, and a custom function of a non-differentiated input
    g = sg.grad(lambda w: (w * binarize(f64(X))).sum())(f64(W))
    np.testing.assert_allclose(g.numpy(), (X > 0).astype(np.float64))


def test_compiled_programs_with_a_custom_vjp_are_keyed_by_content() -> None:
    from shapegrad.compiler.graphkey import graph_text

    def step(x: sg.Tensor) -> Any:
        return sg.value_and_grad(lambda x: (clip_gradient(x) * 3.0).sum())(x)

    texts = [graph_text(sg.compile(step, backend="c").trace(f64(X)).graph) for _ in range(2)]
    assert texts[0] == texts[1]  # two traces, two calls: one key (the serial is not in it)
    assert "custom_vjp" in texts[0]  # the marker is there, as the identity


def test_errors_name_the_function_and_the_problem() -> None:
    @sg.custom_vjp
    def undefined(x: sg.Tensor) -> sg.Tensor:
        return x

    with pytest.raises(
        TypeError, match=r"custom_vjp undefined: no VJP defined; call undefined.defvjp"
    ):
        undefined(f64(X))

    @sg.custom_vjp
    def bad(x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return x * y

    bad.defvjp(lambda x, y: (x * y, None), lambda _, g: (g,))
    with pytest.raises(
        TypeError, match=r"bwd must return a tuple with one cotangent per argument \(2\)"
    ):
        sg.grad(lambda x: bad(x, x).sum())(f64(X))
    bad.defvjp(lambda x, y: (x * y, None), lambda _, g: (g[:2], None))
    with pytest.raises(
        sg.ShapeError, match=r"cotangent of shape \[2\] for input leaf 0 of shape \[5\]"
    ):
        sg.grad(lambda x: bad(x, x).sum())(f64(X))
    bad.defvjp(lambda x, y: x * y, lambda _, g: (g, g))
    with pytest.raises(TypeError, match=r"fwd must return \(output, residuals\)"):
        bad(f64(X), f64(X))
    with pytest.raises(TypeError, match="takes two functions"):
        bad.defvjp(None, None)  # type: ignore[arg-type]
