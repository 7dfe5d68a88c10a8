"""A graph-attention layer: pairwise scores masked by the adjacency matrix, softmax over neighbours."""

import numpy as np

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


@sg.typechecked
def gat(
    x: Float[Tensor, "n f"],
    adj: Bool[Tensor, "n n"],
    w: Float[Tensor, "f h"],
    a_src: Float[Tensor, " h"],
    a_dst: Float[Tensor, " h"],
) -> Float[Tensor, "n h"]:
    h = x @ w  # [n, h]
    scores = (h @ a_src)[:, None] + (h @ a_dst)[None, :]  # [n, n]
    scores = sg.where(adj, sg.relu(scores), -1e9)
    return sg.softmax(scores, axis=-1) @ h


def run() -> float:
    adj = sg.tensor(np.eye(4, dtype=bool) | np.eye(4, k=1, dtype=bool))
    y = gat(sg.rand((4, 3)), adj, sg.randn((3, 5)), sg.randn((5,)), sg.randn((5,)))
    return float(y.sum().item())
