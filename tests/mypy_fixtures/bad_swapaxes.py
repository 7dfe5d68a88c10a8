"""Bugs: attention scores from keys whose axes were swapped the wrong way, and an axis
that the tensor does not have."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def scores(q: Float[Tensor, "b h t d"], k: Float[Tensor, "b h t d"]) -> Float[Tensor, "b h t t"]:
    # E: matmul: inner dimensions disagree: q is [b, h, t, d], k.swapaxes(...) is [b, d, t, h] (d != t); if d and t are the same size, give them one name
    return q @ k.swapaxes(1, 3)


@sg.typechecked
def merge(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b d t"]:
    # E: swapaxes: axis 3 is out of range for x [b, t, d] (rank 3)
    return x.swapaxes(1, 3)


def run() -> None:
    scores(sg.randn((2, 4, 8, 16)), sg.randn((2, 4, 8, 16)))
    merge(sg.randn((2, 8, 16)))
