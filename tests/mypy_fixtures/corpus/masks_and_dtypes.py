"""Masks and mixed dtypes: one_hot targets with label smoothing, integer arithmetic on
labels, bool masks from comparisons combined with ``where``, accuracy by ``==`` and casts,
``Int``/``Bool`` annotations, top-k hits."""

import numpy as np

import shapegrad as sg
from shapegrad import Bool, Float, Int, Tensor

SMOOTH = 0.1


@sg.typechecked
def smoothed_targets(y: Int[Tensor, " b"], k: int) -> Float[Tensor, "b k"]:
    return sg.one_hot(y, k) * (1.0 - SMOOTH) + SMOOTH / k


@sg.typechecked
def soft_ce(logits: Float[Tensor, "b k"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    t = smoothed_targets(y, logits.shape[-1])
    return -(t * sg.log_softmax(logits, axis=-1)).sum(axis=-1).mean()


@sg.typechecked
def accuracy(logits: Float[Tensor, "b k"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    hits = logits.argmax(axis=-1) == y
    return hits.astype("float32").mean()


@sg.typechecked
def topk_hit(logits: Float[Tensor, "b k"], y: Int[Tensor, " b"], k: int) -> Bool[Tensor, " b"]:
    _, idx = logits.topk(k, axis=-1)
    return (idx == y[:, None]).astype("int32").sum(axis=-1) > 0


@sg.typechecked
def shift_labels(y: Int[Tensor, "b t"], pad: int) -> Int[Tensor, "b t"]:
    nxt = sg.concat([y[:, 1:], sg.full((y.shape[0], 1), pad, dtype="int32")], axis=1)
    return nxt


@sg.typechecked
def masked_mse(pred: Float[Tensor, "b t"], target: Float[Tensor, "b t"], valid: Bool[Tensor, "b t"]) -> Float[Tensor, ""]:
    err = sg.where(valid, (pred - target) ** 2, 0.0)
    return err.sum() / sg.maximum(valid.astype("float32").sum(), 1.0)


@sg.typechecked
def bucketize(x: Float[Tensor, " n"], edges: Float[Tensor, " m"]) -> Int[Tensor, " n"]:
    return (x[:, None] >= edges[None, :]).astype("int32").sum(axis=1)


def run() -> float:
    logits = sg.randn((4, 5), seed=0)
    y = sg.tensor(np.array([0, 4, 2, 1], dtype=np.int32))
    labels = sg.tensor(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    pred, tgt = sg.randn((2, 3), seed=1), sg.randn((2, 3), seed=2)
    valid = sg.rand((2, 3), seed=3) > 0.4
    total = soft_ce(logits, y) + accuracy(logits, y) + masked_mse(pred, tgt, valid)
    extra = topk_hit(logits, y, 2).astype("float32").sum() + shift_labels(labels, 0).astype("float32").sum()
    return float((total + extra + bucketize(sg.randn((6,), seed=4), sg.tensor([-1.0, 0.0, 1.0])).float().sum()).item())
