"""Layer norm and batch norm written by hand with keepdims reductions."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def layer_norm(
    x: Float[Tensor, "b t d"], gamma: Float[Tensor, " d"], beta: Float[Tensor, " d"]
) -> Float[Tensor, "b t d"]:
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / sg.sqrt(var + 1e-5) * gamma + beta


@sg.typechecked
def batch_norm(
    x: Float[Tensor, "n c h w"], gamma: Float[Tensor, " c"], beta: Float[Tensor, " c"]
) -> Float[Tensor, "n c h w"]:
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    scale = gamma.reshape(1, -1, 1, 1)
    shift = beta.reshape(1, -1, 1, 1)
    return (x - mu) / sg.sqrt(var + 1e-5) * scale + shift


def run() -> float:
    a = layer_norm(sg.rand((2, 3, 4)), sg.ones((4,)), sg.zeros((4,)))
    b = batch_norm(sg.rand((2, 3, 5, 5)), sg.ones((3,)), sg.zeros((3,)))
    return float(a.sum().item() + b.sum().item())
