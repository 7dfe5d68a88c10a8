"""``sg.custom_jvp``: the user's JVP rule, honoured by jvp/linearize/jacfwd and by grad.

Rules below are chosen to differ from the function's true derivative where that shows
the rule is used (not the function differentiated); references are hand-computed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg

X = np.array([0.5, -1.0, 2.0], np.float32)
Y = np.array([2.0, -1.0, 0.5], np.float32)
TX = np.array([1.0, 0.5, -2.0], np.float32)
TY = np.array([0.25, 1.0, 3.0], np.float32)


@sg.custom_jvp
def scaled(x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return sg.sin(x) * y


# Not sin's derivative: d/dx is 2*y, d/dy is 3, so only the rule can produce these.
scaled.defjvp(lambda p, t: (scaled(*p), 2.0 * p[1] * t[0] + 3.0 * t[1]))


@sg.custom_jvp
def log1pexp(x: sg.Tensor) -> sg.Tensor:
    return sg.log(1.0 + sg.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(p: tuple[Any, ...], t: tuple[Any, ...]) -> tuple[Any, Any]:
    return log1pexp(p[0]), sg.sigmoid(p[0]) * t[0]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _jvp(a: Any, b: Any, ta: Any, tb: Any) -> Any:
    return sg.jvp(scaled, (a, b), (ta, tb))


def _grads(a: Any, b: Any) -> Any:
    return sg.grad(lambda u, v: (scaled(u, v) * sg.tensor([1.0, 2.0, 3.0])).sum(), (0, 1))(a, b)


@pytest.mark.parametrize("backend", [None, "numpy", "c"])
def test_jvp_uses_the_rule(backend: str | None) -> None:
    run = _jvp if backend is None else sg.compile(_jvp, backend=backend)
    out, tangent = run(sg.tensor(X), sg.tensor(Y), sg.tensor(TX), sg.tensor(TY))
    np.testing.assert_allclose(out.numpy(), np.sin(X) * Y, rtol=1e-6)
    np.testing.assert_allclose(tangent.numpy(), 2 * Y * TX + 3 * TY, rtol=1e-6)


@pytest.mark.parametrize("backend", [None, "numpy", "c"])
def test_reverse_mode_is_the_rules_transpose(backend: str | None) -> None:
    run = _grads if backend is None else sg.compile(_grads, backend=backend)
    gx, gy = run(sg.tensor(X), sg.tensor(Y))
    w = np.array([1.0, 2.0, 3.0], np.float32)
    np.testing.assert_allclose(gx.numpy(), 2 * Y * w, rtol=1e-6)
    np.testing.assert_allclose(gy.numpy(), 3 * w, rtol=1e-6)


def test_linearize_and_jacfwd_use_the_rule() -> None:
    y, f_jvp = sg.linearize(log1pexp, sg.tensor(X))
    np.testing.assert_allclose(y.numpy(), np.log1p(np.exp(X)), rtol=1e-6)
    np.testing.assert_allclose(f_jvp(sg.tensor(TX)).numpy(), sigmoid(X) * TX, rtol=1e-6)
    jac = sg.jacfwd(log1pexp)(sg.tensor(X)).numpy()
    np.testing.assert_allclose(jac, np.diag(sigmoid(X)), rtol=1e-6, atol=1e-7)


def test_second_derivative_differentiates_the_rule() -> None:
    """The Hessian of sum(log1pexp) goes through the rule's sigmoid: diag(s * (1 - s))."""
    hess = sg.hessian(lambda x: log1pexp(x).sum())(sg.tensor(X)).numpy()
    s = sigmoid(X)
    np.testing.assert_allclose(hess, np.diag(s * (1 - s)), rtol=1e-5, atol=1e-6)


def test_an_integer_argument_gets_zero_tangents() -> None:
    @sg.custom_jvp
    def shift(x: sg.Tensor, k: sg.Tensor) -> sg.Tensor:
        return x * k.astype(x.dtype)

    seen: list[Any] = []

    def rule(p: tuple[Any, ...], t: tuple[Any, ...]) -> tuple[Any, Any]:
        seen.append(t[1].numpy() if not t[1].is_traced else None)
        return shift(*p), 5.0 * t[0]

    shift.defjvp(rule)
    k = sg.tensor(np.array([1, 2, 3], np.int32))
    g = sg.grad(lambda x: shift(x, k).sum())(sg.tensor(X))
    np.testing.assert_allclose(g.numpy(), [5.0, 5.0, 5.0])
    np.testing.assert_array_equal(seen[0], [0, 0, 0])


def test_errors_name_the_function_and_what_is_wrong() -> None:
    @sg.custom_jvp
    def f(x: sg.Tensor) -> sg.Tensor:
        return x * 2.0

    with pytest.raises(TypeError, match=r"custom_jvp f: no JVP rule defined; call f.defjvp"):
        f(sg.tensor(X))
    with pytest.raises(TypeError, match="defjvp\\(rule\\) takes a function"):
        f.defjvp(3)  # type: ignore[arg-type]
    f.defjvp(lambda p, t: t[0])  # returns the tangent alone: not a pair
    with pytest.raises(TypeError, match=r"must return \(output, tangent_output\), got Tensor"):
        sg.grad(lambda x: f(x).sum())(sg.tensor(X))


@sg.custom_jvp
def pair(p: dict[str, sg.Tensor], x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    return p["a"] * x, sg.exp(x)


# Not the true derivative (d out0/da is x, d out1/dx is exp(x)): 2x and 7 show the rule.
pair.defjvp(lambda pr, t: (pair(*pr), (pr[0]["a"] * t[1] + 2.0 * t[0]["a"] * pr[1], 7.0 * t[1])))


def _pair_jvp(a: Any, x: Any, ta: Any, tx: Any) -> Any:
    return sg.jvp(pair, ({"a": a}, x), ({"a": ta}, tx))[1]


@pytest.mark.parametrize("backend", [None, "c"])
def test_pytree_arguments_and_several_outputs(backend: str | None) -> None:
    a, x = np.array([1.0, 2.0], np.float32), np.array([3.0, 4.0], np.float32)
    ta, tx = np.array([1.0, -1.0], np.float32), np.array([0.5, 0.25], np.float32)
    run = _pair_jvp if backend is None else sg.compile(_pair_jvp, backend=backend)
    t0, t1 = run(*(sg.tensor(v) for v in (a, x, ta, tx)))
    np.testing.assert_allclose(t0.numpy(), a * tx + 2 * ta * x, rtol=1e-6)
    np.testing.assert_allclose(t1.numpy(), 7 * tx, rtol=1e-6)
    ga, gx = sg.grad(lambda p, v: sum(o.sum() for o in pair(p, v)), (0, 1))(
        {"a": sg.tensor(a)}, sg.tensor(x)
    )
    np.testing.assert_allclose(ga["a"].numpy(), 2 * x, rtol=1e-6)
    np.testing.assert_allclose(gx.numpy(), a + 7, rtol=1e-6)
