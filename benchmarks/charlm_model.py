"""The charlm training loss (examples/charlm.py's model), shared by the benchmarks that time
or render it: depth.py (C, CPU), gpt_cuda.py (GPU), codegen_diff.py (generated source),
gpt_profile.py and sgemm_ab.py.

``params`` is ``{"tokens", "positions", "blocks" (a BlockStack), "ln_w", "ln_b"}``
(:func:`charlm_params`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.nn.transformer import (
    BlockStack,
    block_init,
    embed,
    transformer_block,
    transformer_stack,
)


def charlm_params(
    rng: np.random.Generator, vocab: int, d: int, t: int, blocks: int
) -> dict[str, Any]:
    """The model's parameters: token and position embeddings drawn from ``rng`` (scales 0.02
    and 0.01), ``blocks`` pre-LN blocks (``block_init(0.02)``, seed 0, MLP width 4 d), the
    final LayerNorm's weight and bias."""
    return {
        "tokens": sg.tensor((rng.normal(size=(vocab, d)) * 0.02).astype(np.float32)),
        "positions": sg.tensor((rng.normal(size=(t, d)) * 0.01).astype(np.float32)),
        "blocks": BlockStack.init(block_init(0.02), seed=0, layers=blocks, d=d, f=4 * d),
        "ln_w": sg.ones(d),
        "ln_b": sg.zeros(d),
    }


def charlm_loss(blocks: int, heads: int, vocab: int, loop: bool) -> Callable[..., Any]:
    """Cross-entropy of next-character logits; ``loop`` runs the blocks as one layer loop
    (``transformer_stack(loop=True)``), else unrolled."""

    def loss(p: dict[str, Any], ids: Any, targets: Any) -> Any:
        h = embed(p["tokens"], p["positions"], ids)
        if loop:
            h = transformer_stack(p["blocks"], h, heads, causal=True, loop=True, remat=False)
        else:
            for i in range(blocks):
                h = transformer_block([w[i] for w in p["blocks"]], h, heads, causal=True)
        h = sg.layer_norm(h, p["ln_w"], p["ln_b"])
        logits = h @ p["tokens"].T
        return sg.cross_entropy(logits.reshape((-1, vocab)), targets.reshape((-1,)))

    return loss
