"""Bug: a compiled evaluation function is called with images of the wrong resolution."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def logits(w: Float[Tensor, "10 784"], images: Float[Tensor, "b 1 28 28"]) -> Float[Tensor, "b 10"]:
    return images.reshape(images.shape[0], 784) @ w.T


fast_logits = sg.compile(logits)


def evaluate(w: Float[Tensor, "10 784"], batch: Float[Tensor, "b 1 32 32"]) -> Int[Tensor, " b"]:
    # E: logits: argument batch for parameter images has shape [b, 1, 32, 32], expected [b, 1, 28, 28] (dimension 2: 32 != 28)
    scores = fast_logits(w, batch)
    return sg.argmax(scores, axis=1)


def run() -> None:
    evaluate(sg.randn((10, 784)), sg.rand((2, 1, 32, 32)))
