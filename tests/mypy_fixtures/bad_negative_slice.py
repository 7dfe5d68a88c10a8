"""Bugs next to a slice counted from the end by a symbolic size (``x[:, -n:]``, whose length
is unknown: ``x[-0:]`` is all of ``x``): the window's other axes still check, and a literal
negative bound still has a known length."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def recent_scores(x: Float[Tensor, "b t d"], w: Float[Tensor, "e k"], n: int) -> Float[Tensor, "b n k"]:
    # E: matmul: inner dimensions disagree: left is [b, ?, d], w is [e, k] (d != e); if d and e are the same size, give them one name
    return x[:, -n:] @ w


@sg.typechecked
def last_two(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b 3 d"]:
    # E: return value has shape [b, 2, d], but the annotation says [b, 3, d] (dimension 1: 2 != 3)
    return x[:, -2:]


def run() -> None:
    recent_scores(sg.randn((2, 5, 4)), sg.randn((3, 2)), 2)
    last_two(sg.randn((2, 5, 4)))
