"""A bidirectional RNN: one sg.scan forward, one with reverse=True, outputs concatenated."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def birnn(
    xs: Float[Tensor, "t b i"],
    w_f: Float[Tensor, "i h"],
    u_f: Float[Tensor, "h h"],
    w_b: Float[Tensor, "i h"],
    u_b: Float[Tensor, "h h"],
) -> Float[Tensor, "t b 2*h"]:
    h0 = sg.zeros((xs.shape[1], u_f.shape[0]))

    def forward(
        h: Float[Tensor, "b h"], x: Float[Tensor, "b i"]
    ) -> tuple[Float[Tensor, "b h"], Float[Tensor, "b h"]]:
        h = sg.tanh(x @ w_f + h @ u_f)
        return h, h

    def backward(
        h: Float[Tensor, "b h"], x: Float[Tensor, "b i"]
    ) -> tuple[Float[Tensor, "b h"], Float[Tensor, "b h"]]:
        h = sg.tanh(x @ w_b + h @ u_b)
        return h, h

    _, fwd = sg.scan(forward, h0, xs)
    _, bwd = sg.scan(backward, h0, xs, reverse=True)
    return sg.concat([fwd, bwd], axis=2)


def run() -> float:
    y = birnn(sg.rand((4, 2, 3)), sg.randn((3, 5)), sg.randn((5, 5)) * 0.3, sg.randn((3, 5)),
              sg.randn((5, 5)) * 0.3)  # fmt: skip
    return float(y.sum().item())
