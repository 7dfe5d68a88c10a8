"""Bugs in PyTorch-style reshaping: heads split with ``view(*x.shape[:-1], 2, -1)`` but
never moved before the time axis, ``expand`` of an axis that is not of size 1, and a head
whose weight is as wide as the channels, not the flattened image. (A weight ``[k, f]``
applied to ``img.flatten(1)`` is not reported: ``f`` may be ``c*h*w``; see
corpus/flatten_head.py.)"""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def split_heads(x: Float[Tensor, "b t d"], w: Float[Tensor, "d d"]) -> Float[Tensor, "b 2 t e"]:
    # E: return value has shape [b, t, 2, d // 2], but the annotation says [b, 2, t, e] (dimension 1: t != 2)
    return (x @ w).view(*x.shape[:-1], 2, -1)


@sg.typechecked
def tile_query(q: Float[Tensor, "b 2 d"], t: int) -> Float[Tensor, "b t d"]:
    # E: expand: cannot broadcast q [b, 2, d] and [b, t, d]: dimension -2 is 2 vs t
    return q.expand(-1, t, -1)


@sg.typechecked
def head(img: Float[Tensor, "b c h w"], w: Float[Tensor, "k c"]) -> Float[Tensor, "b k"]:
    # E: matmul: inner dimensions disagree: img.flatten(...) is [b, c * h * w], w.T is [c, k] (c * h * w != c)
    return img.flatten(1) @ w.T


def run() -> None:
    split_heads(sg.randn((2, 5, 4)), sg.randn((4, 4)))
    tile_query(sg.randn((2, 2, 4)), 3)
