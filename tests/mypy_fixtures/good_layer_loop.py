"""Correct: a layer loop over stacked per-layer weights, a checkpointed region and the
transformer stack (no shape errors: the plugin must not report any)."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor
from shapegrad.nn.transformer import BlockStack, block_init, transformer_stack


class Stack(ParamList[Float[Tensor, "layers d d"], Float[Tensor, "layers d"]]):
    names = ("w", "b")


def layer(
    h: Float[Tensor, "b d"],
    wb: tuple[Float[Tensor, "d d"], Float[Tensor, "d"]],  # noqa: F821 (a dim name, not a forward reference)
) -> tuple[Float[Tensor, "b d"], None]:
    w, bias = wb
    return sg.tanh(h @ w.T + bias), None


def deep(params: Stack, x: Float[Tensor, "b d"]) -> Float[Tensor, "b d"]:
    h, _ = sg.scan(layer, x, (params[0], params[1]))
    out: Float[Tensor, "b d"] = sg.checkpoint(lambda t: sg.gelu(t) + t)(h)
    return out


def run() -> float:
    params = Stack.init(sg.nn.init.kaiming, seed=0, layers=4, d=8)
    x: Float[Tensor, "2 8"] = sg.randn((2, 8))
    blocks = BlockStack.init(block_init(), seed=1, layers=2, d=8, f=16)
    y: Float[Tensor, "2 3 8"] = sg.randn((2, 3, 8))
    z = transformer_stack(blocks, y, heads=2, causal=True)
    return float(deep(params, x).sum().item()) + float(z.sum().item())
