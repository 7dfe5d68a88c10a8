"""Correct (regression): sizes unpacked from ``x.shape`` keep the *old* ``x``'s sizes.

``B, C, H, W = x.shape`` then ``x = ...`` rebinds ``x`` to a wider tensor; a later
``W`` is still the first ``x``'s width, never re-read from the new ``x``.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def upsample(x: Float[Tensor, "b c h w"]) -> Float[Tensor, "b c 2*h 2*w"]:
    B, C, H, W = x.shape
    x = sg.stack([x, x], -1).reshape((B, C, H, 2 * W))
    y = sg.stack([x, x], 3).reshape((B, C, 2 * H, 2 * W))
    return y


@sg.typechecked
def widen(x: Float[Tensor, "b t"]) -> Float[Tensor, "b 4*t"]:
    n = x.shape[1]
    x = sg.concat([x, x], axis=1)
    x = sg.concat([x, x], axis=1)
    return x.reshape(x.shape[0], 4 * n)


def run() -> float:
    y = upsample(sg.rand((1, 2, 3, 4)))
    z = widen(sg.rand((2, 3)))
    return float(y.sum().item() + z.sum().item())
