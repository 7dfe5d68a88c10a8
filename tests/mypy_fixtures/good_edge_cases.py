"""Correct code that a shape checker must not flag: unknowns, rebinding, 1-broadcasts, classes."""

# ruff: noqa: F821  (one-name jaxtyping specs such as "b" look like forward references)

from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def rebinding(x: Float[Tensor, "b 784"], axis: int) -> Float[Tensor, "b 10"]:
    x = x.reshape(-1, 28, 28)  # a parameter may be rebound to another shape
    x = x.reshape(x.shape[0], 784)
    total = x.sum(axis=axis)  # a non-literal axis: the shape is unknown, never an error
    anything: Any = total.mean()
    return x[:, :10] / (1.0 + anything)


@sg.typechecked
def broadcasting(
    col: Float[Tensor, "n 1"], row: Float[Tensor, "1 m"], scale: Float[Tensor, ""]
) -> Float[Tensor, "n m"]:
    grid = col * row + scale
    mask = grid > 0.5
    return sg.where(mask, grid, sg.minimum(grid, 0.0))


@sg.typechecked
def body_only_names(x: Float[Tensor, "b 8"], w: Float[Tensor, "8 k"]) -> Float[Tensor, "b"]:
    hidden: Float[Tensor, "b k"] = x @ w
    # `j` names a dim only inside the body: it binds to whatever it meets, like jaxtyping's.
    pooled: Float[Tensor, "b j"] = hidden[:, :2]
    return pooled.mean(axis=1)


@sg.typechecked
def variadic(x: Float[Tensor, "*batch c"], w: Float[Tensor, "c d"]) -> Float[Tensor, "*batch d"]:
    return sg.relu(x @ w)


@sg.typechecked
def unknown_inputs(x: Tensor, w: Float[Tensor, "3 4"], labels: Int[Tensor, "n"]) -> Tensor:
    y = x @ w  # x has no annotated shape: nothing is known, nothing is reported
    return sg.cross_entropy(y, labels)


class Scaler:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    @sg.typechecked
    def __call__(self, x: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
        return x * self.factor

    @sg.typechecked
    def project(self, x: Float[Tensor, "b d"], w: Float[Tensor, "e d"]) -> Float[Tensor, "b e"]:
        return self(x) @ w.T


@sg.typechecked
def nested(x: Float[Tensor, "b 6"]) -> Float[Tensor, "b 3"]:
    def half(v: Float[Tensor, "n 6"]) -> Float[Tensor, "n 3"]:
        return v[:, :3] + v[:, 3:]

    return half(x) * 2.0


def run() -> float:
    x: Float[Tensor, "4 784"] = sg.rand((4, 784))
    a = rebinding(x, 1)
    b = broadcasting(sg.ones((3, 1)), sg.ones((1, 5)), sg.tensor(np.float32(2.0)))
    c = body_only_names(sg.rand((4, 8)), sg.rand((8, 6)))
    d = variadic(sg.rand((2, 3, 4)), sg.rand((4, 5)))
    e = unknown_inputs(sg.rand((2, 3)), sg.rand((3, 4)), sg.tensor(np.array([0, 1], np.int32)))
    f = Scaler(2.0).project(sg.rand((2, 3)), sg.rand((5, 3)))
    g = nested(sg.rand((2, 6)))
    total = a.sum() + b.sum() + c.sum() + d.sum() + e + f.sum() + g.sum()
    return float(total.item())
