"""Bug: centring rows subtracts a [b] mean from [b, 784] (needs keepdims=True)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def center(x: Float[Tensor, "b 784"]) -> Float[Tensor, "b 784"]:
    # E: sub: cannot broadcast x [b, 784] and x.mean(...) [b]: dimension -1 is 784 vs b
    return x - x.mean(axis=1)


def run() -> None:
    center(sg.rand((4, 784)))
