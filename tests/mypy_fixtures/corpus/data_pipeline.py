"""Data code with NumPy mixed in: standardise features, one-hot labels, shuffle into batches."""

from collections.abc import Iterator

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


def standardise(x: np.ndarray) -> np.ndarray:
    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-6
    return ((x - mean) / std).astype(np.float32)


def batches(x: np.ndarray, y: np.ndarray, size: int, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
    order = np.random.default_rng(seed).permutation(len(x))
    for start in range(0, len(x) - size + 1, size):
        idx = order[start : start + size]
        yield sg.tensor(x[idx]), sg.tensor(y[idx].astype(np.int32))


@sg.typechecked
def soft_targets(labels: Int[Tensor, " b"], smoothing: float) -> Float[Tensor, "b 4"]:
    hard = sg.one_hot(labels, 4)
    return hard * (1.0 - smoothing) + smoothing / 4


@sg.typechecked
def smoothed_loss(logits: Float[Tensor, "b 4"], labels: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    targets = soft_targets(labels, 0.1)
    return -(targets * sg.log_softmax(logits, axis=-1)).sum(axis=-1).mean()


def run() -> float:
    rng = np.random.default_rng(0)
    x = standardise(rng.normal(3.0, 2.0, size=(40, 6)))
    y = rng.integers(0, 4, size=40)
    w = sg.randn((6, 4), seed=0)
    total = 0.0
    for xb, yb in batches(x, y, 8, seed=1):
        total += float(smoothed_loss(xb @ w, yb).item())
    return total
