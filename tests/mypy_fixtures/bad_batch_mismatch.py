"""Bug: features and labels of different batch sizes are passed to one annotated loss."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def loss(logits: Float[Tensor, "b c"], labels: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(logits, labels)


@sg.typechecked
def evaluate(logits: Float[Tensor, "32 10"], labels: Int[Tensor, "64"]) -> Float[Tensor, ""]:
    # E: loss: dimension 'b' is 32 in logits but 64 in labels
    return loss(logits, labels)


def run() -> None:
    labels = sg.zeros((64,), "int32")
    evaluate(sg.randn((32, 10)), labels)
