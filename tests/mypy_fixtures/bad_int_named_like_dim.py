"""Bugs beside int parameters named like a tensor's dim (``k``: a top-k count beside
``logits: [b, k]``; ``t``: a cut point beside ``x: [b, t, d]``). jaxtyping never compares
such an int with the dim, so neither is an error in itself: a call's result keeps the
tensor's size, and ``x[:, t:]`` has an unknown length; the other sizes still check."""

import shapegrad as sg
from shapegrad import Float, Tensor


def top_mass(logits: Float[Tensor, "b k"], k: int) -> Float[Tensor, "b k"]:
    values, _ = sg.topk(logits, k, axis=-1)
    floor = values.min(axis=-1, keepdims=True)
    return sg.where(logits >= floor, logits, 0.0)


@sg.typechecked
def sparse_scores(x: Float[Tensor, "b 5"]) -> Float[Tensor, "b 2"]:
    # E: return value top_mass(...) has shape [b, 5], but the annotation says [b, 2] (dimension 1: 5 != 2)
    return top_mass(x, 2)


@sg.typechecked
def after(x: Float[Tensor, "b t d"], w: Float[Tensor, "e k"], t: int) -> Float[Tensor, "b n k"]:
    # E: matmul: inner dimensions disagree: left is [b, -int(t) + t, d], w is [e, k] (d != e); if d and e are the same size, give them one name
    return x[:, t:] @ w


def run() -> None:
    sparse_scores(sg.randn((3, 5)))

