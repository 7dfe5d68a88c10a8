"""Bug: the causal mask is built for the channel count instead of the sequence length."""

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


def causal_mask(t: int) -> Bool[Tensor, "t t"]:
    i = sg.arange(t)
    return i[:, None] >= i[None, :]


@sg.typechecked
def masked_scores(q: Float[Tensor, "b t c"], k: Float[Tensor, "b t c"]) -> Float[Tensor, "b t t"]:
    B, T, C = q.shape
    scores = q @ k.transpose(0, 2, 1)
    # E: where: cannot broadcast causal_mask(...) [c, c] and scores [b, t, t] and []: dimension -1 is c vs t; if c and t are the same size, give them one name
    return sg.where(causal_mask(C), scores, -1e9)


def run() -> None:
    masked_scores(sg.rand((2, 5, 3)), sg.rand((2, 5, 3)))
