"""Pre-LayerNorm transformer blocks, embeddings and stacks, as functions over ParamLists.

One block (GPT-2 / ``nn.TransformerEncoderLayer(norm_first=True)`` ordering)::

    x = x + attention(layer_norm(x))
    x = x + w_2 @ gelu(w_1 @ layer_norm(x))

GELU is the tanh approximation (``sg.gelu``); compare with PyTorch's
``activation=lambda x: F.gelu(x, approximate="tanh")``. A *stack* keeps every
block's parameters stacked along a leading ``layers`` dim (``Float[Tensor, "layers d"]``)
and runs the blocks either unrolled or as one :func:`shapegrad.scan` layer loop whose
body is traced, optimized and compiled once (``loop=True``); with ``remat`` the loop's
backward recomputes each block from its stored input instead of keeping activations.

Example:
    >>> params = BlockStack.init(block_init(), seed=0, layers=4, d=64, f=256)
    >>> y = sg.nn.transformer_stack(params, x, heads=4, causal=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shapegrad import functional as F
from shapegrad.nn.attention import multi_head_attention
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor
from shapegrad.typing import Float, Int, ParamList

__all__ = [
    "BlockParams",
    "BlockStack",
    "block_init",
    "embed",
    "stack_blocks",
    "transformer_block",
    "transformer_stack",
]

BLOCK_NAMES = (
    "ln1_w",
    "ln1_b",
    "w_qkv",
    "b_qkv",
    "w_o",
    "b_o",
    "ln2_w",
    "ln2_b",
    "w_1",
    "b_1",
    "w_2",
    "b_2",
)


class BlockParams(
    ParamList[
        Float[Tensor, "d"],
        Float[Tensor, "d"],
        Float[Tensor, "3*d d"],
        Float[Tensor, "3*d"],
        Float[Tensor, "d d"],
        Float[Tensor, "d"],
        Float[Tensor, "d"],
        Float[Tensor, "d"],
        Float[Tensor, "f d"],
        Float[Tensor, "f"],
        Float[Tensor, "d f"],
        Float[Tensor, "d"],
    ]
):
    """One pre-LN block: two LayerNorms, attention (packed qkv), a GELU MLP of width ``f``."""

    names = BLOCK_NAMES


class BlockStack(
    ParamList[
        Float[Tensor, "layers d"],
        Float[Tensor, "layers d"],
        Float[Tensor, "layers 3*d d"],
        Float[Tensor, "layers 3*d"],
        Float[Tensor, "layers d d"],
        Float[Tensor, "layers d"],
        Float[Tensor, "layers d"],
        Float[Tensor, "layers d"],
        Float[Tensor, "layers f d"],
        Float[Tensor, "layers f"],
        Float[Tensor, "layers d f"],
        Float[Tensor, "layers d"],
    ]
):
    """``layers`` blocks' parameters, each stacked along a leading ``layers`` dim."""

    names = BLOCK_NAMES


def block_init(std: float = 0.02) -> list[Any]:
    """Per-element initializers for :class:`BlockParams` / :class:`BlockStack` (GPT-2 style:
    LayerNorm weights one, biases zero, matrices N(0, std))."""
    from shapegrad.nn import init

    w, z, o = init.normal(std), init.zeros, init.ones
    return [o, z, w, z, w, z, o, z, w, z, w, z]


def transformer_block(
    params: BlockParams | Sequence[Tensor],
    x: Tensor,
    heads: int,
    mask: Tensor | None = None,
    causal: bool = False,
    eps: float = 1e-5,
) -> Tensor:
    """One pre-LN block on ``x: [b, t, d]`` (see the module docstring); returns ``[b, t, d]``."""
    if len(params) != 12:
        raise ValueError(
            f"transformer_block: needs the 12 tensors of BlockParams, got {len(params)}"
        )
    ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_1, b_1, w_2, b_2 = params
    h = F.layer_norm(x, ln1_w, ln1_b, eps=eps)
    x = x + multi_head_attention((w_qkv, b_qkv, w_o, b_o), h, heads, mask=mask, causal=causal)
    h = F.layer_norm(x, ln2_w, ln2_b, eps=eps)
    h = F.gelu(F.matmul(h, w_1.T) + b_1)
    return x + F.matmul(h, w_2.T) + b_2


def stack_blocks(blocks: Sequence[Sequence[Tensor]]) -> BlockStack:
    """Stack per-block parameter lists into one :class:`BlockStack`."""
    if not blocks:
        raise ValueError("stack_blocks: needs at least one block")
    return BlockStack([F.stack([b[i] for b in blocks]) for i in range(len(blocks[0]))])


def transformer_stack(
    params: BlockStack | Sequence[Tensor],
    x: Tensor,
    heads: int,
    mask: Tensor | None = None,
    causal: bool = False,
    loop: bool = True,
    remat: bool = True,
) -> Tensor:
    """All blocks of ``params`` (stacked on a leading ``layers`` dim) applied in order.

    Args:
        params: a :class:`BlockStack`.
        x: ``[b, t, d]``.
        heads, mask, causal: as for :func:`transformer_block`.
        loop: run the blocks as one ``sg.scan`` layer loop (traced and compiled once);
            False unrolls them in Python (one copy of the block per layer in the graph).
        remat: with ``loop``, the backward pass recomputes each block from its stored
            input (memory: one activation per layer) instead of storing its residuals.
    """
    if len(params) != 12:
        raise ValueError(
            f"transformer_stack: needs the 12 tensors of BlockStack, got {len(params)}"
        )
    layers = params[0].shape[0] if params[0].ndim else 0
    if any(t.ndim < 1 or t.shape[0] != layers for t in params):
        shown = ", ".join(fmt(t.shape) for t in params)
        raise ShapeError(
            "transformer_stack", f"every parameter needs the leading 'layers' dim: {shown}"
        )
    if not loop:
        for i in range(layers):
            x = transformer_block([t[i] for t in params], x, heads, mask=mask, causal=causal)
        return x
    from shapegrad.control import scan

    def body(h: Tensor, block: tuple[Tensor, ...]) -> tuple[Tensor, None]:
        return transformer_block(block, h, heads, mask=mask, causal=causal), None

    out: Tensor = scan(body, x, tuple(params), policy="recompute" if remat else "residuals")[0]
    return out


def embed(
    token_table: Float[Tensor, "v d"],
    position_table: Float[Tensor, "tmax d"],
    ids: Int[Tensor, "b t"],
) -> Float[Tensor, "b t d"]:
    """Token embeddings plus learned positional embeddings of positions ``0..t-1``."""
    if ids.ndim != 2 or ids.shape[1] > position_table.shape[0]:
        raise ShapeError(
            "embed",
            f"ids {fmt(ids.shape)} need [batch, time] with time <= {position_table.shape[0]} "
            "(the positional table's length)",
        )
    t = ids.shape[1]
    return F.embedding(token_table, ids) + position_table[:t]
