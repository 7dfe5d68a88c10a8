"""A character-level GPT trained on a Python standard-library source file.

Pre-LayerNorm transformer blocks (``sg.nn.transformer``) run as ONE layer loop
(``sg.scan``: the block is traced and compiled once, whatever the depth) with
rematerialization; token + learned positional embeddings; the output layer shares the
token table. Trained with AdamW through ``ScalarTrainer`` (compiled C, several steps per
native call with ``step_many``); prints the loss curve, the next-character accuracy on
held-out text and a sampled continuation.

Usage:
    python examples/charlm.py [steps] [--blocks 2] [--d-model 128] [--heads 4] ...
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.nn.transformer import BlockStack, block_init, embed, transformer_stack


def load_text() -> str:
    """The source of ``difflib`` (every CPython installation ships it): ~80 KB of text."""
    return Path(difflib.__file__).read_text(encoding="utf-8")


def init_params(vocab: int, args: argparse.Namespace) -> dict[str, Any]:
    d = args.d_model
    rng = np.random.default_rng(args.seed)
    return {
        "tokens": sg.tensor((rng.normal(size=(vocab, d)) * 0.02).astype(np.float32)),
        "positions": sg.tensor((rng.normal(size=(args.context, d)) * 0.01).astype(np.float32)),
        "blocks": BlockStack.init(
            block_init(0.02), seed=args.seed, layers=args.blocks, d=d, f=4 * d
        ),
        "ln_w": sg.ones(d),
        "ln_b": sg.zeros(d),
    }


def logits_of(params: dict[str, Any], ids: sg.Tensor, args: argparse.Namespace) -> sg.Tensor:
    """``[b, t]`` character ids -> ``[b, t, vocab]`` next-character logits."""
    h = embed(params["tokens"], params["positions"], ids)
    h = transformer_stack(params["blocks"], h, args.heads, causal=True, loop=True, remat=args.remat)
    h = sg.layer_norm(h, params["ln_w"], params["ln_b"])
    return h @ params["tokens"].T


def batches(
    data: np.ndarray, count: int, args: argparse.Namespace, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` batches of random windows: inputs and targets ``[count, batch, context]``."""
    starts = rng.integers(0, len(data) - args.context - 1, size=(count, args.batch))
    window = starts[..., None] + np.arange(args.context + 1)
    chunks = data[window]
    return chunks[..., :-1], chunks[..., 1:]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", nargs="?", type=int, default=600)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--chunk", type=int, default=10, help="steps per native call")
    parser.add_argument("--sample", type=int, default=200, help="characters to generate")
    parser.add_argument("--no-remat", dest="remat", action="store_false")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    text = load_text()
    vocab = sorted(set(text))
    index = {ch: i for i, ch in enumerate(vocab)}
    data = np.array([index[ch] for ch in text], dtype=np.int32)
    split = int(0.9 * len(data))
    train, held_out = data[:split], data[split:]
    print(f"text: {len(text)} characters of {Path(difflib.__file__).name}, vocabulary {len(vocab)}")

    def loss(params: dict[str, Any], ids: sg.Tensor, targets: sg.Tensor) -> sg.Tensor:
        logits = logits_of(params, ids, args)
        return sg.cross_entropy(logits.reshape((-1, len(vocab))), targets.reshape((-1,)))

    params = init_params(len(vocab), args)
    trainer = sg.ScalarTrainer(
        loss,
        params,
        mode="compiled",
        backend="c",
        optimizer=sg.optim.AdamW(lr=args.lr, weight_decay=0.01),
    )
    rng = np.random.default_rng(args.seed)
    losses: list[float] = []
    t0 = time.perf_counter()
    done = 0
    while done < args.steps:
        count = min(args.chunk, args.steps - done)
        xs, ys = batches(train, count, args, rng)
        losses.extend(float(v) for v in trainer.step_many(xs, ys))
        done += count
        print(
            f"step {done:5d}  loss {np.mean(losses[-count:]):.3f}  ({time.perf_counter() - t0:.1f} s)"
        )
    trained = trainer.get_params()

    # held-out next-character accuracy, one compiled forward over [batch, context] windows
    forward = sg.compile(lambda p, ids: logits_of(p, ids, args), backend="c")
    xs, ys = batches(held_out, 4, args, np.random.default_rng(args.seed + 1))
    hits = [np.argmax(forward(trained, sg.tensor(x)).numpy(), axis=-1) == y for x, y in zip(xs, ys, strict=True)]
    accuracy = 100.0 * float(np.mean(hits))
    print(f"next-character accuracy: {accuracy:.1f}% (held-out text)")

    # sampling: a window of the last `context` characters, temperature 0.8
    window = list(data[split : split + args.context])
    out: list[str] = []
    sampler = np.random.default_rng(args.seed + 2)
    for _ in range(args.sample):
        ids = np.array([window[-args.context :]], dtype=np.int32)  # one row: [1, context]
        logits = forward(trained, sg.tensor(ids)).numpy()[0, -1].astype(np.float64) / 0.8
        probs = np.exp(logits - logits.max())
        nxt = int(sampler.choice(len(vocab), p=probs / probs.sum()))
        window.append(nxt)
        out.append(vocab[nxt])
    prompt = "".join(vocab[i] for i in data[split : split + args.context])
    print("--- prompt ---\n" + prompt + "\n--- sample ---\n" + "".join(out))
    return {"losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    main(sys.argv[1:])
