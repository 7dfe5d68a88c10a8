"""NeRF-style positional encoding (sin/cos at several frequencies) feeding a small MLP."""

import shapegrad as sg
from shapegrad import Float, Tensor

FREQS = 3


@sg.typechecked
def encode(p: Float[Tensor, "n 3"]) -> Float[Tensor, "n 21"]:
    parts = [p]
    for k in range(FREQS):
        parts.append(sg.sin(p * (2.0**k)))
        parts.append(sg.cos(p * (2.0**k)))
    return sg.concat(parts, axis=1)


@sg.typechecked
def field_mlp(
    p: Float[Tensor, "n 3"], w1: Float[Tensor, "21 h"], w2: Float[Tensor, "h 4"]
) -> Float[Tensor, "n 4"]:
    return sg.relu(encode(p) @ w1) @ w2


def run() -> float:
    return float(field_mlp(sg.rand((5, 3)), sg.randn((21, 8)), sg.randn((8, 4))).sum().item())
