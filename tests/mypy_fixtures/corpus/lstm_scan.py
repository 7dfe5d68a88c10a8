"""An LSTM over a sequence with sg.scan: the carry (h, c) keeps its shapes, outputs are stacked."""

import shapegrad as sg
from shapegrad import Float, Tensor


class LSTM(sg.ParamList[Float[Tensor, "i 4*h"], Float[Tensor, "h 4*h"], Float[Tensor, " 4*h"]]):
    names = ("w_x", "w_h", "b")


@sg.typechecked
def encode(p: LSTM, xs: Float[Tensor, "t b i"], h0: Float[Tensor, "b h"]) -> Float[Tensor, "t b h"]:
    w_x, w_h, b = p
    H = h0.shape[1]

    def step(
        carry: tuple[Float[Tensor, "b h"], Float[Tensor, "b h"]], x: Float[Tensor, "b i"]
    ) -> tuple[tuple[Float[Tensor, "b h"], Float[Tensor, "b h"]], Float[Tensor, "b h"]]:
        h, c = carry
        gates = x @ w_x + h @ w_h + b
        i, f = sg.sigmoid(gates[:, :H]), sg.sigmoid(gates[:, H : 2 * H])
        g, o = sg.tanh(gates[:, 2 * H : 3 * H]), sg.sigmoid(gates[:, 3 * H :])
        c = f * c + i * g
        h = o * sg.tanh(c)
        return (h, c), h

    (h_last, c_last), hs = sg.scan(step, (h0, h0), xs)
    return hs + 0.0 * (h_last + c_last)


def run() -> float:
    p = LSTM.init(sg.nn.init.normal(0.3), seed=0, i=3, h=5)
    hs = encode(p, sg.rand((4, 2, 3)), sg.zeros((2, 5)))
    return float(hs.sum().item())
