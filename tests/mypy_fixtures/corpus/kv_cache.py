"""Incremental decoding with a key/value cache grown by concatenation along time."""

import math

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def decode_step(
    x: Float[Tensor, "b 1 d"],
    cache_k: Float[Tensor, "b s d"],
    cache_v: Float[Tensor, "b s d"],
    wq: Float[Tensor, "d d"],
    wk: Float[Tensor, "d d"],
    wv: Float[Tensor, "d d"],
) -> tuple[Float[Tensor, "b 1 d"], Tensor, Tensor]:
    k = sg.concat([cache_k, x @ wk], axis=1)  # [b, s + 1, d]
    v = sg.concat([cache_v, x @ wv], axis=1)
    q = x @ wq
    att = sg.softmax(q @ k.transpose(0, 2, 1) / math.sqrt(x.shape[-1]), axis=-1)  # [b, 1, s + 1]
    return att @ v, k, v


def run() -> float:
    d = 4
    k, v = sg.zeros((1, 0, d)), sg.zeros((1, 0, d))
    w = sg.randn((d, d))
    out = sg.zeros((1, 1, d))
    for step in range(3):
        out, k, v = decode_step(sg.rand((1, 1, d), seed=step), k, v, w, w, w)
    return float(out.sum().item())
