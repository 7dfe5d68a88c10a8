"""A bidirectional transformer encoder layer with padding masks and einsum attention."""

import math

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


@sg.typechecked
def multi_head(
    x: Float[Tensor, "b t d"],
    wq: Float[Tensor, "h d k"],
    wk: Float[Tensor, "h d k"],
    wv: Float[Tensor, "h d k"],
    wo: Float[Tensor, "h k d"],
    keep: Bool[Tensor, "b t"],
) -> Float[Tensor, "b t d"]:
    q = sg.einsum("btd,hdk->bhtk", x, wq)
    k = sg.einsum("btd,hdk->bhtk", x, wk)
    v = sg.einsum("btd,hdk->bhtk", x, wv)
    scores = sg.einsum("bhtk,bhsk->bhts", q, k) / math.sqrt(q.shape[-1])
    scores = sg.where(keep[:, None, None, :], scores, -1e9)
    ctx = sg.einsum("bhts,bhsk->bhtk", sg.softmax(scores, axis=-1), v)
    return sg.einsum("bhtk,hkd->btd", ctx, wo)


@sg.typechecked
def encoder_layer(
    x: Float[Tensor, "b t d"],
    attn: tuple[
        Float[Tensor, "h d k"],
        Float[Tensor, "h d k"],
        Float[Tensor, "h d k"],
        Float[Tensor, "h k d"],
    ],
    w1: Float[Tensor, "d f"],
    w2: Float[Tensor, "f d"],
    keep: Bool[Tensor, "b t"],
) -> Float[Tensor, "b t d"]:
    wq, wk, wv, wo = attn
    x = sg.layer_norm(x + multi_head(x, wq, wk, wv, wo, keep))
    return sg.layer_norm(x + sg.relu(x @ w1) @ w2)


def run() -> float:
    import numpy as np

    h, d, k = 2, 8, 4
    attn = (sg.randn((h, d, k), seed=1), sg.randn((h, d, k), seed=2), sg.randn((h, d, k), seed=3),
            sg.randn((h, k, d), seed=4))  # fmt: skip
    keep = sg.tensor(np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool))
    y = encoder_layer(sg.randn((2, 4, d)), attn, sg.randn((d, 16)), sg.randn((16, d)), keep)
    return float(y.sum().item())
