"""Correct: the shapes the plugin infers for sort, argsort and topk (each ``# N:`` is the
note on the next line)."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def ops(x: Float[Tensor, "b 8"], logits: Float[Tensor, "b t 50"]) -> Float[Tensor, "b 8"]:
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(sg.sort(x, descending=True))
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(sg.argsort(x, axis=0))
    # N: Revealed shape is "int[b, 8]"
    sg.reveal_shape(x.argsort(dim=1))
    # N: Revealed shape is "float[b, 8]"
    sg.reveal_shape(x.sort(axis=-1))
    values, indices = sg.topk(logits, 5)
    # N: Revealed shape is "float[b, t, 5]"
    sg.reveal_shape(values)
    # N: Revealed shape is "int[b, t, 5]"
    sg.reveal_shape(indices)
    # N: Revealed shape is "float[b, 2, 50]"
    sg.reveal_shape(sg.topk(logits, 2, dim=1, largest=False)[0])
    # N: Revealed shape is "int[b, t, 1]"
    sg.reveal_shape(logits.topk(1)[1])
    return x


def run() -> float:
    out = ops(sg.randn((2, 8)), sg.randn((2, 3, 50)))
    return float(out.sum().item())
