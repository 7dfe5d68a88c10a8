"""A dense mixture of experts: softmax gating, experts as one stacked weight, einsum combine."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def moe(
    x: Float[Tensor, "b d"],
    gate: Float[Tensor, "d e"],
    experts: Float[Tensor, "e d o"],
) -> Float[Tensor, "b o"]:
    weights = sg.softmax(x @ gate, axis=-1)  # [b, e]
    outs = sg.einsum("bd,edo->beo", x, experts)  # [b, e, o]
    return sg.einsum("be,beo->bo", weights, outs)


@sg.typechecked
def load_balance(x: Float[Tensor, "b d"], gate: Float[Tensor, "d e"]) -> Float[Tensor, ""]:
    usage = sg.softmax(x @ gate, axis=-1).mean(axis=0)
    E = gate.shape[1]
    return ((usage - 1.0 / E) ** 2).sum()


def run() -> float:
    x = sg.rand((4, 6))
    y = moe(x, sg.randn((6, 3)), sg.randn((3, 6, 5)))
    return float(y.sum().item() + load_balance(x, sg.randn((6, 3))).item())
