"""Bug: the second layer was sized for a hidden width of 64, the first produces 128."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor

Params = ParamList[
    Float[Tensor, "784 128"], Float[Tensor, "128"], Float[Tensor, "64 10"], Float[Tensor, "10"]
]


@sg.typechecked
def mlp(params: Params, x: Float[Tensor, "b 784"]) -> Float[Tensor, "b 10"]:
    w1, b1, w2, b2 = params
    hidden = sg.relu(x @ w1 + b1)
    # E: matmul: inner dimensions disagree: hidden is [b, 128], w2 is [64, 10] (128 != 64)
    return hidden @ w2 + b2


def run() -> None:
    params: Params = Params(
        [sg.randn((784, 128)), sg.zeros((128,)), sg.randn((64, 10)), sg.zeros((10,))]
    )
    mlp(params, sg.rand((4, 784)))
