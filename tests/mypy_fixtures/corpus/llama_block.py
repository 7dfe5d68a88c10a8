"""A LLaMA-style block as Modules: RMSNorm, rotary embeddings, SwiGLU MLP."""

import math

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Linear, Module, field


class RMSNorm(Module):
    gain: Float[Tensor, " d"] = field(role="gain")

    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        scale = 1.0 / sg.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
        return x * scale * self.gain


def rotate(
    x: Float[Tensor, "b t h e"], cos: Float[Tensor, "t e"], sin: Float[Tensor, "t e"]
) -> Tensor:
    half = x.shape[-1] // 2
    swapped = sg.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + swapped * sin[:, None, :]


class Block(Module):
    norm1: RMSNorm = field(dims={"d": "d"})
    wq: Linear = field(dims={"d_in": "d", "d_out": "d"})
    wk: Linear = field(dims={"d_in": "d", "d_out": "d"})
    wv: Linear = field(dims={"d_in": "d", "d_out": "d"})
    wo: Linear = field(dims={"d_in": "d", "d_out": "d"})
    norm2: RMSNorm = field(dims={"d": "d"})
    gate: Linear = field(dims={"d_in": "d", "d_out": "f"})
    up: Linear = field(dims={"d_in": "d", "d_out": "f"})
    down: Linear = field(dims={"d_in": "f", "d_out": "d"})

    def __call__(
        self, x: Float[Tensor, "b t d"], cos: Float[Tensor, "t e"], sin: Float[Tensor, "t e"]
    ) -> Float[Tensor, "b t d"]:
        B, T, D = x.shape
        E = cos.shape[1]
        H = D // E
        h = self.norm1(x)
        q = rotate(self.wq(h).reshape(B, T, H, E), cos, sin).transpose(0, 2, 1, 3)
        k = rotate(self.wk(h).reshape(B, T, H, E), cos, sin).transpose(0, 2, 1, 3)
        v = self.wv(h).reshape(B, T, H, E).transpose(0, 2, 1, 3)
        att = sg.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(E), axis=-1)
        x = x + self.wo((att @ v).transpose(0, 2, 1, 3).reshape(B, T, D))
        h = self.norm2(x)
        return x + self.down(sg.sigmoid(self.gate(h)) * self.gate(h) * self.up(h))


def rope_tables(t: int, e: int) -> tuple[Float[Tensor, "t e"], Float[Tensor, "t e"]]:
    angles = np.arange(t)[:, None] * (1e-2 ** (np.arange(e) / e))[None, :]
    return sg.tensor(np.cos(angles).astype(np.float32)), sg.tensor(
        np.sin(angles).astype(np.float32)
    )


def run() -> float:
    block = Block.init(seed=0, d=8, f=12)
    cos, sin = rope_tables(5, 4)
    y = block(sg.rand((2, 5, 8)), cos, sin)
    return float(y.sum().item())
