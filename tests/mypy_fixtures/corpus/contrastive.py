"""A SimCLR-style contrastive loss: normalised embeddings of two views, a similarity matrix."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def embed(x: Float[Tensor, "b i"], w: Float[Tensor, "e i"]) -> Float[Tensor, "b e"]:
    z = x @ w.T
    return z / sg.sqrt((z * z).sum(axis=1, keepdims=True) + 1e-8)


@sg.typechecked
def info_nce(
    a: Float[Tensor, "b i"], b: Float[Tensor, "b i"], w: Float[Tensor, "e i"]
) -> Float[Tensor, ""]:
    za, zb = embed(a, w), embed(b, w)
    logits = za @ zb.T / 0.1  # [b, b]
    labels = sg.tensor(np.arange(a.shape[0], dtype=np.int32))
    return sg.cross_entropy(logits, labels)


def run() -> float:
    x = sg.rand((4, 6))
    return float(info_nce(x, x + 0.01 * sg.randn((4, 6)), sg.randn((3, 6))).item())
