"""A GRU over sg.scan whose last hidden state feeds a classifier, differentiated with value_and_grad."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


class GRU(
    sg.ParamList[
        Float[Tensor, "i 3*h"], Float[Tensor, "h 3*h"], Float[Tensor, "k h"], Float[Tensor, " k"]
    ]
):
    names = ("w_x", "w_h", "w_out", "b_out")


@sg.typechecked
def loss(p: GRU, xs: Float[Tensor, "t b i"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    w_x, w_h, w_out, b_out = p
    B, H = xs.shape[1], w_h.shape[0]

    def step(h: Float[Tensor, "b h"], x: Float[Tensor, "b i"]) -> tuple[Float[Tensor, "b h"], None]:
        gx, gh = x @ w_x, h @ w_h
        r = sg.sigmoid(gx[:, :H] + gh[:, :H])
        z = sg.sigmoid(gx[:, H : 2 * H] + gh[:, H : 2 * H])
        n = sg.tanh(gx[:, 2 * H :] + r * gh[:, 2 * H :])
        return (1.0 - z) * n + z * h, None

    h, _ = sg.scan(step, sg.zeros((B, H)), xs)
    return sg.cross_entropy(h @ w_out.T + b_out, y)


def run() -> float:
    p = GRU.init(sg.nn.init.normal(0.3), seed=1, i=3, h=4, k=2)
    y = sg.tensor(np.array([0, 1], dtype=np.int32))
    value, grads = sg.value_and_grad(loss)(p, sg.rand((5, 2, 3)), y)
    return float(value.item()) + float(grads[0].sum().item())
