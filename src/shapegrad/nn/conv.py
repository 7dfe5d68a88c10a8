"""``Conv2d``: a 2-d convolution layer over the functional :func:`shapegrad.conv2d`.

Layouts follow PyTorch: input ``[N, c_in, H, W]`` (NCHW), weight ``[c_out, c_in, kh, kw]``
(OIHW), bias ``[c_out]``. ``stride``/``padding`` are static settings (part of the
structure, not leaves): set them with ``.replace(stride=2, padding=1)``.

Example:
    >>> conv = sg.nn.Conv2d.init(seed=0, c_in=3, c_out=16, kh=3, kw=3).replace(padding=1)
    >>> conv(x).shape                       # x: [N, 3, 32, 32]
    (N, 16, 32, 32)
"""

from __future__ import annotations

from jaxtyping import Float

from shapegrad._conv import conv2d
from shapegrad.nn._module import Module
from shapegrad.tensor import Tensor

__all__ = ["Conv2d"]


class Conv2d(Module):
    """``torch.nn.Conv2d(c_in, c_out, (kh, kw), stride, padding)`` (no dilation or groups).

    The weight is drawn with std ``1/sqrt(c_in * kh * kw)`` (LeCun normal), the bias is zero.
    The bias is always a field; for PyTorch's ``bias=False`` call the functional
    ``sg.conv2d(x, weight)`` from your own module.
    """

    weight: Float[Tensor, "c_out c_in kh kw"]
    bias: Float[Tensor, " c_out"]
    stride: int | tuple[int, int] = 1
    padding: int | tuple[int, int] = 0

    def __call__(self, x: Tensor) -> Tensor:
        """``[N, c_in, H, W] -> [N, c_out, Ho, Wo]``, ``Ho = (H + 2 ph - kh) // sh + 1``."""
        return conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)
