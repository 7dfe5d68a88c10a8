"""An encoder of sg.nn.transformer_block layers applied in a Python loop, then mean-pooled."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import BlockParams


@sg.typechecked
def encode(
    blocks: list[BlockParams], x: Float[Tensor, "b t d"], w_cls: Float[Tensor, "k d"]
) -> Float[Tensor, "b k"]:
    h = x
    for params in blocks:
        h = sg.nn.transformer_block(params, h, heads=2)
    return h.mean(axis=1) @ w_cls.T


def run() -> float:
    init = sg.nn.transformer.block_init()
    blocks = [BlockParams.init(init, seed=i, d=8, f=16) for i in range(2)]
    return float(encode(blocks, sg.rand((2, 3, 8)), sg.randn((4, 8))).sum().item())
