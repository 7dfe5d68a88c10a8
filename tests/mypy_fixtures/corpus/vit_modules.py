"""A ViT: patchify by reshape/transpose, a Linear patch embedding, a class token, pre-LN encoder."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import LayerNorm, Linear, Module, field

P = 4


class ViT(Module):
    patch: Linear = field(dims={"d_in": "16*c", "d_out": "d"})
    cls_token: Float[Tensor, "1 1 d"]
    pos: Float[Tensor, "n d"]
    ln: LayerNorm = field(dims={"c": "d"})
    mlp: Linear = field(dims={"d_in": "d", "d_out": "d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "k"})


@sg.typechecked
def patchify(images: Float[Tensor, "b c h w"]) -> Tensor:
    B, C, H, W = images.shape
    x = images.reshape(B, C, H // P, P, W // P, P).transpose(0, 2, 4, 1, 3, 5)
    return x.reshape(B, (H // P) * (W // P), C * P * P)


@sg.typechecked
def loss(m: ViT, images: Float[Tensor, "b 3 8 8"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    B = images.shape[0]
    tokens = m.patch(patchify(images))  # [b, 4, d]
    cls = m.cls_token.broadcast_to((B, 1, tokens.shape[2]))
    x = sg.concat([cls, tokens], axis=1) + m.pos
    x = x + sg.gelu(m.mlp(m.ln(x)))
    return sg.cross_entropy(m.head(x[:, 0, :]), y)


def run() -> float:
    m = ViT.init(seed=0, c=3, d=8, n=5, k=3)
    y = sg.tensor(np.array([0, 2], dtype=np.int32))
    return float(loss(m, sg.rand((2, 3, 8, 8)), y).item())
