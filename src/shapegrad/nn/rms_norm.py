"""``RMSNorm``: root-mean-square normalisation over the last axis (``torch.nn.RMSNorm``).

``y = x / sqrt(mean(x**2, last axis) + eps) * weight``: no centring and no bias, as in
LLaMA. ``eps=None`` (the default, PyTorch's) uses the machine epsilon of ``x``'s dtype.

Example:
    >>> norm = sg.nn.RMSNorm.init(c=64)
    >>> norm(x).shape                       # x: [b, t, 64]
    (b, t, 64)
"""

from __future__ import annotations

import ml_dtypes
from jaxtyping import Float

from shapegrad import functional as F
from shapegrad._fused import eager_kernel
from shapegrad.nn._module import Module, field
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["RMSNorm", "rms_norm"]


@eager_kernel("rms_norm")
def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * weight`` for ``x: [..., c]``, ``weight: [c]``."""
    if not x.ndim or not x.dtype.is_float:
        raise ShapeError("rms_norm", f"needs a floating-point x of rank >= 1, got {x.aval}")
    if weight is not None and weight.shape != x.shape[-1:]:
        raise ShapeError(
            "rms_norm", f"weight {fmt(weight.shape)} should be [{x.shape[-1]}] for x {fmt(x.shape)}"
        )
    if eps is None:
        eps = float(ml_dtypes.finfo(x.dtype.numpy).eps)
    y = x / F.sqrt(F.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if weight is None else y * weight


class RMSNorm(Module):
    """RMS normalisation over the last axis (size ``c``) with a gain ``weight`` (ones)."""

    weight: Float[Tensor, " c"] = field(role="gain")
    eps: float | None = None

    def __call__(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)
