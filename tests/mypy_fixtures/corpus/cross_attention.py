"""Decoder cross-attention: queries from the target, keys/values from the encoder memory."""

import math

import shapegrad as sg
from shapegrad import Float, Tensor


def split_heads(x: Tensor, n_head: int) -> Tensor:
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


def merge_heads(x: Tensor) -> Tensor:
    B, H, T, K = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * K)


@sg.typechecked
def cross_attention(
    tgt: Float[Tensor, "b t d"],
    memory: Float[Tensor, "b s d"],
    wq: Float[Tensor, "d d"],
    wkv: Float[Tensor, "d 2*d"],
    n_head: int,
) -> Float[Tensor, "b t d"]:
    D = tgt.shape[-1]
    q = split_heads(tgt @ wq, n_head)
    kv = memory @ wkv
    k, v = split_heads(kv[:, :, :D], n_head), split_heads(kv[:, :, D:], n_head)
    att = sg.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(D // n_head), axis=-1)
    return merge_heads(att @ v)


@sg.typechecked
def decoder_step(
    tgt: Float[Tensor, "b t d"], memory: Float[Tensor, "b s d"], wq: Float[Tensor, "d d"],
    wkv: Float[Tensor, "d 2*d"],
) -> Float[Tensor, "b t d"]:  # fmt: skip
    return tgt + cross_attention(tgt, memory, wq, wkv, n_head=2)


def run() -> float:
    out = decoder_step(
        sg.randn((2, 3, 8)), sg.randn((2, 5, 8)), sg.randn((8, 8)), sg.randn((8, 16))
    )
    return float(out.mean().item())
