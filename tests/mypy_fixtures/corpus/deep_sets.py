"""Deep Sets: a per-element network, a permutation-invariant sum, a set-level readout."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def deep_set(
    xs: Float[Tensor, "b n f"],
    phi1: Float[Tensor, "f h"],
    phi2: Float[Tensor, "h h"],
    rho: Float[Tensor, "h 1"],
) -> Float[Tensor, " b"]:
    per_element = sg.relu(sg.relu(xs @ phi1) @ phi2)  # [b, n, h]
    pooled = per_element.sum(axis=1)  # [b, h]
    return (pooled @ rho).reshape(-1)


def run() -> float:
    return float(deep_set(sg.rand((2, 5, 3)), sg.randn((3, 4)), sg.randn((4, 4)),
                          sg.randn((4, 1))).sum().item())  # fmt: skip
