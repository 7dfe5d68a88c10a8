"""Bug: a Jacobian read as [in, out]: ``sg.jacrev(f)`` of ``f: [i] -> [o]`` is [o, i]."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def affine(w: Float[Tensor, "o i"], x: Float[Tensor, " i"]) -> Float[Tensor, " o"]:
    return w @ x


@sg.typechecked
def newton_step(jac: Float[Tensor, "3 5"], r: Float[Tensor, "5"]) -> Float[Tensor, "3"]:
    return jac @ r


def gauss_newton(w: Float[Tensor, "5 3"], x: Float[Tensor, "3"]) -> Float[Tensor, "3"]:
    jac = sg.jacrev(affine, argnums=1)(w, x)
    # E: newton_step: argument jac has shape [5, 3], expected [3, 5] (dimension 0: 5 != 3)
    return newton_step(jac, affine(w, x))


def run() -> None:
    gauss_newton(sg.randn((5, 3)), sg.randn((3,)))
