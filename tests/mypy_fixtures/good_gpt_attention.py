"""Correct: nanoGPT-style causal self-attention; sizes live in Python ints (``B, T, C = x.shape``)."""

import math

import shapegrad as sg
from shapegrad import Bool, Float, Int, Tensor

N_HEAD = 4
N_CTX = 16


def causal_mask(t: int) -> Bool[Tensor, "t t"]:
    i = sg.arange(t)
    return i[:, None] >= i[None, :]


@sg.typechecked
def self_attention(
    x: Float[Tensor, "b t c"],
    w_qkv: Float[Tensor, "c 3*c"],
    w_proj: Float[Tensor, "c c"],
) -> Float[Tensor, "b t c"]:
    B, T, C = x.shape
    head_dim = C // N_HEAD
    qkv = x @ w_qkv
    q = qkv[:, :, :C].reshape(B, T, N_HEAD, head_dim).transpose(0, 2, 1, 3)
    k = qkv[:, :, C : 2 * C].reshape(B, T, N_HEAD, head_dim).transpose(0, 2, 1, 3)
    v = qkv[:, :, 2 * C :].reshape(B, T, N_HEAD, head_dim).transpose(0, 2, 1, 3)
    att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(head_dim))
    att = sg.where(causal_mask(T), att, -1e9)
    att = sg.softmax(att, axis=-1)
    y = att @ v  # [B, n_head, T, head_dim]
    y = y.transpose(0, 2, 1, 3).reshape(B, T, C)
    return y @ w_proj


@sg.typechecked
def embed(
    tokens: Int[Tensor, "b t"], wte: Float[Tensor, "v c"], wpe: Float[Tensor, "n c"]
) -> Float[Tensor, "b t c"]:
    _, T = tokens.shape
    pos = wpe[:T]  # [T, c]: T <= n is the caller's promise
    return sg.embedding(wte, tokens) + pos


@sg.typechecked
def lm_loss(
    tokens: Int[Tensor, "b t"],
    wte: Float[Tensor, "v c"],
    wpe: Float[Tensor, "n c"],
    w_qkv: Float[Tensor, "c 3*c"],
    w_proj: Float[Tensor, "c c"],
) -> Float[Tensor, ""]:
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    h = embed(inputs, wte, wpe)
    h = h + self_attention(h, w_qkv, w_proj)
    logits = h @ wte.T  # weight tying: [b, t - 1, v]
    B, T, V = logits.shape
    return sg.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))


def run() -> float:
    import numpy as np

    tokens = sg.tensor(np.arange(2 * 9).reshape(2, 9) % 11, dtype="int32")
    loss = lm_loss(
        tokens,
        sg.randn((11, 8), seed=1) * 0.1,
        sg.randn((N_CTX, 8), seed=2) * 0.1,
        sg.randn((8, 24), seed=3) * 0.1,
        sg.randn((8, 8), seed=4) * 0.1,
    )
    return float(loss.item())
