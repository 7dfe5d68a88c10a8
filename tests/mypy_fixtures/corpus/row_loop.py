"""Per-example work written as a Python loop over a batch's rows (``for row in x``, and
unpacking a two-row tensor), as PyTorch users write it."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def row_norms(x: Float[Tensor, "b d"]) -> list[Float[Tensor, ""]]:
    return [sg.sqrt((row * row).sum()) for row in x]


@sg.typechecked
def pair_distance(pair: Float[Tensor, "2 d"]) -> Float[Tensor, ""]:
    first, second = pair
    return ((first - second) ** 2).sum()


def run() -> float:
    x = sg.randn((3, 4))
    norms = row_norms(x)
    assert len(norms) == 3
    return float(pair_distance(x[:2]).item()) + sum(float(n.item()) for n in norms)


if __name__ == "__main__":
    run()
