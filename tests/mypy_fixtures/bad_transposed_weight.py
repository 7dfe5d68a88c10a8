"""Bug: the weight is stored [out, in] but used as if it were [in, out] (missing .T)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def linear(
    x: Float[Tensor, "b 784"], w: Float[Tensor, "128 784"], bias: Float[Tensor, "128"]
) -> Float[Tensor, "b 128"]:
    # E: matmul: inner dimensions disagree: x is [b, 784], w is [128, 784] (784 != 128)
    return x @ w + bias


def run() -> None:
    linear(sg.rand((4, 784)), sg.randn((128, 784)), sg.zeros((128,)))
