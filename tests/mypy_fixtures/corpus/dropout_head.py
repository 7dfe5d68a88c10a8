"""A classification head with dropout during training and global max pooling over time."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def head(
    feats: Float[Tensor, "b t d"], w: Float[Tensor, "k d"], training: bool, seed: int
) -> Float[Tensor, "b k"]:
    pooled = feats.max(axis=1)  # [b, d]
    if training:
        pooled = sg.dropout(pooled, 0.1, seed=seed)
    return pooled @ w.T


@sg.typechecked
def train_loss(
    feats: Float[Tensor, "b t d"], labels: Int[Tensor, " b"], w: Float[Tensor, "k d"]
) -> Float[Tensor, ""]:
    return sg.cross_entropy(head(feats, w, True, 0), labels)


def run() -> float:
    import numpy as np

    labels = sg.tensor(np.array([0, 2, 1], np.int32))
    return float(train_loss(sg.rand((3, 4, 5)), labels, sg.randn((3, 5))).item())
