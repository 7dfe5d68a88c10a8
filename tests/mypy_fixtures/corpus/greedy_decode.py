"""Greedy autoregressive decoding: argmax of the last position, appended with concat."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def next_logits(
    ids: Int[Tensor, "b t"], table: Float[Tensor, "v d"], w_out: Float[Tensor, "v d"]
) -> Float[Tensor, "b v"]:
    h = sg.embedding(table, ids).mean(axis=1)  # [b, d]
    return h @ w_out.T


def decode(start: Int[Tensor, "b 1"], table: Tensor, w_out: Tensor, steps: int) -> Tensor:
    ids = start
    for _ in range(steps):
        best = sg.argmax(next_logits(ids, table, w_out), axis=-1)  # [b]
        ids = sg.concat([ids, best.reshape(-1, 1)], axis=1)
    return ids


def run() -> float:
    start = sg.tensor(np.array([[1], [2]], dtype=np.int32))
    out = decode(start, sg.randn((7, 4)), sg.randn((7, 4)), 3)
    return float(out.sum().item())
