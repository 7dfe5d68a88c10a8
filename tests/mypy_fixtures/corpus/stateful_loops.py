"""Stateful loops: an optional hidden state filled on the first step, a dict of named
outputs, a generator yielding mini-batches, and a tuple return with an optional member."""

from collections.abc import Iterator

import shapegrad as sg
from shapegrad import Float, Tensor


def batches(x: Float[Tensor, "n d"], size: int) -> Iterator[Float[Tensor, "m d"]]:
    for start in range(0, x.shape[0], size):
        yield x[start : start + size]


@sg.typechecked
def running_state(xs: Float[Tensor, "t b d"], w: Float[Tensor, "d d"]) -> Float[Tensor, "b d"]:
    h: Float[Tensor, "b d"] | None = None
    for t in range(xs.shape[0]):
        x = xs[t]
        h = sg.tanh(x @ w) if h is None else sg.tanh(x @ w + h)
    assert h is not None
    return h


@sg.typechecked
def heads(x: Float[Tensor, "b d"], w: Float[Tensor, "d k"]) -> dict[str, Tensor]:
    logits = x @ w
    return {"logits": logits, "probs": sg.softmax(logits, axis=-1), "pooled": x.mean(axis=0)}


@sg.typechecked
def maybe_aux(x: Float[Tensor, "b d"], with_aux: bool) -> tuple[Float[Tensor, "b d"], Float[Tensor, " b"] | None]:
    y = sg.relu(x)
    if not with_aux:
        return y, None
    return y, y.sum(axis=-1)


@sg.typechecked
def mean_of_batches(x: Float[Tensor, "n d"]) -> Float[Tensor, " d"]:
    total = sg.zeros((x.shape[1],))
    count = 0
    for batch in batches(x, 2):
        total = total + batch.sum(axis=0)
        count += batch.shape[0]
    return total / count


def run() -> float:
    xs = sg.randn((3, 2, 4), seed=0)
    w = sg.randn((4, 4), seed=1) * 0.3
    out = heads(running_state(xs, w), sg.randn((4, 3), seed=2))
    y, aux = maybe_aux(xs[0], True)
    assert aux is not None
    return float(out["probs"].sum().item() + y.sum().item() + aux.sum().item() + mean_of_batches(sg.randn((5, 4))).sum().item())
