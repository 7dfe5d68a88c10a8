"""PyTorch reshaping idioms: ``view(*x.shape[:-1], h, -1)``, ``expand(-1, t, -1)``,
``flatten(0, 1)``, tuple-form ``permute((..))``/``reshape((..))``, ``squeeze(dim=)``,
``unflatten``-by-reshape, shapes built from ``x.shape`` tuples."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor

HEADS = 2


@sg.typechecked
def split_heads(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b h t e"]:
    return x.view(*x.shape[:-1], HEADS, -1).permute((0, 2, 1, 3))


@sg.typechecked
def merge_heads(x: Float[Tensor, "b h t e"]) -> Float[Tensor, "b t d"]:
    B, H, T, E = x.shape
    return x.permute(0, 2, 1, 3).reshape((B, T, H * E))


@sg.typechecked
def broadcast_query(q: Float[Tensor, "b 1 d"], t: int) -> Float[Tensor, "b t d"]:
    return q.expand(-1, t, -1)


@sg.typechecked
def tokens_first(x: Float[Tensor, "b t d"]) -> Float[Tensor, "n d"]:
    return x.flatten(0, 1)


@sg.typechecked
def unflatten(x: Float[Tensor, "n d"], b: int) -> Float[Tensor, "b t d"]:
    return x.reshape(b, -1, x.shape[-1])


@sg.typechecked
def zeros_like_shape(x: Float[Tensor, "b t d"], k: int) -> Float[Tensor, "b t k"]:
    return sg.zeros(x.shape[:-1] + (k,))


@sg.typechecked
def drop_singleton(x: Float[Tensor, "b 1 d"]) -> Float[Tensor, "b d"]:
    return x.squeeze(dim=1)


@sg.typechecked
def roundtrip(x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
    y = merge_heads(split_heads(x))
    return y.reshape(x.shape) + sg.full(x.shape, 1.0)


@sg.typechecked
def lookup(table: Float[Tensor, "v d"], ids: Int[Tensor, "b t"]) -> Float[Tensor, "b t d"]:
    flat = ids.flatten()
    return table[flat].view(*ids.shape, -1)


def run() -> float:
    x = sg.randn((2, 3, 4), seed=0)
    a = roundtrip(x).sum() + broadcast_query(x[:, :1], 5).sum()
    b = unflatten(tokens_first(x), 2).sum() + zeros_like_shape(x, 7).sum() + drop_singleton(x[:, 1:2]).sum()
    c = lookup(sg.randn((6, 4), seed=1), sg.tensor([[1, 2, 5], [0, 0, 3]], dtype="int32")).sum()
    return float((a + b + c).item())
