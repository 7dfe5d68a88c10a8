"""Correct: a bilinear form and a batched outer product with einsum (no shape errors)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def bilinear(
    x: Float[Tensor, "b i"], w: Float[Tensor, "o i j"], y: Float[Tensor, "b j"]
) -> Float[Tensor, "b o"]:
    t: Float[Tensor, "b o j"] = sg.einsum("bi,oij->boj", x, w)
    return sg.einsum("boj,bj->bo", t, y)


@sg.typechecked
def outer(x: Float[Tensor, "b i"], y: Float[Tensor, "b j"]) -> Float[Tensor, "b i j"]:
    return sg.einsum("bi,bj->bij", x, y)


def run() -> float:
    x: Float[Tensor, "2 3"] = sg.rand((2, 3))
    y: Float[Tensor, "2 4"] = sg.rand((2, 4))
    out: Float[Tensor, "2 5"] = bilinear(x, sg.randn((5, 3, 4)), y)
    return float(out.sum().item() + outer(x, y).sum().item())
