"""Bug: a training step passes a label batch of another size through ``sg.value_and_grad``."""

import shapegrad as sg
from shapegrad import Float, Int, ParamList, Tensor

Params = ParamList[Float[Tensor, "10 64"], Float[Tensor, "10"]]


@sg.typechecked
def loss(params: Params, x: Float[Tensor, "b 64"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    w, bias = params
    return sg.cross_entropy(x @ w.T + bias, y)


def train_step(
    params: Params, x: Float[Tensor, "32 64"], y: Int[Tensor, "16"]
) -> tuple[Float[Tensor, ""], Params]:
    # E: loss: dimension 'b' is 32 in x but 16 in y
    value, grads = sg.value_and_grad(loss)(params, x, y)
    return value, grads


def run() -> None:
    import numpy as np

    params: Params = Params([sg.randn((10, 64)), sg.zeros((10,))])
    train_step(params, sg.rand((32, 64)), sg.tensor(np.zeros(16, np.int32)))
