"""Correct: conv -> pool -> conv -> pool -> flatten -> linear, NCHW (no shape errors)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def cnn(
    w1: Float[Tensor, "8 1 3 3"],
    w2: Float[Tensor, "8 8 3 3"],
    w_fc: Float[Tensor, "10 392"],
    x: Float[Tensor, "b 1 28 28"],
) -> Float[Tensor, "b 10"]:
    h1: Float[Tensor, "b 8 28 28"] = sg.relu(sg.conv2d(x, w1, padding=1))
    p1 = sg.max_pool2d(h1, 2)
    h2 = sg.relu(sg.conv2d(p1, w2, stride=1, padding=1))
    p2: Float[Tensor, "b 8 7 7"] = sg.avg_pool2d(h2, kernel_size=2)
    flat = p2.reshape(p2.shape[0], -1)
    return flat @ w_fc.T


def run() -> float:
    x: Float[Tensor, "2 1 28 28"] = sg.rand((2, 1, 28, 28))
    out = cnn(sg.randn((8, 1, 3, 3)), sg.randn((8, 8, 3, 3)), sg.randn((10, 392)), x)
    checked: Float[Tensor, "2 10"] = out
    return float(checked.sum().item())
