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


def bucket_sizes(context: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from ``smallest`` up to the context (which is always the last bucket)."""
    sizes = []
    size = smallest
    while size < context:
        sizes.append(size)
        size *= 2
    return (*sizes, context)


def sampler(args: argparse.Namespace, backend: str = "c") -> Any:
    """The compiled next-character logits of a ``[1, t]`` prefix, for any ``t <= context``.

    The prefix grows by one character per sampled token; compiled for each exact length it
    would trace and compile 200 times in a 200-token generation. Buckets pad ``t`` with zeros
    at the end up to 16, 32, 64, ...: the model is causal (position ``i`` attends to
    positions ``<= i``, and every other layer is per position), so the logits at the real
    positions are exact, and ``out_axis=1`` slices them back to ``t``. It compiles at most
    once per bucket.
    """

    def next_logits(params: dict[str, Any], ids: sg.Tensor) -> sg.Tensor:
        return logits_of(params, ids, args)

    return sg.compile(
        next_logits, backend=backend, buckets={("ids", 1): bucket_sizes(args.context)}, out_axis=1
    )


def generate(
    step: Any,
    params: dict[str, Any],
    prompt: np.ndarray,
    count: int,
    context: int,
    rng: np.random.Generator,
    temperature: float = 0.8,
) -> list[int]:
    """``count`` character ids sampled with ``step`` (:func:`sampler`) after ``prompt``.

    The window is the prompt plus what was sampled so far, at most its last ``context`` ids.
    """
    window = [int(i) for i in prompt]
    out: list[int] = []
    for _ in range(count):
        ids = np.array([window[-context:]], dtype=np.int32)  # one row: [1, t <= context]
        logits = step(params, ids).numpy()[0, -1].astype(np.float64) / temperature
        probs = np.exp(logits - logits.max())
        nxt = int(rng.choice(len(probs), p=probs / probs.sum()))
        window.append(nxt)
        out.append(nxt)
    return out


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
    parser.add_argument("--prompt", type=int, default=16, help="prompt characters")
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

    # sampling: a growing window (at most the last `context` characters), temperature 0.8
    prompt_ids = data[split : split + args.prompt]
    step = sampler(args)
    t0 = time.perf_counter()
    rng = np.random.default_rng(args.seed + 2)
    sampled = generate(step, trained, prompt_ids, args.sample, args.context, rng)
    print(
        f"sampled {args.sample} characters in {time.perf_counter() - t0:.2f} s, "
        f"{step.trace_count} compiles (buckets {step.buckets})"
    )
    out = [vocab[i] for i in sampled]
    prompt = "".join(vocab[i] for i in prompt_ids)
    print("--- prompt ---\n" + prompt + "\n--- sample ---\n" + "".join(out))
    return {"losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    main(sys.argv[1:])
