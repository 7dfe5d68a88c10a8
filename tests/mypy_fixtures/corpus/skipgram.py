"""Skip-gram with negative sampling: embedding lookups and batched dot products."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def sgns_loss(
    center: Int[Tensor, " b"],
    context: Int[Tensor, " b"],
    negatives: Int[Tensor, "b k"],
    w_in: Float[Tensor, "v d"],
    w_out: Float[Tensor, "v d"],
) -> Float[Tensor, ""]:
    c = sg.embedding(w_in, center)  # [b, d]
    pos = (c * sg.embedding(w_out, context)).sum(axis=-1)  # [b]
    neg = (sg.embedding(w_out, negatives) @ c[:, :, None]).reshape(negatives.shape)  # [b, k]
    return -(sg.log(sg.sigmoid(pos)) + sg.log(sg.sigmoid(-neg)).sum(axis=1)).mean()


def run() -> float:
    rng = np.random.default_rng(0)
    ids = lambda *s: sg.tensor(rng.integers(0, 20, size=s).astype(np.int32))  # noqa: E731
    loss = sgns_loss(ids(6), ids(6), ids(6, 3), sg.randn((20, 4)) * 0.1, sg.randn((20, 4)) * 0.1)
    return float(loss.item())
