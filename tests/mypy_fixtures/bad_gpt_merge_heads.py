"""Bug: merging the heads back drops the time axis (``[B, T, C]`` reshaped to ``[B, C]``)."""

import shapegrad as sg
from shapegrad import Float, Tensor

N_HEAD = 4


@sg.typechecked
def self_attention(
    x: Float[Tensor, "b t c"], w_q: Float[Tensor, "c c"], w_k: Float[Tensor, "c c"]
) -> Float[Tensor, "b t c"]:
    B, T, C = x.shape
    head_dim = C // N_HEAD
    q = (x @ w_q).reshape(B, T, N_HEAD, head_dim).transpose(0, 2, 1, 3)
    k = (x @ w_k).reshape(B, T, N_HEAD, head_dim).transpose(0, 2, 1, 3)
    att = sg.softmax(q @ k.transpose(0, 1, 3, 2), axis=-1)
    y = (att @ q).transpose(0, 2, 1, 3)
    # E: reshape: cannot reshape y [b, t, 4, c // 4] (b * c * t elements) into [b, c] (b * c elements)
    merged = y.reshape(B, C)
    return merged.reshape(B, 1, C) + x


def run() -> None:
    w = sg.randn((8, 8))
    self_attention(sg.rand((2, 5, 8)), w, w)
