"""Bug: the ParamList is unpacked in the wrong order (bias first, weight second)."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor

Layer = ParamList[Float[Tensor, "16 2"], Float[Tensor, "16"]]


@sg.typechecked
def dense(layer: Layer, x: Float[Tensor, "b 2"]) -> Float[Tensor, "b 16"]:
    bias, w = layer
    # E: matmul: inner dimensions disagree: x is [b, 2], w.T is [16] (2 != 16)
    return x @ w.T + bias


def run() -> None:
    layer: Layer = Layer([sg.randn((16, 2)), sg.zeros((16,))])
    dense(layer, sg.rand((4, 2)))
