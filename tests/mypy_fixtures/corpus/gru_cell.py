"""A GRU cell with fused gate weights split by slicing."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def gru_cell(
    x: Float[Tensor, "b i"],
    h: Float[Tensor, "b h"],
    w_x: Float[Tensor, "i 3*h"],
    w_h: Float[Tensor, "h 3*h"],
) -> Float[Tensor, "b h"]:
    H = h.shape[1]
    gx, gh = x @ w_x, h @ w_h
    r = sg.sigmoid(gx[:, :H] + gh[:, :H])
    z = sg.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
    n = sg.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
    return (1.0 - z) * n + z * h


def run() -> float:
    h = sg.zeros((2, 4))
    for step in range(3):
        h = gru_cell(sg.rand((2, 3), seed=step), h, sg.randn((3, 12)), sg.randn((4, 12)))
    return float(h.sum().item())
