"""A deep residual MLP with layer norm; the width is a module constant and layers a Python list."""

import shapegrad as sg
from shapegrad import Float, Tensor

WIDTH = 32
DEPTH = 4


def init_layers(seed: int) -> list[tuple[Float[Tensor, "32 32"], Float[Tensor, "32"]]]:
    return [
        (sg.randn((WIDTH, WIDTH), seed=seed + i) * 0.05, sg.zeros((WIDTH,))) for i in range(DEPTH)
    ]


@sg.typechecked
def residual_mlp(
    x: Float[Tensor, "b 8"],
    w_in: Float[Tensor, "32 8"],
    layers: list[tuple[Float[Tensor, "32 32"], Float[Tensor, "32"]]],
    w_out: Float[Tensor, "1 32"],
) -> Float[Tensor, " b"]:
    h = x @ w_in.T
    for w, b in layers:
        h = h + sg.relu(sg.layer_norm(h) @ w.T + b)
    return (h @ w_out.T).reshape(-1)


def run() -> float:
    out = residual_mlp(sg.rand((5, 8)), sg.randn((WIDTH, 8)), init_layers(1), sg.randn((1, WIDTH)))
    return float(out.sum().item())
