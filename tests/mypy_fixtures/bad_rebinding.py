"""Bug: after rebinding to a known shape the checker still follows it (the stale-shape fix
must not turn rebinding into "unknown" when the new shape is known)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def encoder(
    x: Float[Tensor, "b 1 8 8"], w1: Float[Tensor, "4 1 3 3"], w_fc: Float[Tensor, "10 64"]
) -> Float[Tensor, "b 10"]:
    h = sg.relu(sg.conv2d(x, w1, padding=1))
    h = sg.max_pool2d(h, 2)
    h = h.reshape(h.shape[0], -1)
    # E: matmul: inner dimensions disagree: h is [b, 64], w_fc is [10, 64] (64 != 10)
    return h @ w_fc


def run() -> None:
    encoder(sg.rand((2, 1, 8, 8)), sg.randn((4, 1, 3, 3)), sg.randn((10, 64)))
