"""Training objectives and metrics, written once against Tensor.

``softmax_cross_entropy`` returns the usual mean cross-entropy *value*, but its
gradient at the logits is the fused analytic form ``(softmax(logits) -
onehot) / N``: the backward pass is one subtraction and a scale, with no LOG,
no EXP and no division through the log-sum-exp. The trick stays inside the
primitive set:

    loss = stop_gradient(ce) + (dot - stop_gradient(dot)),
    dot  = sum(logits * stop_gradient(softmax(logits) - onehot)) / N

``dot - stop_gradient(dot)`` is exactly 0 in value and has gradient
``stop_gradient(softmax - onehot) / N``; ``ce`` contributes only its value.

Example:
    >>> loss = softmax_cross_entropy(logits, labels)   # labels: int32 [N] or one-hot [N, C]
"""

from __future__ import annotations

from shapegrad import functional as F
from shapegrad.dtypes import float32, int32
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor


def one_hot(labels: Tensor, num_classes: int, like: Tensor) -> Tensor:
    """``[N] int32`` class indices -> ``[N, C]`` one-hot in ``like``'s dtype (out-of-range rows are 0)."""
    if labels.dtype != int32:
        raise TypeError(f"one_hot: labels must be int32, got {labels.dtype}")
    shape = (*labels.shape, num_classes)
    classes = p.iota(shape, len(shape) - 1, int32, like=like)
    expanded = p.broadcast_in_dim(labels, shape, tuple(range(labels.ndim)))
    return p.cast(classes == expanded, like.dtype)


def _targets(logits: Tensor, labels: Tensor) -> Tensor:
    """The one-hot (or soft) target matrix for ``logits`` of shape [N, C]."""
    if logits.ndim != 2:
        raise ShapeError(
            "softmax_cross_entropy", f"logits must be [N, C], got shape {fmt(logits.shape)}"
        )
    n, c = logits.shape
    if labels.dtype.is_float:
        if labels.shape != logits.shape:
            raise ShapeError(
                "softmax_cross_entropy",
                f"one-hot targets {fmt(labels.shape)} must match logits {fmt(logits.shape)}",
            )
        return p.cast(labels, logits.dtype)
    if labels.shape != (n,):
        raise ShapeError(
            "softmax_cross_entropy",
            f"integer labels must have shape [{n}] for logits {fmt(logits.shape)}, got {fmt(labels.shape)}",
        )
    return one_hot(p.cast(labels, int32), c, logits)


def softmax_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean softmax cross-entropy with the fused analytic gradient.

    Args:
        logits: ``[N, C]`` float scores.
        labels: ``[N]`` int32 class indices, or ``[N, C]`` float (one-hot or soft) targets
            whose rows sum to 1.
    Returns:
        A 0-d tensor: ``mean_n(logsumexp(logits_n) - <targets_n, logits_n>)``. Its gradient
        with respect to ``logits`` is ``(softmax(logits) - targets) / N``.
    Example:
        >>> softmax_cross_entropy(sg.tensor([[0.0, 0.0]]), sg.tensor([1])).item()  # log 2
        0.6931...
    """
    targets = _targets(logits, labels)
    n = float(logits.shape[0])
    fixed = F.stop_gradient(logits)
    # Where a logit is -inf (masked) its target and residual are 0: select instead of
    # multiplying, since 0 * -inf is NaN (and would poison dot - stop_gradient(dot) too).
    chosen = F.where(targets != 0.0, fixed, 0.0)
    ce = F.sum(F.logsumexp(fixed, axis=1) - F.sum(chosen * targets, axis=1)) / n
    residual = F.stop_gradient(F.softmax(fixed, axis=1) - targets)
    dot = F.sum(F.where(residual != 0.0, logits, 0.0) * residual) / n
    return F.stop_gradient(ce) + (dot - F.stop_gradient(dot))


cross_entropy = softmax_cross_entropy


def predict(logits: Tensor) -> Tensor:
    """Predicted classes: argmax over the last axis for ``[N, C]`` scores (C > 1), and
    ``logits > 0`` as int32 (0/1) for binary scores of shape ``[N]`` or ``[N, 1]``."""
    if logits.ndim == 1 or logits.shape[-1] == 1:
        flat = p.reshape(logits, (logits.shape[0],)) if logits.ndim > 1 else logits
        return p.cast(flat > 0.0, int32)
    return F.argmax(logits, axis=-1)


def accuracy(logits: Tensor, labels: Tensor) -> Tensor:
    """Fraction of correct predictions (a 0-d float32 tensor).

    Args:
        logits: ``[N, C]`` class scores, or ``[N]`` / ``[N, 1]`` binary scores.
        labels: ``[N]`` class indices; for binary scores either {0, 1} or {-1, +1}
            (any label > 0 counts as the positive class).
    Returns:
        ``mean(predict(logits) == labels)`` as float32.
    """
    predicted = predict(logits)
    flat = p.reshape(labels, (labels.shape[0],)) if labels.ndim > 1 else labels
    if logits.ndim == 1 or logits.shape[-1] == 1:
        truth = p.cast(flat > (0.0 if flat.dtype.is_float else 0), int32)
    else:
        truth = p.cast(flat, int32)
    if truth.shape != predicted.shape:
        raise ShapeError(
            "accuracy",
            f"labels {fmt(labels.shape)} do not match predictions {fmt(predicted.shape)}",
        )
    return F.mean(p.cast(truth == predicted, float32))


def mse(prediction: Tensor, target: Tensor) -> Tensor:
    """Mean squared error (delegates to ``shapegrad.functional.mse`` when it exists)."""
    impl = getattr(F, "mse", None)
    if impl is not None:
        result: Tensor = impl(prediction, target)
        return result
    diff = prediction - target
    return F.mean(diff * diff)


def hinge(scores: Tensor, labels: Tensor) -> Tensor:
    """Mean hinge loss ``mean(relu(1 - labels * scores))`` for labels in {-1, +1}
    (delegates to ``shapegrad.functional.hinge`` when it exists)."""
    impl = getattr(F, "hinge", None)
    if impl is not None:
        result: Tensor = impl(scores, labels)
        return result
    return F.mean(F.relu(1.0 - labels * scores))


__all__ = [
    "accuracy",
    "cross_entropy",
    "hinge",
    "mse",
    "one_hot",
    "predict",
    "softmax_cross_entropy",
]
