"""A GPT on the library's layers: sg.nn.embed, transformer_stack over a BlockStack (scan + remat)."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import BlockStack


class Embeddings(sg.ParamList[Float[Tensor, "v d"], Float[Tensor, "tmax d"], Float[Tensor, "v d"]]):
    names = ("tokens", "positions", "unembed")


@sg.typechecked
def logits(emb: Embeddings, blocks: BlockStack, ids: Int[Tensor, "b t"]) -> Float[Tensor, "b t v"]:
    tokens, positions, unembed = emb
    x = sg.nn.embed(tokens, positions, ids)
    x = sg.nn.transformer_stack(blocks, x, heads=2, causal=True)
    return x @ unembed.T


@sg.typechecked
def loss(
    emb: Embeddings, blocks: BlockStack, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b t"]
) -> Float[Tensor, ""]:
    scores = logits(emb, blocks, ids)
    B, T, V = scores.shape
    return sg.cross_entropy(scores.reshape(B * T, V), targets.reshape(B * T))


def run() -> float:
    emb = Embeddings.init(sg.nn.init.normal(0.1), seed=0, v=13, d=8, tmax=8)
    blocks = BlockStack.init(sg.nn.transformer.block_init(), seed=1, layers=2, d=8, f=16)
    ids = sg.tensor((np.arange(10, dtype=np.int32).reshape(2, 5) * 3) % 13)
    value, grads = sg.value_and_grad(loss, argnums=1)(emb, blocks, ids, ids)
    return float(value.item()) + float(grads[2].sum().item())
