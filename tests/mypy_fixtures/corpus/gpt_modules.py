"""A GPT made of sg.nn Modules: Linear and LayerNorm fields renamed with field(dims=...)."""

import math

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import LayerNorm, Linear, Module, field

N_HEAD = 2


class Attention(Module):
    qkv: Linear = field(dims={"d_in": "d", "d_out": "3*d"})
    proj: Linear = field(dims={"d_in": "d", "d_out": "d"})

    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        B, T, D = x.shape
        hd = D // N_HEAD
        qkv = self.qkv(x)
        q = qkv[:, :, :D].reshape(B, T, N_HEAD, hd).transpose(0, 2, 1, 3)
        k = qkv[:, :, D : 2 * D].reshape(B, T, N_HEAD, hd).transpose(0, 2, 1, 3)
        v = qkv[:, :, 2 * D :].reshape(B, T, N_HEAD, hd).transpose(0, 2, 1, 3)
        att = sg.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd), axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
        return self.proj(y)


class Block(Module):
    ln1: LayerNorm = field(dims={"c": "d"})
    attn: Attention = field(dims={"d": "d"})
    ln2: LayerNorm = field(dims={"c": "d"})
    up: Linear = field(dims={"d_in": "d", "d_out": "4*d"})
    down: Linear = field(dims={"d_in": "4*d", "d_out": "d"})

    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        x = x + self.attn(self.ln1(x))
        return x + self.down(sg.gelu(self.up(self.ln2(x))))


class GPT(Module):
    wte: Float[Tensor, "v d"]
    wpe: Float[Tensor, "t d"]
    block: Block = field(dims={"d": "d"})
    ln_f: LayerNorm = field(dims={"c": "d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "v"})


@sg.typechecked
def loss(m: GPT, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b t"]) -> Float[Tensor, ""]:
    x = sg.embedding(m.wte, ids) + m.wpe
    x = m.block(x)
    logits = m.head(m.ln_f(x))
    B, T, V = logits.shape
    return sg.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))


def run() -> float:
    m = GPT.init(seed=0, v=11, d=8, t=6)
    ids = sg.tensor(np.arange(12, dtype=np.int32).reshape(2, 6) % 11)
    return float(loss(m, ids, ids).item())
