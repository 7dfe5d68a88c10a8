"""A tiny character-level transformer written as typed modules, trained with ScalarTrainer.

Blocks are a list of sub-modules; every parameter's shape is in an annotation, sizes come
from `CharModel.init(v=..., d=..., layers=...)`. Causal single-head attention, pre-norm.
The loss takes a `key`, so the trainer hands it a fresh random key every step (dropout
masks change per step inside one compiled C step; checkpoints resume the same stream).
Run: python examples/char_transformer.py [steps]
"""

import math
import sys

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import LayerNorm, Linear, Module, field


class Block(Module):
    ln1: LayerNorm = field(dims={"c": "d"})
    qkv: Linear = field(dims={"d_in": "d", "d_out": "3*d"})
    ln2: LayerNorm = field(dims={"c": "d"})
    up: Linear = field(dims={"d_in": "d", "d_out": "4*d"})
    down: Linear = field(dims={"d_in": "4*d", "d_out": "d"})

    def __call__(self, x: Float[Tensor, "b t d"]) -> Float[Tensor, "b t d"]:
        d = x.shape[-1]
        qkv = self.qkv(self.ln1(x))
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        scores = sg.einsum("btd,bsd->bts", q, k) / math.sqrt(d)
        causal = sg.tensor(np.tril(np.ones((x.shape[1], x.shape[1]), dtype=bool)))
        attention = sg.softmax(sg.where(causal, scores, -1e9), axis=-1)
        x = x + sg.einsum("bts,bsd->btd", attention, v)
        return x + self.down(sg.relu(self.up(self.ln2(x))))


class CharModel(Module):
    embed: Float[Tensor, "v d"] = field(init=sg.nn.init.normal(std=0.3))
    position: Float[Tensor, "t d"] = field(init=sg.nn.init.normal(std=0.3))
    blocks: list[Block] = field(length="layers")
    ln_f: LayerNorm = field(dims={"c": "d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "v"})


def logits(model: CharModel, ids: Int[Tensor, "b t"], key: Tensor | None = None) -> Float[Tensor, "b t v"]:
    x = sg.embedding(model.embed, ids) + model.position
    for block in model.blocks:
        x = block(x)
    if key is not None:  # training: dropout before the head
        x = sg.dropout(x, 0.1, key)
    return model.head(model.ln_f(x))


def loss(
    model: CharModel, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b t"], *, key: Tensor
) -> Float[Tensor, ""]:
    scores = logits(model, ids, key)
    return sg.cross_entropy(scores.reshape((-1, scores.shape[-1])), targets.reshape((-1,)))


text = "the quick brown fox jumps over the lazy dog. " * 8
chars = sorted(set(text))
encoded = np.array([chars.index(c) for c in text], dtype=np.int32)
context = 12
starts = np.arange(len(encoded) - context - 1)
windows = np.stack([encoded[s : s + context + 1] for s in starts])

model = CharModel.init(seed=0, v=len(chars), d=16, t=context, layers=2)
print(model.summary())
trainer = sg.ScalarTrainer(loss, model, optimizer=sg.optim.Adam(lr=3e-3))  # compiled C by default
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
rng = np.random.default_rng(0)
for step in range(steps):
    batch = windows[rng.integers(0, len(windows), size=16)]
    value = trainer.step(batch[:, :-1], batch[:, 1:])
    if step % 100 == 0 or step == steps - 1:
        print(f"step {step:4d}  loss {value:.4f}")

trained = trainer.get_params()
predicted = logits(trained, sg.tensor(windows[:, :-1])).numpy().argmax(axis=-1)
print(f"next-character accuracy: {(predicted == windows[:, 1:]).mean():.1%}")
