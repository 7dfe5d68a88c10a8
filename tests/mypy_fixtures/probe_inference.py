"""Inference probe: each assignment's annotation is deliberately wrong, so mypy's message
reveals the shape the plugin inferred for the expression (one line per op rule)."""

# ruff: noqa: F821, F841  (unused probes; one-name jaxtyping specs such as "b" look like forward references)

import shapegrad as sg
from shapegrad import Bool, Float, Int, Tensor

Wrong = Float[Tensor, "0 0 0 0 0"]


def probe(
    x: Float[Tensor, "b 784"],
    w: Float[Tensor, "784 10"],
    v: Float[Tensor, "784"],
    img: Float[Tensor, "b 3 32 32"],
    k: Float[Tensor, "16 3 5 5"],
    seq: Float[Tensor, "*batch t d"],
    labels: Int[Tensor, "b"],
    mask: Bool[Tensor, "b 784"],
) -> None:
    # E: assignment to a1: value has shape [b, 10], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    a1: Wrong = x @ w
    # E: assignment to a2: value has shape [b], but the annotation says [0, 0, 0, 0, 0] (rank 1 != 5)
    a2: Wrong = x @ v
    # E: assignment to a3: value has shape [10], but the annotation says [0, 0, 0, 0, 0] (rank 1 != 5)
    a3: Wrong = v @ w
    a4: Wrong = seq @ seq.transpose(-1, -2)  # variadic rank: transpose stays unknown (no error)
    # E: assignment to a5: value has shape [b, 1], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    a5: Wrong = x.sum(axis=1, keepdims=True)
    # E: assignment to a6: value has shape [], but the annotation says [0, 0, 0, 0, 0] (rank 0 != 5)
    a6: Wrong = sg.mean(x, axis=(0, 1))
    # E: assignment to a7: value has shape [b], but the annotation says [0, 0, 0, 0, 0] (rank 1 != 5)
    a7: Wrong = x.max(axis=-1)
    # E: assignment to a8: value has shape [b, 28, 28], but the annotation says [0, 0, 0, 0, 0] (rank 3 != 5)
    a8: Wrong = x.reshape(-1, 28, 28)
    # E: assignment to a9: value has shape [784, b], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    a9: Wrong = x.T
    # E: assignment to b1: value has shape [b, 32, 32, 3], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    b1: Wrong = img.permute(0, 2, 3, 1)
    # E: assignment to b2: value has shape [2 * b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    b2: Wrong = sg.concat([x, x], axis=0)
    # E: assignment to b3: value has shape [b, 3, 784], but the annotation says [0, 0, 0, 0, 0] (rank 3 != 5)
    b3: Wrong = sg.stack([x, x, x], axis=1)
    # E: assignment to b4: value has shape [10], but the annotation says [0, 0, 0, 0, 0] (rank 1 != 5)
    b4: Wrong = x[0, 10:20]
    # E: assignment to b5: value has shape [b, 1, 392], but the annotation says [0, 0, 0, 0, 0] (rank 3 != 5)
    b5: Wrong = x[:, None, ::2]
    # E: assignment to b6: value has shape [b, 16, 16, 16], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    b6: Wrong = sg.conv2d(img, k, stride=2, padding=2)
    # E: assignment to b7: value has shape [b, 3, 16, 16], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    b7: Wrong = sg.max_pool2d(img, 2)
    # E: assignment to b8: value has shape [], but the annotation says [0, 0, 0, 0, 0] (rank 0 != 5)
    b8: Wrong = sg.cross_entropy(x @ w, labels)
    # E: assignment to b9: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    b9: Wrong = sg.where(mask, x, 0.0)
    # E: assignment to c1: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c1: Wrong = x > v
    # E: assignment to c2: value has shape [*batch, t, d], but the annotation says [0, 0, 0, 0, 0] (dimension -1: d != 0)
    c2: Wrong = sg.softmax(seq, axis=-1)
    # E: assignment to c3: value has shape [10, b], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c3: Wrong = sg.einsum("bi,ij->jb", x, w)
    # E: assignment to c4: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c4: Wrong = 2.0 * x - v
    # E: assignment to c5: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c5: Wrong = sg.maximum(x, v) ** 2
    # E: assignment to c6: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c6: Wrong = sg.layer_norm(x)
    # E: assignment to c7: value has shape [b, 10], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c7: Wrong = sg.one_hot(labels, 10)
    # E: assignment to c8: value has shape [3, 4], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    c8: Wrong = sg.zeros((3, 4))
    # E: assignment to c9: value has shape [*batch, t], but the annotation says [0, 0, 0, 0, 0] (dimension -1: t != 0)
    c9: Wrong = seq.sum(axis=-1)
    # E: assignment to e1: value has shape [b, 32, 3, 32], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    e1: Wrong = img.swapaxes(1, -2)
    # E: assignment to e2: value has shape [*batch, d, t], but the annotation says [0, 0, 0, 0, 0] (dimension -1: t != 0)
    e2: Wrong = seq.swapaxes(-1, -2)
    e3: Wrong = seq.swapaxes(0, -1)  # variadic rank: axis 0 may be in *batch (no error)
    # PyTorch reshaping spellings and sizes unpacked from a shape
    # E: assignment to f1: value has shape [b, 3, 1024], but the annotation says [0, 0, 0, 0, 0] (rank 3 != 5)
    f1: Wrong = img.view(*img.shape[:2], -1)
    # E: assignment to f2: value has shape [b, 3, 32, 5], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    f2: Wrong = sg.zeros(img.shape[:-1] + (5,))
    # E: assignment to f3: value has shape [b, 3, 32, 32], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    f3: Wrong = img[:, :1].expand(-1, 3, -1, -1)
    # E: assignment to f4: value has shape [b, 3072], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    f4: Wrong = img.flatten(1)
    # E: assignment to f5: value has shape [3 * b, 32, 32], but the annotation says [0, 0, 0, 0, 0] (rank 3 != 5)
    f5: Wrong = img.flatten(0, 1)
    # E: assignment to f6: value has shape [b, 32, 32, 3], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    f6: Wrong = img.permute((0, 2, 3, 1))
    # E: assignment to f7: value has shape [b, 784], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    f7: Wrong = x.clamp(min=0.0)
    # E: assignment to f8: value has shape [b, b, 32, 32], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    f8: Wrong = sg.take(img, labels, axis=1)
    # one integer index tensor: its dims replace the axis; a mask's result is data-dependent
    # E: assignment to g1: value has shape [b, 10], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    g1: Wrong = w[labels]
    # E: assignment to g2: value has shape [b, 3, b, 32], but the annotation says [0, 0, 0, 0, 0] (rank 4 != 5)
    g2: Wrong = img[:, :, labels]
    g3: Wrong = x[mask]  # no error: unknown
    g4: Wrong = img[0, :, labels]  # no error: an int beside it moves the result axes (NumPy)
    # counted from the end by a symbolic size (x[-0:] is all of x): its length is unknown
    # E: assignment to f9: value has shape [b, ?], but the annotation says [0, 0, 0, 0, 0] (rank 2 != 5)
    f9: Wrong = x[:, -x.shape[0] :]
    # dtype kinds: a comparison is Bool, an Int tensor times a Python float is unknown
    # E: assignment to d1: value is bool, but the annotation says int
    d1: Int[Tensor, "b 784"] = x > v
    d2: Int[Tensor, " b"] = labels * 0.5
