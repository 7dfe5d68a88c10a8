"""Semantics of the eager tape: accumulation, gradient frontiers, deep chains, errors, lifetime,
higher-order gradients and ``sg.check_numerics``. Expected values are closed forms."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import shapegrad as sg


def f64(value: object) -> sg.Tensor:
    return sg.tensor(np.asarray(value, dtype=np.float64))


X = np.array([0.3, -1.2, 2.0])


def test_fan_out_accumulates() -> None:
    def f(x: sg.Tensor) -> sg.Tensor:
        y = x * 2.0  # used three times below
        return sg.sum(y * y + sg.sin(y) + y)

    g = sg.grad(f)(f64(X))
    np.testing.assert_allclose(g.numpy(), 2.0 * (2.0 * (2 * X) + np.cos(2 * X) + 1.0), rtol=1e-12)


def test_same_argument_twice_accumulates() -> None:
    ga, gb = sg.grad(lambda a, b: sg.sum(a * b), argnums=(0, 1))(f64(X), f64(X))
    np.testing.assert_allclose(ga.numpy(), X)
    np.testing.assert_allclose(gb.numpy(), X)
    g = sg.grad(lambda x: sg.sum(x * x * x))(f64(X))
    np.testing.assert_allclose(g.numpy(), 3 * X**2, rtol=1e-12)


def test_no_grad_blocks_gradient_and_recording() -> None:
    def f(x: sg.Tensor) -> sg.Tensor:
        with sg.no_grad():
            c = x * 3.0  # a constant as far as autodiff is concerned
        return sg.sum(x * c)

    np.testing.assert_allclose(sg.grad(f)(f64(X)).numpy(), 3 * X, rtol=1e-12)
    plain = f64(X) * 2.0  # nothing tracked: no tape is kept for ordinary inference
    assert plain._tape is None


@pytest.mark.parametrize("cut", [sg.stop_gradient, sg.detach, lambda t: t.detach()])
def test_stop_gradient_and_detach(cut: object) -> None:
    g = sg.grad(lambda x: sg.sum(x * cut(x)))(f64(X))  # type: ignore[operator]
    np.testing.assert_allclose(g.numpy(), X, rtol=1e-12)  # d/dx [x * const] with const = x


def test_unconnected_argument_gets_zeros() -> None:
    ga, gb = sg.grad(lambda a, b: sg.sum(a * 2.0), argnums=(0, 1))(f64(X), f64([[1.0, 2.0]]))
    np.testing.assert_array_equal(ga.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(gb.numpy(), [[0.0, 0.0]])


def test_100k_op_chain_has_no_recursion_error() -> None:
    def chain(x: sg.Tensor) -> sg.Tensor:
        for _ in range(100_000):
            x = -x
        return x

    assert sg.grad(chain)(f64(0.5)).item() == 1.0


def test_non_scalar_output_is_rejected_clearly() -> None:
    with pytest.raises(sg.ShapeError, match=r"scalar.*\[3\]") as info:
        sg.grad(lambda x: x * 2.0)(f64(X))
    assert "test_tape.py" in str(info.value)
    with pytest.raises(TypeError, match="scalar Tensor"):
        sg.grad(lambda x: 1.0)(f64(X))
    with pytest.raises(TypeError, match="floating point"):
        sg.grad(lambda x: sg.sum(x).astype("int32"))(f64(X))
    with pytest.raises(TypeError, match="int32"):
        sg.grad(lambda x: sg.sum(x))(sg.tensor([1, 2]))


def test_vjp_of_non_scalar_output_and_wrong_cotangent() -> None:
    out, pullback = sg.vjp(lambda x: x * x, f64(X))
    (g,) = pullback(f64([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(g.numpy(), 2 * X * [1.0, 2.0, 3.0], rtol=1e-12)
    _, pullback = sg.vjp(lambda x: x * x, f64(X))
    with pytest.raises(
        sg.ShapeError, match=r"cotangent shape \[2\] differs from output shape \[3\]"
    ):
        pullback(f64([1.0, 2.0]))


def test_gradients_sum_over_broadcast_axes() -> None:
    rng = np.random.default_rng(0)
    a, b, ct = rng.standard_normal((3, 1)), rng.standard_normal((1, 4)), rng.standard_normal((3, 4))
    ga, gb = sg.grad(lambda a, b: sg.sum((a + b) * f64(ct)), argnums=(0, 1))(f64(a), f64(b))
    np.testing.assert_allclose(ga.numpy(), ct.sum(axis=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(gb.numpy(), ct.sum(axis=0, keepdims=True), rtol=1e-12)
    # rank-extending broadcast: a [4] against [2, 3, 4]
    c = rng.standard_normal((2, 3, 4))
    g = sg.grad(lambda v: sg.sum(v * f64(c)))(f64(np.ones(4)))
    np.testing.assert_allclose(g.numpy(), c.sum(axis=(0, 1)), rtol=1e-12)


def test_tape_is_freed_after_backward() -> None:
    refs: list[weakref.ref[sg.Tensor]] = []

    def f(x: sg.Tensor) -> sg.Tensor:
        hidden = sg.exp(x) * 2.0
        refs.append(weakref.ref(hidden))
        return sg.sum(hidden * hidden)

    value, g = sg.value_and_grad(f)(f64(X))
    gc.collect()
    assert refs[0]() is None, "an intermediate of the forward pass outlived backward"
    assert value._tape is None and g._tape is None
    np.testing.assert_allclose(g.numpy(), 8 * np.exp(2 * X), rtol=1e-12)


def test_second_derivative_of_cube() -> None:
    d2 = sg.grad(sg.grad(lambda x: x**3))(f64(1.7))
    assert d2.item() == pytest.approx(6 * 1.7, rel=1e-12)
    d3 = sg.grad(sg.grad(sg.grad(lambda x: x**3)))(f64(1.7))
    assert d3.item() == pytest.approx(6.0, rel=1e-12)


def test_second_derivative_through_pow_and_vector_input() -> None:
    second = sg.grad(lambda x: sg.sum(sg.grad(lambda y: sg.sum(y**3.5))(x)))(f64([0.5, 2.0]))
    np.testing.assert_allclose(second.numpy(), 3.5 * 2.5 * np.array([0.5, 2.0]) ** 1.5, rtol=1e-10)


# --- check_numerics -----------------------------------------------------------------------


def test_non_finite_values_are_allowed_by_default() -> None:
    assert np.isneginf(sg.log(f64(0.0)).item())


def test_check_numerics_names_the_first_bad_op() -> None:
    x = f64([1.0, 0.0])
    with sg.check_numerics():
        shifted = x - 1.0  # finite: [0, -1]
        with pytest.raises(FloatingPointError) as info:
            sg.exp(sg.sqrt(shifted))  # sqrt(-1) is the first NaN; exp never runs
    message = str(info.value)
    assert "sqrt" in message and "exp" not in message
    assert "test_tape.py" in message
    with sg.check_numerics(), pytest.raises(FloatingPointError, match="log"):
        sg.log(x)  # log(0) = -inf
    sg.log(x)  # the context ended: allowed again


def test_check_numerics_catches_backward_ops() -> None:
    x = f64([0.0, 4.0])
    with sg.check_numerics(), pytest.raises(FloatingPointError, match="div"):
        sg.grad(lambda x: sg.sum(sg.sqrt(x)))(x)  # d sqrt / dx = 1 / (2 sqrt(0)) = inf


def test_composites_are_clean_under_check_numerics() -> None:
    """No composite creates a non-finite intermediate on finite input (padding, masks, shifts)."""
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((2, 3, 6, 6)))
    w = sg.tensor(rng.standard_normal((4, 3, 3, 3)))
    logits = sg.tensor(rng.uniform(-1e3, 1e3, (5, 4)))
    labels = sg.tensor(np.array([0, 3, 1, 1, 2], dtype=np.int32))

    def loss(x: sg.Tensor, w: sg.Tensor, logits: sg.Tensor) -> sg.Tensor:
        y = sg.max_pool2d(sg.conv2d(x, w, padding=1), 3, stride=2, padding=1)
        h = sg.layer_norm(sg.reshape(y, (2, -1))) + sg.avg_pool2d(x, 2, padding=1).mean()
        return sg.mean(h) + sg.cross_entropy(logits, labels) + sg.logsumexp(logits)

    with sg.check_numerics():
        grads = sg.grad(loss, argnums=(0, 1, 2))(x, w, logits)
    assert all(np.all(np.isfinite(g.numpy())) for g in grads)
