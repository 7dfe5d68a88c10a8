"""Bug after a call whose int argument is named like a tensor's dim (``k``: a top-k count
beside ``logits: [b, k]``): jaxtyping never compares the two, so the int is no error and
the result keeps the tensor's size, which the wrong return annotation then contradicts."""

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


def run() -> None:
    sparse_scores(sg.randn((3, 5)))
