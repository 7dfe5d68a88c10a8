"""Multi-head attention from the library pieces: split_heads, scaled_dot_product_attention, merge_heads."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn.attention import merge_heads, scaled_dot_product_attention, split_heads

HEADS = 2


@sg.typechecked
def attend(
    x: Float[Tensor, "b t d"],
    memory: Float[Tensor, "b s d"],
    w_q: Float[Tensor, "d d"],
    w_kv: Float[Tensor, "2*d d"],
    w_o: Float[Tensor, "d d"],
) -> Float[Tensor, "b t d"]:
    D = x.shape[2]
    kv = memory @ w_kv.T
    q = split_heads(x @ w_q.T, HEADS)
    k = split_heads(kv[:, :, :D], HEADS)
    v = split_heads(kv[:, :, D:], HEADS)
    out = scaled_dot_product_attention(q, k, v)
    return merge_heads(out) @ w_o.T


def run() -> float:
    y = attend(sg.rand((2, 3, 8)), sg.rand((2, 5, 8)), sg.randn((8, 8)), sg.randn((16, 8)),
               sg.randn((8, 8)))  # fmt: skip
    return float(y.sum().item())
