"""Bug: logits come from all T tokens but the targets are shifted (``tokens[:, 1:]`` is T - 1)."""

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def lm_loss(tokens: Int[Tensor, "b t"], wte: Float[Tensor, "v c"]) -> Float[Tensor, ""]:
    B, T = tokens.shape
    logits = sg.embedding(wte, tokens) @ wte.T  # forgot tokens[:, :-1]
    targets = tokens[:, 1:]
    # E: cross_entropy: labels targets.reshape(...) [b * t - b] do not match logits logits.reshape(...) [b * t, v] (expected [b * t] class indices or [b * t, v] targets)
    return sg.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def run() -> None:
    import numpy as np

    lm_loss(sg.tensor(np.zeros((2, 6), np.int32)), sg.randn((7, 4)))
