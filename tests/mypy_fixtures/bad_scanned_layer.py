"""Bugs in the step of a scan over a stacked Module, and in an ensemble member run by
``sg.vmap``: each sees one layer's (member's) fields (``p.w_in`` is ``[d, h]``, not the
declared ``[layers, d, h]``) and multiplies by the wrong one."""

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Module


class Layers(Module):
    w_in: Float[Tensor, "layers d h"]
    w_out: Float[Tensor, "layers h d"]


def layer(x: Float[Tensor, "n d"], p: Layers) -> Float[Tensor, "n d"]:
    # E: matmul: inner dimensions disagree: x is [n, d], p.w_out is [h, d] (d != h); if d and h are the same size, give them one name
    return sg.tanh(x @ p.w_out) @ p.w_in


@sg.typechecked
def deep(x: Float[Tensor, "n d"], stack: Layers) -> Float[Tensor, "n d"]:
    out, _ = sg.scan(lambda h, p: (layer(h, p), None), x, stack)
    return out


def member(p: Layers, x: Float[Tensor, "n d"]) -> Float[Tensor, "n d"]:
    # E: matmul: inner dimensions disagree: x is [n, d], p.w_out is [h, d] (d != h); if d and h are the same size, give them one name
    return x @ p.w_out


@sg.typechecked
def ensemble(p: Layers, x: Float[Tensor, "n d"]) -> Float[Tensor, "layers n d"]:
    return sg.vmap(member, in_axes=(0, None))(p, x)


def run() -> None:
    deep(sg.randn((2, 4)), Layers.init(seed=0, layers=3, d=4, h=8))
