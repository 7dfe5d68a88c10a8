"""Multi-head attention as pure functions over tensors and ParamLists.

Layouts follow PyTorch: activations are ``[batch, time, d_model]``; the fused
input projection is ``w_qkv: [3*d, d]`` (``nn.MultiheadAttention.in_proj_weight``:
query rows, then key rows, then value rows), the output projection ``w_o: [d, d]``.
Heads are split by reshape + transpose (``[b, t, d] -> [b, h, t, d/h]``) and merged
back the same way, so no data is copied in compiled code (layout ops are index maps).

Masks follow ``torch.nn.functional.scaled_dot_product_attention``: a boolean mask is
True where a query may attend to a key; ``causal=True`` adds the lower-triangular mask.
Masked scores get the dtype's most negative finite value rather than ``-inf``, so a row
with every key masked gives a uniform average instead of NaN.

Example:
    >>> params = AttentionParams.init(attention_init(), seed=0, d=64)
    >>> y = sg.nn.multi_head_attention(params, x, heads=4, causal=True)   # x: [b, t, 64]
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes

from shapegrad import functional as F
from shapegrad._fused import eager_kernel
from shapegrad.dtypes import ALL_DTYPES, int32
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, broadcast_shapes, fmt
from shapegrad.tensor import Tensor
from shapegrad.typing import Float, ParamList

__all__ = [
    "AttentionParams",
    "attention_init",
    "causal_mask",
    "merge_heads",
    "multi_head_attention",
    "scaled_dot_product_attention",
    "split_heads",
]


class AttentionParams(
    ParamList[
        Float[Tensor, "3*d d"],  # w_qkv
        Float[Tensor, "3*d"],  # b_qkv
        Float[Tensor, "d d"],  # w_o
        Float[Tensor, "d"],  # b_o
    ]
):
    """Parameters of one multi-head attention layer (PyTorch's packed in-projection)."""

    names = ("w_qkv", "b_qkv", "w_o", "b_o")


def attention_init(std: float = 0.02) -> list[Any]:
    """Per-element initializers for :class:`AttentionParams`: N(0, std) weights, zero biases."""
    from shapegrad.nn import init

    return [init.normal(std), init.zeros, init.normal(std), init.zeros]


# the most negative finite value per dtype: masked scores (exp() of it minus the max is 0)
_LOWEST = {d.name: float(ml_dtypes.finfo(d.numpy).min) for d in ALL_DTYPES if d.is_float}


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``[b, t, d] -> [b, heads, t, d/heads]``."""
    if x.ndim != 3 or x.shape[2] % heads:
        raise ShapeError(
            "split_heads", f"needs [batch, time, d] with d divisible by {heads}, got {fmt(x.shape)}"
        )
    b, t, d = x.shape
    return F.transpose(F.reshape(x, (b, t, heads, d // heads)), (0, 2, 1, 3))


def merge_heads(x: Tensor) -> Tensor:
    """``[b, heads, t, dh] -> [b, t, heads*dh]`` (inverse of :func:`split_heads`)."""
    if x.ndim != 4:
        raise ShapeError("merge_heads", f"needs [batch, heads, time, dh], got {fmt(x.shape)}")
    b, h, t, dh = x.shape
    return F.reshape(F.transpose(x, (0, 2, 1, 3)), (b, t, h * dh))


def causal_mask(tq: int, tk: int, like: Tensor) -> Tensor:
    """Boolean ``[tq, tk]``: query ``i`` sees keys ``j <= i + (tk - tq)`` (PyTorch's alignment)."""
    rows = p.iota((tq, tk), 0, int32, like=like)
    cols = p.iota((tq, tk), 1, int32, like=like)
    return cols <= rows + (tk - tq)


@eager_kernel("scaled_dot_product_attention")
def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``softmax(q k^T * scale + mask) v`` over the last two axes.

    Args:
        q: ``[..., tq, dk]``; k: ``[..., tk, dk]``; v: ``[..., tk, dv]`` (same leading dims).
        mask: optional boolean tensor broadcastable to ``[..., tq, tk]``; True = may attend.
        causal: also mask keys after each query (lower-triangular).
        scale: score scale, default ``1/sqrt(dk)``.
    Returns:
        ``[..., tq, dv]``.
    Example:
        >>> sg.nn.scaled_dot_product_attention(q, k, v, causal=True).shape
    """
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ShapeError(
            "scaled_dot_product_attention",
            f"q, k, v need one rank >= 2, got {fmt(q.shape)}, {fmt(k.shape)}, {fmt(v.shape)}",
        )
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead or k.shape[-1] != q.shape[-1]:
        raise ShapeError(
            "scaled_dot_product_attention",
            f"q {fmt(q.shape)}, k {fmt(k.shape)}, v {fmt(v.shape)} disagree "
            "(leading dims must match, and k's last dim must equal q's)",
        )
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(
            "scaled_dot_product_attention",
            f"k has {k.shape[-2]} keys but v has {v.shape[-2]} values",
        )
    tq, tk = q.shape[-2], k.shape[-2]
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    letters = "abcdefgh"[: len(lead)]
    scores = F.einsum(f"{letters}qd,{letters}kd->{letters}qk", q, k) * factor
    keep: Tensor | None = None
    if causal:
        keep = causal_mask(tq, tk, like=q)
    if mask is not None:
        if mask.dtype.name != "bool":
            raise ShapeError(
                "scaled_dot_product_attention",
                f"mask must be bool (True = attend), got {mask.dtype}",
            )
        if keep is None:
            keep = mask
        else:
            shape = broadcast_shapes("scaled_dot_product_attention", keep.shape, mask.shape)
            keep = p.where(p.broadcast_to(keep, shape), p.broadcast_to(mask, shape), False)
    if keep is not None:
        keep = p.broadcast_to(keep, scores.shape, "scaled_dot_product_attention")
        lowest = _LOWEST[q.dtype.name]
        scores = F.where(keep, scores, lowest)
    weights = F.softmax(scores, axis=-1)
    return F.einsum(f"{letters}qk,{letters}kd->{letters}qd", weights, v)


def multi_head_attention(
    params: AttentionParams | tuple[Tensor, ...],
    x: Tensor,
    heads: int,
    mask: Tensor | None = None,
    causal: bool = False,
) -> Tensor:
    """Self-attention of ``x: [b, t, d]`` with ``heads`` heads; returns ``[b, t, d]``.

    Equals ``torch.nn.MultiheadAttention(d, heads, batch_first=True)`` with
    ``in_proj_weight = w_qkv``, ``in_proj_bias = b_qkv``, ``out_proj = (w_o, b_o)``.
    ``mask`` is boolean ``[t, t]`` or ``[b, 1, t, t]`` (True = may attend), e.g. a padding
    mask ``keys_valid[:, None, None, :]``.
    """
    w_qkv, b_qkv, w_o, b_o = params
    if x.ndim != 3 or x.shape[2] * 3 != w_qkv.shape[0] or x.shape[2] != w_qkv.shape[1]:
        raise ShapeError(
            "multi_head_attention",
            f"x {fmt(x.shape)} needs [batch, time, d] with w_qkv [3*d, d], got {fmt(w_qkv.shape)}",
        )
    b, t, d = x.shape
    qkv = F.matmul(x, w_qkv.T) + b_qkv  # [b, t, 3d]
    q = split_heads(qkv[:, :, :d], heads)
    k = split_heads(qkv[:, :, d : 2 * d], heads)
    v = split_heads(qkv[:, :, 2 * d :], heads)
    out = merge_heads(scaled_dot_product_attention(q, k, v, mask=mask, causal=causal))
    return F.matmul(out, w_o.T) + b_o
