"""Bug: after a loop of shape-keeping blocks the classifier is applied without pooling the tokens."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def block(h: Float[Tensor, "b t d"], w: Float[Tensor, "d d"]) -> Float[Tensor, "b t d"]:
    return h + sg.relu(h @ w)


@sg.typechecked
def classify(
    x: Float[Tensor, "b t d"], ws: list[Float[Tensor, "d d"]], head: Float[Tensor, "k d"]
) -> Float[Tensor, "b k"]:
    h = x
    for w in ws:
        h = block(h, w)
    # E: return value has shape [b, t, k], but the annotation says [b, k] (rank 3 != 2)
    return h @ head.T


def run() -> None:
    classify(sg.rand((2, 3, 4)), [sg.randn((4, 4))], sg.randn((5, 4)))
