"""Smoke tests of the foundation: eager ops, tape autodiff, errors."""

import numpy as np
import pytest

import shapegrad as sg


def test_matmul_relu_grad_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 2))
    x = rng.standard_normal((4, 2))
    loss, g = sg.value_and_grad(lambda w, x: sg.relu(x @ w.T).sum())(sg.tensor(w), sg.tensor(x))
    h = x @ w.T
    assert np.isclose(loss.item(), np.maximum(h, 0).sum())
    np.testing.assert_allclose(g.numpy(), ((h > 0).astype(float)).T @ x, rtol=1e-12)


def test_deep_chain_does_not_recurse() -> None:
    def chain(x: sg.Tensor) -> sg.Tensor:
        for _ in range(20000):
            x = x * 1.0001
        return x

    g = sg.grad(chain)(sg.tensor(1.0, dtype="float64"))
    assert np.isclose(g.item(), 1.0001**20000)


def test_shape_error_names_op_dims_and_line() -> None:
    a = sg.tensor(np.zeros((3, 3), np.float32))
    b = sg.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(sg.ShapeError) as info:
        a + b
    message = str(info.value)
    assert "add" in message and "[3, 3]" in message and "[2, 3]" in message
    assert "test_core_smoke.py" in message


def test_nonscalar_grad_is_rejected() -> None:
    with pytest.raises(sg.ShapeError, match="scalar"):
        sg.grad(lambda x: x * 2.0)(sg.tensor([1.0, 2.0]))
