"""A self-attention encoder layer on sg.nn.multi_head_attention with a padding mask."""

import numpy as np

import shapegrad as sg
from shapegrad import Bool, Float, Tensor
from shapegrad.nn import AttentionParams


@sg.typechecked
def encoder_layer(
    p: AttentionParams,
    x: Float[Tensor, "b t d"],
    valid: Bool[Tensor, "b t"],
    w_ff: Float[Tensor, "d d"],
) -> Float[Tensor, "b t d"]:
    mask = valid[:, None, None, :]
    h = x + sg.nn.multi_head_attention(p, x, 2, mask=mask)
    return h + sg.relu(h @ w_ff.T)


def run() -> float:
    p = AttentionParams.init(sg.nn.attention.attention_init(), seed=0, d=8)
    valid = sg.tensor(np.array([[True, True, False], [True, True, True]]))
    y = encoder_layer(p, sg.rand((2, 3, 8)), valid, sg.randn((8, 8)))
    return float(y.sum().item())
