"""Bugs in calls of sort/argsort/topk that the plugin reports before anything runs."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def sample(logits: Float[Tensor, "b 50"]) -> Tensor:
    # E: topk: k=64 is out of range for dimension 1 of logits [b, 50] (0 <= k <= 50)
    return sg.topk(logits, 64)[1]


@sg.typechecked
def best(x: Float[Tensor, "b 8"]) -> Tensor:
    # E: topk: k=9 is out of range for dimension 1 of x [b, 8] (0 <= k <= 8)
    return x.topk(9)[0]


@sg.typechecked
def order(x: Float[Tensor, "b 8"]) -> Tensor:
    # E: argsort: axis 2 is out of range for x [b, 8] (rank 2)
    return sg.argsort(x, axis=2)


def run() -> None:
    sample(sg.randn((2, 50)))
