"""The demo models: typed parameter packs and pure forward/loss functions.

Each model is a :class:`~shapegrad.typing.ParamList` subclass whose annotations
give every parameter's shape (weights are ``[out, in]`` like PyTorch), plus
plain functions of ``(params, inputs)``. The same functions run eagerly and
under ``sg.compile``.

Example:
    >>> params = MoonsMLP.init(kaiming, seed=0, h=16)
    >>> [p.shape for p in params]
    [(16, 2), (16,), (16, 16), (16,), (1, 16), (1,)]
"""

from __future__ import annotations

from jaxtyping import Float, Int

from shapegrad import functional as F
from shapegrad.nn.init import kaiming
from shapegrad.nn.layers import linear, mlp
from shapegrad.tensor import Tensor
from shapegrad.typing import ParamList

__all__ = [
    "DigitsCNN",
    "DigitsMLP",
    "MoonsMLP",
    "accuracy",
    "digits_cnn_logits",
    "digits_cnn_loss",
    "digits_logits",
    "digits_loss",
    "kaiming",
    "moons_loss",
    "moons_scores",
]


# --- moons: 2-16-16-1 MLP with a hinge loss (labels in {-1, +1}) ---------------------------


class MoonsMLP(
    ParamList[
        Float[Tensor, "h 2"],
        Float[Tensor, "h"],
        Float[Tensor, "h h"],
        Float[Tensor, "h"],
        Float[Tensor, "1 h"],
        Float[Tensor, "1"],
    ]
):
    """Parameters of the 2-h-h-1 ReLU MLP of ``shapegrad demo moons`` (``h=16``)."""

    names = ("w1", "b1", "w2", "b2", "w3", "b3")


def moons_scores(params: MoonsMLP, x: Float[Tensor, "b 2"]) -> Float[Tensor, " b"]:
    """Real-valued scores; the predicted class is +1 where the score is positive."""
    return mlp(params, x).reshape((x.shape[0],))


def moons_loss(
    params: MoonsMLP, x: Float[Tensor, "b 2"], y: Float[Tensor, " b"]
) -> Float[Tensor, ""]:
    """Mean hinge loss ``mean(relu(1 - y * score))`` for labels ``y`` in {-1, +1}."""
    return F.hinge(moons_scores(params, x), y)


# --- digits: 64-h-h-10 MLP with softmax cross-entropy --------------------------------------


class DigitsMLP(
    ParamList[
        Float[Tensor, "h 64"],
        Float[Tensor, "h"],
        Float[Tensor, "h h"],
        Float[Tensor, "h"],
        Float[Tensor, "10 h"],
        Float[Tensor, "10"],
    ]
):
    """Parameters of the 64-h-h-10 ReLU MLP for 8x8 digit images (flattened)."""

    names = ("w1", "b1", "w2", "b2", "w3", "b3")


def digits_logits(params: DigitsMLP, x: Float[Tensor, "b 64"]) -> Float[Tensor, "b 10"]:
    """Class logits of the digits MLP."""
    return mlp(params, x)


def digits_loss(
    params: DigitsMLP, x: Float[Tensor, "b 64"], y: Int[Tensor, " b"]
) -> Float[Tensor, ""]:
    """Mean softmax cross-entropy against integer labels."""
    return F.cross_entropy(digits_logits(params, x), y)


# --- digits: a small CNN (two 3x3 conv + 2x2 max-pool stages, then a linear layer) ----------


class DigitsCNN(
    ParamList[
        Float[Tensor, "c 1 3 3"],
        Float[Tensor, "c"],
        Float[Tensor, "d c 3 3"],
        Float[Tensor, "d"],
        Float[Tensor, "10 4*d"],
        Float[Tensor, "10"],
    ]
):
    """Parameters of an 8x8 -> 4x4 -> 2x2 convolutional classifier (``c``, ``d`` channels)."""

    names = ("conv1_w", "conv1_b", "conv2_w", "conv2_b", "fc_w", "fc_b")


def digits_cnn_logits(params: DigitsCNN, x: Float[Tensor, "b 1 8 8"]) -> Float[Tensor, "b 10"]:
    """Class logits of the CNN for NCHW images ``[b, 1, 8, 8]``."""
    w1, b1, w2, b2, fc_w, fc_b = params
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)  # [b, c, 4, 4]
    h = F.max_pool2d(F.relu(F.conv2d(h, w2, b2, padding=1)), 2)  # [b, d, 2, 2]
    return linear(h.reshape((x.shape[0], -1)), fc_w, fc_b)


def digits_cnn_loss(
    params: DigitsCNN, x: Float[Tensor, "b 1 8 8"], y: Int[Tensor, " b"]
) -> Float[Tensor, ""]:
    """Mean softmax cross-entropy of the CNN against integer labels."""
    return F.cross_entropy(digits_cnn_logits(params, x), y)


def accuracy(predicted: Int[Tensor, " b"], labels: Int[Tensor, " b"]) -> float:
    """Share of equal entries (eager tensors), as a float in [0, 1]."""
    return float((predicted.numpy() == labels.numpy()).mean())
