"""Correct: what the plugin infers through shapegrad's own layers, scan and checkpoint.

Each ``# N: ...`` comment is the ``sg.reveal_shape`` note expected on the next line.
"""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import BatchNorm, LayerNorm, Linear, Module, field
from shapegrad.nn.attention import merge_heads, scaled_dot_product_attention, split_heads


class Model(Module):
    norm: LayerNorm = field(dims={"c": "d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "v"})
    bn: BatchNorm = field(dims={"c": "d"})
    emb: Float[Tensor, "v d"]


class MLP(sg.ParamList[Float[Tensor, "h 2"], Float[Tensor, " h"]]):
    names = ("w1", "b1")


def layer(
    h: Float[Tensor, "n 4"], w: Float[Tensor, "4 4"]
) -> tuple[Float[Tensor, "n 4"], Float[Tensor, " n"]]:
    h = sg.tanh(h @ w)
    return h, h.sum(axis=1)


@sg.typechecked
def probe(m: Model, x: Float[Tensor, "b t d"], ids: Int[Tensor, "b t"], p: MLP) -> float:
    # N: Revealed shape is "float[v, d]"
    sg.reveal_shape(m.head.w)
    # N: Revealed shape is "float[b, t, v]"
    sg.reveal_shape(m.head(m.norm(x)))
    # N: Revealed shape is "float[h, 2]"
    sg.reveal_shape(p.w1)
    # N: Revealed shape is "float[b, 2, t, d // 2]"
    q = sg.reveal_shape(split_heads(x, 2))
    # N: Revealed shape is "float[b, t, d]"
    sg.reveal_shape(merge_heads(scaled_dot_product_attention(q, q, q, causal=True)))
    # N: Revealed shape is "float[b, t, d]"
    sg.reveal_shape(sg.nn.embed(m.emb, m.emb, ids))
    # N: Revealed shape is "float[3, 5]"
    sg.reveal_shape(sg.random.normal(sg.random.key(0), (3, 5)))
    # N: Revealed shape is "bool[b, t]"
    sg.reveal_shape(sg.random.bernoulli(sg.random.key(1), 0.5, ids.shape))
    # N: Revealed shape is "float[b, 1, t, d]"
    sg.reveal_shape(x.unsqueeze(1))
    # N: Revealed shape is "float[b, t, d]"
    sg.reveal_shape(x.unsqueeze(1).squeeze(1))
    y = x.transpose(0, 2, 1)
    # N: Revealed shape is "(float[b, d, t], float[d], float[d])"
    sg.reveal_shape(sg.batch_norm(y, None, None, m.bn.running_mean, m.bn.running_var, True))
    return float(x.sum().item())


@sg.typechecked
def scanned(x: Float[Tensor, "n 4"], ws: Float[Tensor, "layers 4 4"]) -> float:
    # N: Revealed shape is "(float[n, 4], float[layers, n])"
    h, hs = sg.reveal_shape(sg.scan(layer, x, ws))
    block = sg.checkpoint(layer)
    # N: Revealed shape is "(float[n, 4], float[n])"
    sg.reveal_shape(block(h, ws[0]))
    return float(hs.sum().item())


def run() -> float:
    m = Model.init(seed=0, d=4, v=7)
    ids = sg.tensor(np.arange(6, dtype=np.int32).reshape(2, 3) % 7)
    p = MLP.init(sg.nn.init.normal(0.1), seed=0, h=3)
    value = probe(m, sg.rand((2, 3, 4)), ids, p)
    return value + scanned(sg.rand((2, 4)), sg.randn((3, 4, 4)) * 0.3)
