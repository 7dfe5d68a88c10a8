"""Bug: the logits come back transposed ([10, b] instead of [b, 10])."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def logits(x: Float[Tensor, "b 784"], w: Float[Tensor, "10 784"]) -> Float[Tensor, "b 10"]:
    scores = w @ x.T
    # E: return value scores has shape [10, b], but the annotation says [b, 10] (dimension 0: 10 != b)
    return scores


def run() -> None:
    logits(sg.rand((4, 784)), sg.randn((10, 784)))
