"""Bug: a cast method keeps the shape, so the transposed mask is still [8, b], and
``x.long()`` is an integer tensor, not the float one the annotation promises."""

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


@sg.typechecked
def mask(x: Float[Tensor, "b 8"]) -> Bool[Tensor, "b 8"]:
    flags = (x > 0.0).T.byte().bool()
    # E: return value flags has shape [8, b], but the annotation says [b, 8] (dimension 0: 8 != b)
    return flags


@sg.typechecked
def ids(x: Float[Tensor, "b 8"]) -> Float[Tensor, "b 8"]:
    out = x.long()
    # E: return value out is int, but the annotation says float
    return out


def run() -> None:
    mask(sg.randn((2, 8)))
    ids(sg.randn((2, 8)))
