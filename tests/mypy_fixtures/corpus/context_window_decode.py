"""Autoregressive sampling with a cropped context window (nanoGPT's ``idx[:, -block:]``):
negative symbolic slice bounds, a config-sized block, a growing token tensor in a loop."""

from dataclasses import dataclass

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@dataclass
class SamplerConfig:
    block: int = 4
    vocab: int = 7


@sg.typechecked
def logits_fn(ids: Int[Tensor, "b t"], table: Float[Tensor, "v v"]) -> Float[Tensor, "b t v"]:
    return sg.embedding(table, ids)


@sg.typechecked
def recent(x: Float[Tensor, "b t d"], n: int) -> Float[Tensor, "b n d"]:
    """The last ``n`` steps (``n >= 1``; Python's ``x[-0:]`` would be all of ``x``)."""
    return x[:, -n:]


@sg.typechecked
def without_tail(x: Float[Tensor, "b t d"], n: int) -> Float[Tensor, "b m d"]:
    return x[:, : -n - 1]


@sg.typechecked
def generate(ids: Int[Tensor, "b t"], table: Float[Tensor, "v v"], cfg: SamplerConfig, steps: int) -> Int[Tensor, "b s"]:
    for _ in range(steps):
        context = ids[:, -cfg.block :]
        last = logits_fn(context, table)[:, -1, :]  # [b, v]
        nxt = last.argmax(axis=-1)[:, None]  # [b, 1]
        ids = sg.concat([ids, nxt.astype("int32")], axis=1)
    return ids


def run() -> float:
    cfg = SamplerConfig()
    table = sg.randn((cfg.vocab, cfg.vocab), seed=0)
    ids = sg.tensor([[1, 2], [3, 4]], dtype="int32")
    out = generate(ids, table, cfg, 6)
    assert out.shape == (2, 8)
    x = sg.randn((2, 5, 3), seed=1)
    assert recent(x, 2).shape == (2, 2, 3)
    assert without_tail(x, 1).shape == (2, 3, 3)
    return float(out.sum().item() + recent(x, 2).sum().item())
