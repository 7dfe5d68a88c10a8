"""Bug: the heads are split with the config's head count, the weights were sized for another."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def split_heads(
    x: Float[Tensor, "b t 32"], w_q: Float[Tensor, "32 32"], n_head: int
) -> Float[Tensor, "b h t d"]:
    B, T, C = x.shape
    q = x @ w_q
    # E: reshape: cannot reshape q [b, t, 32] (32 * b * t elements) into [b, t, 4, 16] (64 * b * t elements)
    return q.reshape(B, T, 4, C // 2).transpose(0, 2, 1, 3)


def run() -> None:
    split_heads(sg.rand((2, 3, 32)), sg.randn((32, 32)), 4)
