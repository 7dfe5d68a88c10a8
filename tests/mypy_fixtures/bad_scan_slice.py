"""Bug: the scanned layers' weights are stacked [layers, d, 2*d], but the body expects [d, d]."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def layer(h: Float[Tensor, "b d"], w: Float[Tensor, "d d"]) -> tuple[Float[Tensor, "b d"], None]:
    return sg.tanh(h @ w), None


@sg.typechecked
def deep(x: Float[Tensor, "b 4"], ws: Float[Tensor, "layers 4 8"]) -> Float[Tensor, "b 4"]:
    # E: layer: dimension 'd' is 4 in h but 8 in w
    h, _ = sg.scan(layer, x, ws)
    return h


def run() -> None:
    deep(sg.rand((2, 4)), sg.randn((3, 4, 8)))
