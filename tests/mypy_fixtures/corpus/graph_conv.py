"""A two-layer graph convolution with symmetric degree normalisation (dense adjacency)."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor


def normalise(adj: np.ndarray) -> np.ndarray:
    a = adj + np.eye(adj.shape[0])
    d = 1.0 / np.sqrt(a.sum(axis=1))
    return (a * d[:, None] * d[None, :]).astype(np.float32)


@sg.typechecked
def gcn(
    a_hat: Float[Tensor, "n n"],
    features: Float[Tensor, "n f"],
    w1: Float[Tensor, "f h"],
    w2: Float[Tensor, "h c"],
) -> Float[Tensor, "n c"]:
    h = sg.relu(a_hat @ features @ w1)
    return sg.log_softmax(a_hat @ h @ w2, axis=-1)


def run() -> float:
    rng = np.random.default_rng(0)
    adj = (rng.random((6, 6)) > 0.6).astype(np.float64)
    adj = np.maximum(adj, adj.T)
    out = gcn(sg.tensor(normalise(adj)), sg.rand((6, 5)), sg.randn((5, 4)), sg.randn((4, 3)))
    return float(out.sum().item())
