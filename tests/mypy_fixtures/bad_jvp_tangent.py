"""Bug: ``sg.jvp`` given a tangent of another shape than the primal it goes with."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def affine(w: Float[Tensor, "o i"], x: Float[Tensor, " i"]) -> Float[Tensor, " o"]:
    return w @ x


def directional(
    w: Float[Tensor, "5 3"], x: Float[Tensor, "3"], dx: Float[Tensor, "4"]
) -> Float[Tensor, "5"]:
    # E: affine: dimension 'i' is 3 in w but 4 in dx
    _, tangent = sg.jvp(affine, (w, x), (w, dx))
    return tangent


def run() -> None:
    directional(sg.randn((5, 3)), sg.randn((3,)), sg.randn((4,)))
