"""Correct: ParamList indexing, unpacking and dims instantiated through calls (no shape errors)."""

# ruff: noqa: F821, UP037  (one-name jaxtyping specs such as "b" look like forward references)

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor

Layer = ParamList[Float[Tensor, "o i"], Float[Tensor, "o"]]


@sg.typechecked
def dense(layer: Layer, x: Float[Tensor, "b i"]) -> Float[Tensor, "b o"]:
    w, bias = layer
    return x @ w.T + bias


@sg.typechecked
def linear(
    w: Float[Tensor, "o i"], bias: Float[Tensor, "o"], x: Float[Tensor, "b i"]
) -> Float[Tensor, "b o"]:
    return x @ w.T + bias


@sg.typechecked
def two_layers(
    layer: Layer, w2: Float[Tensor, "3 o"], b2: Float[Tensor, "3"], x: Float[Tensor, "b i"]
) -> Float[Tensor, "b 3"]:
    hidden: Float[Tensor, "b o"] = sg.tanh(dense(layer, x))
    first_bias: Float[Tensor, "o"] = layer[1]
    weight: Float[Tensor, "o i"] = layer[0]
    shifted = hidden + first_bias + (x @ weight.T)
    return linear(w2, b2, shifted)


def run() -> float:
    layer: Layer = Layer([sg.randn((6, 4)), sg.zeros((6,))])
    x: Float[Tensor, "5 4"] = sg.rand((5, 4))
    out: Float[Tensor, "5 3"] = two_layers(layer, sg.randn((3, 6)), sg.zeros((3,)), x)
    return float(out.sum().item())
