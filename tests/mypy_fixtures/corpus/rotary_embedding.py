"""Rotary position embeddings: split the head dim in halves, rotate by position angles."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor


def angles(t: int, half: int) -> Float[Tensor, "t half"]:
    inv = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))
    pos = np.arange(t, dtype=np.float32)
    return sg.tensor(np.outer(pos, inv).astype(np.float32))


@sg.typechecked
def rotate(x: Float[Tensor, "b h t k"]) -> Float[Tensor, "b h t k"]:
    B, H, T, K = x.shape
    half = K // 2
    theta = angles(T, half)
    cos, sin = sg.cos(theta), sg.sin(theta)
    x1, x2 = x[:, :, :, :half], x[:, :, :, half:]  # (x[..., :half] trips a run-time indexing bug)
    return sg.concat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)


@sg.typechecked
def rotary_scores(
    q: Float[Tensor, "b h t k"], k: Float[Tensor, "b h t k"]
) -> Float[Tensor, "b h t t"]:
    return rotate(q) @ rotate(k).transpose(0, 1, 3, 2)


def run() -> float:
    s = rotary_scores(sg.randn((1, 2, 5, 8), seed=1), sg.randn((1, 2, 5, 8), seed=2))
    return float(s.sum().item())
