"""Bug: a layer object's forward multiplies by its ``[out, in]`` weight field without ``.T``."""

from dataclasses import dataclass

import shapegrad as sg
from shapegrad import Float, Tensor


@dataclass
class Dense:
    w: Float[Tensor, "o i"]
    b: Float[Tensor, " o"]

    @sg.typechecked
    def __call__(self, x: Float[Tensor, "n i"]) -> Float[Tensor, "n o"]:
        # E: matmul: inner dimensions disagree: x is [n, i], self.w is [o, i] (i != o); if i and o are the same size, give them one name
        return x @ self.w + self.b


def run() -> None:
    layer = Dense(sg.randn((3, 5)), sg.zeros((3,)))
    layer(sg.rand((2, 5)))
