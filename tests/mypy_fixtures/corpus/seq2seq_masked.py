"""Decoder cross-attention over an encoder memory, with a causal self-attention first."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import scaled_dot_product_attention


@sg.typechecked
def decoder_layer(
    y: Float[Tensor, "b t d"],
    memory: Float[Tensor, "b s d"],
    w_self: Float[Tensor, "d 3*d"],
    w_cross_q: Float[Tensor, "d d"],
    w_cross_kv: Float[Tensor, "d 2*d"],
) -> Float[Tensor, "b t d"]:
    D = y.shape[2]
    qkv = y @ w_self
    y = y + scaled_dot_product_attention(
        qkv[:, :, :D], qkv[:, :, D : 2 * D], qkv[:, :, 2 * D :], causal=True
    )
    kv = memory @ w_cross_kv
    return y + scaled_dot_product_attention(y @ w_cross_q, kv[:, :, :D], kv[:, :, D:])


def run() -> float:
    out = decoder_layer(sg.rand((2, 3, 4)), sg.rand((2, 5, 4)), sg.randn((4, 12)),
                        sg.randn((4, 4)), sg.randn((4, 8)))  # fmt: skip
    return float(out.sum().item())
