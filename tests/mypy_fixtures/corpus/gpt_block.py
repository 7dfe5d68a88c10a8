"""A pre-norm GPT block with a config dataclass: sizes come from the config and ``x.shape``."""

import math
from dataclasses import dataclass

import shapegrad as sg
from shapegrad import Bool, Float, Tensor


@dataclass
class GPTConfig:
    n_embd: int = 16
    n_head: int = 4
    block_size: int = 8


def causal_mask(t: int) -> Bool[Tensor, "t t"]:
    i = sg.arange(t)
    return i[:, None] >= i[None, :]


def attention(cfg: GPTConfig, x: Float[Tensor, "b t c"], w_attn: Tensor, w_proj: Tensor) -> Tensor:
    B, T, C = x.shape
    hs = C // cfg.n_head
    q, k, v = [(x @ w_attn[:, i * C : (i + 1) * C]) for i in range(3)]
    q = q.reshape(B, T, cfg.n_head, hs).transpose(0, 2, 1, 3)
    k = k.reshape(B, T, cfg.n_head, hs).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, cfg.n_head, hs).transpose(0, 2, 1, 3)
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs)
    att = sg.where(causal_mask(T), att, -1e9)
    y = sg.softmax(att, axis=-1) @ v
    return y.transpose(0, 2, 1, 3).reshape(B, T, C) @ w_proj


@sg.typechecked
def block(
    cfg: GPTConfig,
    x: Float[Tensor, "b t c"],
    ln1: Float[Tensor, " c"],
    w_attn: Float[Tensor, "c 3*c"],
    w_proj: Float[Tensor, "c c"],
    ln2: Float[Tensor, " c"],
    w_fc: Float[Tensor, "c 4*c"],
    w_out: Float[Tensor, "4*c c"],
) -> Float[Tensor, "b t c"]:
    x = x + attention(cfg, sg.layer_norm(x, ln1), w_attn, w_proj)
    h = sg.gelu(sg.layer_norm(x, ln2) @ w_fc)
    return x + h @ w_out


def run() -> float:
    cfg = GPTConfig()
    c = cfg.n_embd
    x = sg.randn((2, cfg.block_size, c), seed=0)
    y = block(
        cfg, x, sg.ones((c,)), sg.randn((c, 3 * c), seed=1) * 0.1, sg.randn((c, c), seed=2) * 0.1,
        sg.ones((c,)), sg.randn((c, 4 * c), seed=3) * 0.1, sg.randn((4 * c, c), seed=4) * 0.1,
    )  # fmt: skip
    return float(y.mean().item())
