"""Bugs in calls of issue 25's ops that the plugin reports before anything runs."""

# ruff: noqa: F821  (one-name jaxtyping specs such as "b" look like forward references)

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def segmentation_loss(logits: Float[Tensor, "b 3 4 6"], labels: Int[Tensor, "b 4 5"]) -> Tensor:
    # E: cross_entropy: labels labels [b, 4, 5] do not match logits logits [b, 3, 4, 6] with classes on axis 1 (expected [b, 4, 6] class indices or [b, 3, 4, 6] targets)
    return sg.cross_entropy(logits, labels, axis=1)


@sg.typechecked
def smooth(seq: Float[Tensor, "b 3 16"], w: Float[Tensor, "5 4 3"]) -> Tensor:
    # E: conv1d: input channels disagree: seq [b, 3, 16] and weight w [5, 4, 3]
    return sg.conv1d(seq, w)


@sg.typechecked
def mask(v: Float[Tensor, "n"]) -> Tensor:
    # E: tril: needs a tensor of rank >= 2, got v [n]
    return sg.tril(v)


def run() -> None:
    # E: segmentation_loss(...) fails inside: cross_entropy: labels labels [2, 4, 5] do not match logits logits [2, 3, 4, 6] with classes on axis 1 (expected [2, 4, 6] class indices or [2, 3, 4, 6] targets)
    segmentation_loss(sg.randn((2, 3, 4, 6)), sg.zeros((2, 4, 5), sg.int32))
