"""A deep MLP whose blocks are wrapped in sg.checkpoint; gradients with sg.value_and_grad."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def block(h: Float[Tensor, "b d"], w: Float[Tensor, "d d"]) -> Float[Tensor, "b d"]:
    return h + sg.gelu(h @ w)


@sg.typechecked
def loss(
    ws: tuple[Float[Tensor, "d d"], Float[Tensor, "d d"]],
    x: Float[Tensor, "b d"],
    head: Float[Tensor, "d 1"],
) -> Float[Tensor, ""]:
    step = sg.checkpoint(block)
    h = step(x, ws[0])
    h = step(h, ws[1])
    return ((h @ head) ** 2).mean()


def run() -> float:
    ws = (sg.randn((6, 6), seed=1) * 0.3, sg.randn((6, 6), seed=2) * 0.3)
    value, grads = sg.value_and_grad(loss)(ws, sg.rand((4, 6)), sg.randn((6, 1)))
    return float(value.item()) + float(grads[0].sum().item())
