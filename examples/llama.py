"""A LLaMA-style decoder trained on a Python standard-library source file, then sampled.

RMSNorm (pre-norm), rotary position embeddings on queries and keys, causal multi-head
attention, a SwiGLU MLP; the blocks' weights are stacked along a leading `layers` dim
and run as ONE `sg.scan` layer loop (traced and compiled once, whatever the depth) whose
backward recomputes each block from its input (`policy="recompute"`: remat). Trained
with AdamW through ScalarTrainer's `fit` (compiled C, or `--eager`; a progress bar), then
sampled with temperature and top-k. tests/torch_models.py holds the same model in PyTorch.
Run: python examples/llama.py [steps] [--eager]
"""

import argparse
import difflib
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor
from shapegrad.nn import Embedding, Module, RMSNorm, field, rms_norm

normal = sg.nn.init.normal(std=0.02)


class Blocks(Module):  # every field has a leading `layers` dim: one scan step per block
    attn_norm: Float[Tensor, "layers d"] = field(role="gain")
    wqkv: Float[Tensor, "layers 3*d d"] = field(init=normal)
    wo: Float[Tensor, "layers d d"] = field(init=normal)
    mlp_norm: Float[Tensor, "layers d"] = field(role="gain")
    w_gate: Float[Tensor, "layers f d"] = field(init=normal)
    w_up: Float[Tensor, "layers f d"] = field(init=normal)
    w_down: Float[Tensor, "layers d f"] = field(init=normal)


def rotate(x: Float[Tensor, "b h t e"]) -> Float[Tensor, "b h t e"]:
    """Rotary position embedding: rotate pairs (i, i + e/2) by position * 10000^(-2i/e)."""
    t, e = x.shape[-2:]
    angles = np.outer(np.arange(t), 10000.0 ** (-np.arange(0, e, 2) / e)).astype(x.dtype.numpy)
    cos, sin = sg.tensor(np.cos(angles)), sg.tensor(np.sin(angles))
    x1, x2 = x[..., : e // 2], x[..., e // 2 :]
    return sg.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Llama(Module):
    embed: Embedding = field(dims={"v": "v", "d": "d"})
    blocks: Blocks
    norm: RMSNorm = field(dims={"c": "d"})
    head: Float[Tensor, "v d"] = field(init=normal)
    heads: int = 4

    def block(self, x: Float[Tensor, "b t d"], w: Blocks) -> Float[Tensor, "b t d"]:
        b, t, d = x.shape
        qkv = (
            (rms_norm(x, w.attn_norm) @ w.wqkv.T)
            .view(b, t, 3, self.heads, -1)
            .permute(2, 0, 3, 1, 4)
        )
        q, k = rotate(qkv[0]), rotate(qkv[1])
        att = sg.nn.scaled_dot_product_attention(q, k, qkv[2], causal=True)  # [b, h, t, e]
        x = x + att.swapaxes(1, 2).flatten(2) @ w.wo.T
        h = rms_norm(x, w.mlp_norm)
        return x + (sg.silu(h @ w.w_gate.T) * (h @ w.w_up.T)) @ w.w_down.T

    def __call__(self, ids: Int[Tensor, "b t"]) -> Float[Tensor, "b t v"]:
        step = lambda x, w: (self.block(x, w), None)  # noqa: E731
        x, _ = sg.scan(step, self.embed(ids), self.blocks, policy="recompute")
        return self.norm(x) @ self.head.T


def loss(model: Llama, ids: Int[Tensor, "b t"], targets: Int[Tensor, "b t"]) -> Float[Tensor, ""]:
    logits = model(ids)
    return sg.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def train(
    model: Llama, batches: list, eager: bool = False, progress: bool = True
) -> tuple[Llama, list[float]]:
    optimizer = sg.optim.AdamW(lr=3e-3, weight_decay=0.01)
    trainer = sg.ScalarTrainer(
        loss, model, mode="eager" if eager else "compiled", optimizer=optimizer
    )
    losses = trainer.fit(batches, progress=progress).loss
    return trainer.get_params(), losses


def windows(
    data: np.ndarray, count: int, batch: int, context: int, rng: np.random.Generator
) -> list:
    starts = rng.integers(0, len(data) - context - 1, size=(count, batch))
    chunks = data[starts[..., None] + np.arange(context + 1)]
    return [(c[:, :-1], c[:, 1:]) for c in chunks]


def sample(
    model: Llama,
    forward: Callable[[Llama, Tensor], Tensor],
    prompt: list[int],
    n: int,
    context: int,
    rng: np.random.Generator,
    temperature: float = 0.8,
    top_k: int = 10,
) -> list[int]:
    out = list(prompt)
    for _ in range(n):
        logits = forward(model, sg.tensor(np.array([out[-context:]], dtype=np.int32)))[0, -1]
        values, indices = sg.topk(logits / temperature, top_k)
        probs = sg.softmax(values).numpy().astype(np.float64)
        out.append(int(indices.numpy()[rng.choice(top_k, p=probs / probs.sum())]))
    return out[len(prompt) :]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=300)
    parser.add_argument("--eager", action="store_true", help="train eagerly instead of compiled C")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--context", type=int, default=32)
    args = parser.parse_args(sys.argv[1:])

    text = Path(difflib.__file__).read_text(encoding="utf-8")  # ~80 KB that every Python ships
    vocab = sorted(set(text))
    data = np.array([vocab.index(c) for c in text], dtype=np.int32)
    text_train, held_out = data[: len(data) * 9 // 10], data[len(data) * 9 // 10 :]
    model = Llama.init(seed=0, v=len(vocab), d=args.d, f=4 * args.d, layers=args.layers)
    print(model.summary())
    batches = windows(text_train, args.steps, 32, args.context, np.random.default_rng(0))
    trained, losses = train(model, batches, eager=args.eager)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} ({'eager' if args.eager else 'compiled C'})")

    forward = sg.compile(lambda m, i: m(i), backend="c")
    ids, targets = windows(held_out, 1, 64, args.context, np.random.default_rng(1))[0]
    eager, compiled = trained(sg.tensor(ids)).numpy(), forward(trained, sg.tensor(ids)).numpy()
    print(f"eager vs compiled C: max |difference| {np.abs(eager - compiled).max():.2e}")
    assert np.allclose(eager, compiled, rtol=1e-3, atol=1e-3), "eager and compiled C disagree"
    print(f"next-character accuracy: {(compiled.argmax(-1) == targets).mean():.1%} (held-out text)")
    prompt = list(held_out[: args.context])
    out = sample(trained, forward, prompt, 200, args.context, np.random.default_rng(2))
    print(
        "--- prompt ---\n"
        + "".join(vocab[i] for i in prompt)
        + "\n--- sample ---\n"
        + "".join(vocab[i] for i in out)
    )
