"""Bahdanau additive attention over encoder states for one decoder step."""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def additive_attention(
    query: Float[Tensor, "b d"],
    keys: Float[Tensor, "b s e"],
    w_q: Float[Tensor, "d a"],
    w_k: Float[Tensor, "e a"],
    v: Float[Tensor, " a"],
) -> tuple[Float[Tensor, "b e"], Float[Tensor, "b s"]]:
    energy = sg.tanh((query @ w_q)[:, None, :] + keys @ w_k)  # [b, s, a]
    weights = sg.softmax(energy @ v, axis=-1)  # [b, s]
    context = (weights[:, :, None] * keys).sum(axis=1)  # [b, e]
    return context, weights


def run() -> float:
    ctx, w = additive_attention(sg.rand((2, 4)), sg.rand((2, 6, 5)), sg.randn((4, 3)), sg.randn((5, 3)),
                                sg.randn((3,)))  # fmt: skip
    return float(ctx.sum().item() + w.sum().item())
