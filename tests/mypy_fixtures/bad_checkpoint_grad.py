"""Bug: the gradient of a checkpointed loss is taken on targets of the wrong width."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def loss(
    w: Float[Tensor, "i o"], x: Float[Tensor, "b i"], y: Float[Tensor, "b o"]
) -> Float[Tensor, ""]:
    return sg.mse(x @ w, y)


def run() -> None:
    step = sg.value_and_grad(sg.checkpoint(loss))
    w, x = sg.randn((3, 2)), sg.rand((4, 3))
    # E: step: dimension 'o' is 2 in w but 3 in sg.rand(...)
    step(w, x, sg.rand((4, 3)))
