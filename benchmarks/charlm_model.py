"""The charlm training loss (examples/charlm.py's model), shared by the benchmarks that time
or render it: depth.py (C, CPU), gpt_cuda.py (GPU) and codegen_diff.py (generated source).

``params`` is ``{"tokens", "positions", "blocks" (a BlockStack), "ln_w", "ln_b"}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import shapegrad as sg
from shapegrad.nn.transformer import embed, transformer_block, transformer_stack


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
