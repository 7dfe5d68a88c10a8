"""value_and_grad of a loss whose layers run as one sg.scan over stacked weights."""

import shapegrad as sg
from shapegrad import Float, Tensor


class Stack(
    sg.ParamList[Float[Tensor, "layers d d"], Float[Tensor, "layers d"], Float[Tensor, "1 d"]]
):
    names = ("ws", "bs", "head")


def layer(
    h: Float[Tensor, "b d"], wb: tuple[Float[Tensor, "d d"], Float[Tensor, " d"]]
) -> tuple[Float[Tensor, "b d"], None]:
    w, b = wb
    return sg.tanh(h @ w.T + b), None


@sg.typechecked
def loss(p: Stack, x: Float[Tensor, "b d"], y: Float[Tensor, "b 1"]) -> Float[Tensor, ""]:
    h, _ = sg.scan(layer, x, (p.ws, p.bs))
    return sg.mse(h @ p.head.T, y)


def run() -> float:
    p = Stack.init(sg.nn.init.normal(0.3), seed=0, layers=3, d=4)
    value, grads = sg.value_and_grad(loss)(p, sg.rand((5, 4)), sg.rand((5, 1)))
    return float(value.item()) + float(grads.ws.sum().item())
