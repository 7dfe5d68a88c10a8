"""Dropout two ways: sg.dropout with a key, and an explicit sg.random.bernoulli keep-mask."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def forward(
    x: Float[Tensor, "b d"], w1: Float[Tensor, "d h"], w2: Float[Tensor, "h 1"], key: Tensor
) -> Float[Tensor, "b 1"]:
    keys = sg.random.split(key)
    k1, k2 = keys[0], keys[1]
    h = sg.dropout(sg.relu(x @ w1), 0.2, k1)
    keep = sg.random.bernoulli(k2, 0.8, (x.shape[0], w1.shape[1]))
    h = sg.where(keep, h / 0.8, 0.0)
    return h @ w2


def run() -> float:
    y = forward(sg.rand((4, 5)), sg.randn((5, 6)), sg.randn((6, 1)), sg.random.key(3))
    return float(y.sum().item())
