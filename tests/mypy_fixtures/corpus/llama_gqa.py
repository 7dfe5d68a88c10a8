"""Grouped-query attention (LLaMA-2 style): few key/value heads broadcast over query groups."""

import math

import shapegrad as sg
from shapegrad import Float, Tensor

Q_HEADS, KV_HEADS = 4, 2


@sg.typechecked
def gqa(
    x: Float[Tensor, "b t d"],
    w_q: Float[Tensor, "d d"],
    w_kv: Float[Tensor, "d e"],
    w_o: Float[Tensor, "d d"],
) -> Float[Tensor, "b t d"]:
    B, T, D = x.shape
    hd = D // Q_HEADS
    G = Q_HEADS // KV_HEADS
    q = (x @ w_q).reshape(B, T, KV_HEADS, G, hd).transpose(0, 2, 3, 1, 4)  # [b, kv, g, t, hd]
    kv = x @ w_kv  # [b, t, 2 * kv * hd]
    k = kv[:, :, : KV_HEADS * hd].reshape(B, T, KV_HEADS, hd).transpose(0, 2, 1, 3)
    v = kv[:, :, KV_HEADS * hd :].reshape(B, T, KV_HEADS, hd).transpose(0, 2, 1, 3)
    scores = q @ k[:, :, None, :, :].transpose(0, 1, 2, 4, 3) / math.sqrt(hd)  # [b, kv, g, t, t]
    out = sg.softmax(scores, axis=-1) @ v[:, :, None, :, :]  # [b, kv, g, t, hd]
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, D) @ w_o


def run() -> float:
    y = gqa(sg.rand((2, 3, 8)), sg.randn((8, 8)), sg.randn((8, 8)), sg.randn((8, 8)))
    return float(y.sum().item())
