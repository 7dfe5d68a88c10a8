"""A 2-hidden-layer MLP trained 100 SGD steps eagerly and compiled (numpy backend): same curve."""

from __future__ import annotations

from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.tensor import Tensor
from shapegrad.typing import ParamList

STEPS = 100


def init_params(seed: int = 0) -> ParamList:  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)
    sizes = [(2, 16), (16, 16), (16, 1)]
    tensors = []
    for fan_in, fan_out in sizes:
        tensors.append(
            sg.tensor(rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in), "float32")
        )
        tensors.append(sg.tensor(np.zeros(fan_out), "float32"))
    return ParamList(tensors, names=["w1", "b1", "w2", "b2", "w3", "b3"])


def loss_fn(params: Any, x: Tensor, y: Tensor) -> Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.tanh(x @ w1 + b1)
    h = sg.relu(h @ w2 + b2)
    scores = (h @ w3 + b3).reshape(-1)
    return sg.relu(1.0 - y * scores).mean()  # hinge loss, labels in {-1, 1}


def sgd_step(params: Any, x: Tensor, y: Tensor, lr: Tensor | float) -> tuple[Tensor, Any]:
    loss, grads = sg.value_and_grad(loss_fn)(params, x, y)
    return loss, params.map(lambda p, g: p - lr * g, grads)


def dataset(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((32, 2)).astype(np.float32)
    y = np.where(x[:, 0] * x[:, 1] > 0, 1.0, -1.0).astype(np.float32)
    return x, y


def test_100_sgd_steps_eager_and_compiled_give_the_same_loss_curve() -> None:
    x, y = dataset()
    xt, yt = sg.tensor(x), sg.tensor(y)
    eager_params = compiled_params = init_params()
    fast = sg.compile(sgd_step)
    eager_curve, compiled_curve = [], []
    for _ in range(STEPS):
        loss, eager_params = sgd_step(eager_params, xt, yt, 0.1)
        eager_curve.append(loss.item())
        closs, compiled_params = fast(compiled_params, x, y, 0.1)
        compiled_curve.append(closs.item())
    assert fast.trace_count == 1
    assert isinstance(compiled_params, ParamList)
    assert np.max(np.abs(np.array(eager_curve) - np.array(compiled_curve))) <= 1e-5
    assert compiled_curve[-1] < compiled_curve[0]  # it actually trains
    for a, b in zip(eager_params, compiled_params, strict=True):
        np.testing.assert_allclose(b.numpy(), a.numpy(), atol=1e-4)
