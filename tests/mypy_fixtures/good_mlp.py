"""Correct: a two-layer MLP classifier with a ParamList of weights (no shape errors)."""

# ruff: noqa: F821  (one-name jaxtyping specs such as "b" look like forward references)

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor

Params = ParamList[
    Float[Tensor, "h 784"], Float[Tensor, "h"], Float[Tensor, "10 h"], Float[Tensor, "10"]
]


@sg.typechecked
def mlp(params: Params, x: Float[Tensor, "b 784"]) -> Float[Tensor, "b 10"]:
    w1, b1, w2, b2 = params
    hidden: Float[Tensor, "b h"] = sg.relu(x @ w1.T + b1)
    return hidden @ w2.T + b2


@sg.typechecked
def loss(params: Params, x: Float[Tensor, "b 784"], labels: Int[Tensor, "b"]) -> Float[Tensor, ""]:
    logits = mlp(params, x)
    probs: Float[Tensor, "b 10"] = sg.softmax(logits, axis=-1)
    confident = probs.max(axis=1, keepdims=True)
    _: Float[Tensor, "b 1"] = confident
    return sg.cross_entropy(logits, labels)


def run() -> float:
    rng = np.random.default_rng(0)
    params: Params = Params(
        [
            rng.normal(size=(32, 784)).astype(np.float32),
            np.zeros(32, np.float32),
            rng.normal(size=(10, 32)).astype(np.float32),
            np.zeros(10, np.float32),
        ]
    )
    x: Float[Tensor, "8 784"] = sg.rand((8, 784))
    labels = sg.tensor(np.arange(8, dtype=np.int32))
    return float(loss(params, x, labels).item())
