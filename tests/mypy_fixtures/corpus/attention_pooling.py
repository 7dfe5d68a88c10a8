"""Attention pooling: a learned query summarises a variable-length sequence, with a mask."""

import numpy as np

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


@sg.typechecked
def attention_pool(
    seq: Float[Tensor, "b t d"], query: Float[Tensor, " d"], valid: Bool[Tensor, "b t"]
) -> Float[Tensor, "b d"]:
    scores = seq @ query  # [b, t]
    scores = sg.where(valid, scores, -1e9)
    weights = sg.softmax(scores, axis=1)
    return (seq * weights[:, :, None]).sum(axis=1)


def run() -> float:
    lengths = np.array([3, 5])
    valid = sg.tensor(np.arange(5)[None, :] < lengths[:, None])
    pooled = attention_pool(sg.rand((2, 5, 4)), sg.randn((4,)), valid)
    return float(pooled.sum().item())
