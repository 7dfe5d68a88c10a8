"""``MultiheadAttention``: :func:`~shapegrad.nn.multi_head_attention` as a typed module.

Parameters carry PyTorch's names and layouts (``torch.nn.MultiheadAttention(d, heads,
batch_first=True)``): the packed ``in_proj_weight [3d, d]`` (query rows, key rows, value
rows) and ``in_proj_bias [3d]``, then ``out_proj_weight``/``out_proj_bias`` (PyTorch's
``out_proj.weight``/``out_proj.bias``). ``heads`` is a static setting: ``init`` builds
tensors from dims, so set it with ``.replace(heads=4)``.

Example:
    >>> attn = sg.nn.MultiheadAttention.init(seed=0, d=64).replace(heads=4)
    >>> attn(x, causal=True).shape          # x: [b, t, 64]
    (b, t, 64)
"""

from __future__ import annotations

from jaxtyping import Float

from shapegrad.nn._module import Module
from shapegrad.nn.attention import multi_head_attention
from shapegrad.shapes import ShapeError
from shapegrad.tensor import Tensor

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """Self-attention of ``x: [b, t, d]`` with ``heads`` heads (``d % heads == 0``)."""

    in_proj_weight: Float[Tensor, "3*d d"]
    in_proj_bias: Float[Tensor, " 3*d"]
    out_proj_weight: Float[Tensor, "d d"]
    out_proj_bias: Float[Tensor, " d"]
    heads: int = 1

    def __call__(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """``[b, t, d] -> [b, t, d]``; ``mask``: boolean, True where a query may attend."""
        d = self.out_proj_weight.shape[0]
        if not isinstance(self.heads, int) or self.heads < 1 or d % self.heads:
            raise ShapeError(
                "MultiheadAttention", f"heads must be a positive divisor of d = {d}, got {self.heads!r}"
            )
        params = (self.in_proj_weight, self.in_proj_bias, self.out_proj_weight, self.out_proj_bias)
        return multi_head_attention(params, x, self.heads, mask=mask, causal=causal)
