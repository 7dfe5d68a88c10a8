"""Correct: scaled dot-product attention in a pre-norm residual block (no shape errors)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def attention(
    q: Float[Tensor, "b t d"], k: Float[Tensor, "b s d"], v: Float[Tensor, "b s e"]
) -> Float[Tensor, "b t e"]:
    scores: Float[Tensor, "b t s"] = q @ k.transpose(0, 2, 1) / 4.0
    weights = sg.softmax(scores, axis=-1)
    return weights @ v


@sg.typechecked
def block(
    x: Float[Tensor, "b t 16"],
    wq: Float[Tensor, "16 16"],
    wk: Float[Tensor, "16 16"],
    wv: Float[Tensor, "16 16"],
    gamma: Float[Tensor, "16"],
    beta: Float[Tensor, "16"],
) -> Float[Tensor, "b t 16"]:
    h = sg.layer_norm(x, gamma, beta)
    mixed = attention(h @ wq, h @ wk, h @ wv)
    return x + mixed


def run() -> float:
    x: Float[Tensor, "2 5 16"] = sg.randn((2, 5, 16))
    w = sg.randn((16, 16), seed=1)
    out = block(x, w, w, w, sg.ones((16,)), sg.zeros((16,)))
    return float(out.sum().item())
