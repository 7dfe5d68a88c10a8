"""An Elman RNN unrolled over time with a Python loop; outputs stacked along the time axis."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def rnn(
    xs: Float[Tensor, "b t i"],
    w_x: Float[Tensor, "i h"],
    w_h: Float[Tensor, "h h"],
    bias: Float[Tensor, " h"],
) -> Float[Tensor, "b t h"]:
    B, T, _ = xs.shape
    h = sg.zeros((B, w_h.shape[0]))
    outputs = []
    for t in range(T):
        h = sg.tanh(xs[:, t] @ w_x + h @ w_h + bias)
        outputs.append(h)
    return sg.stack(outputs, axis=1)


@sg.typechecked
def last_state_logits(xs: Float[Tensor, "b t i"], w_x: Float[Tensor, "i h"], w_h: Float[Tensor, "h h"],
                      bias: Float[Tensor, " h"], head: Float[Tensor, "h 2"]) -> Float[Tensor, "b 2"]:  # fmt: skip
    states = rnn(xs, w_x, w_h, bias)
    return states[:, -1] @ head


def run() -> float:
    out = last_state_logits(sg.rand((2, 5, 3)), sg.randn((3, 4)), sg.randn((4, 4)) * 0.3, sg.zeros((4,)),
                            sg.randn((4, 2)))  # fmt: skip
    return float(out.sum().item())
