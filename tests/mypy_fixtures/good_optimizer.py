"""Correct: SGD and Adam updates written against variadic shapes (no shape errors)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def sgd_step(w: Float[Tensor, "o i"], g: Float[Tensor, "o i"], lr: float) -> Float[Tensor, "o i"]:
    return w - lr * g


@sg.typechecked
def adam_step(
    w: Float[Tensor, "*s"],
    g: Float[Tensor, "*s"],
    m: Float[Tensor, "*s"],
    v: Float[Tensor, "*s"],
    lr: float,
) -> tuple[Float[Tensor, "*s"], Float[Tensor, "*s"], Float[Tensor, "*s"]]:
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    w2 = w - lr * m2 / (sg.sqrt(v2) + 1e-8)
    return w2, m2, v2


def run() -> float:
    w: Float[Tensor, "3 4"] = sg.randn((3, 4))
    g: Float[Tensor, "3 4"] = sg.ones((3, 4))
    w = sgd_step(w, g, 0.1)
    w, m, v = adam_step(w, g, sg.zeros((3, 4)), sg.zeros((3, 4)), 1e-3)
    return float((w + m + v).sum().item())
