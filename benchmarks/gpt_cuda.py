"""The charlm GPT training step on a GPU: shapegrad CUDA (float32 and bfloat16 mixed
precision, unrolled blocks and the layer loop) vs PyTorch CUDA eager (float32 and bf16
autocast), one interleaved run.

Run (on a machine with an NVIDIA GPU, pycuda and torch):
    python benchmarks/gpt_cuda.py [--blocks 2] [--batch 32]

Model: examples/charlm.py's (d_model 128, 4 heads, context 64, pre-LN blocks, tanh GELU,
tied embedding), AdamW. shapegrad runs ``ScalarTrainer(mode="compiled", backend="cuda")``:
``step`` (one CUDA-graph replay, batch in, loss out, one sync) and ``step_many`` (K steps per
replay). PyTorch: ``nn.TransformerEncoderLayer`` blocks of the same shapes, fused AdamW off
(the default foreach implementation), ``loss.item()`` each step as ours returns the loss.

Targets (issue 21): shapegrad >= 2x faster than PyTorch CUDA eager in float32 and bf16;
bf16 >= 1.5x faster than float32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.nn.transformer import (
    BlockStack,
    block_init,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charlm_model import charlm_loss

VOCAB, D, HEADS, T = 94, 128, 4, 64


def shapegrad_trainer(
    stack: Any, tok: Any, pos: Any, loop: bool, dtype: str | None, backend: str
) -> Any:
    blocks = stack[0].shape[0]

    loss = charlm_loss(blocks, HEADS, VOCAB, loop)

    params = {
        "tokens": sg.tensor(tok),
        "positions": sg.tensor(pos),
        "blocks": stack,
        "ln_w": sg.ones(D),
        "ln_b": sg.zeros(D),
    }
    return sg.ScalarTrainer(
        loss,
        params,
        mode="compiled",
        backend=backend,
        dtype=dtype,
        optimizer=sg.optim.AdamW(lr=1e-3),
    )


def torch_step(tok: Any, pos: Any, blocks: int, xs: Any, ys: Any, bf16: bool) -> Callable[[], Any]:
    import torch

    dev = "cuda"
    layers = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(
            D,
            HEADS,
            4 * D,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation=lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        )
        for _ in range(blocks)
    ).to(dev)
    emb = torch.nn.Parameter(torch.tensor(tok, device=dev))
    positions = torch.nn.Parameter(torch.tensor(pos, device=dev))
    final = torch.nn.LayerNorm(D).to(dev)
    params = [emb, positions, *layers.parameters(), *final.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device=dev)
    x = torch.tensor(xs[0], dtype=torch.long, device=dev)
    y = torch.tensor(ys[0], dtype=torch.long, device=dev)

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            h = emb[x] + positions[:T]
            for layer in layers:
                h = layer(h, src_mask=mask, is_causal=True)
            logits = final(h) @ emb.T
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB).float(), y.reshape(-1)
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="cuda", help="c: check the script without a GPU")
    args = parser.parse_args()
    rng = np.random.default_rng(2)
    k = 10
    xs = rng.integers(0, VOCAB, size=(k, args.batch, T)).astype(np.int32)
    ys = rng.integers(0, VOCAB, size=(k, args.batch, T)).astype(np.int32)
    tok = (rng.normal(size=(VOCAB, D)) * 0.02).astype(np.float32)
    pos = (rng.normal(size=(T, D)) * 0.01).astype(np.float32)
    stack = BlockStack.init(block_init(0.02), seed=0, layers=args.blocks, d=D, f=4 * D)

    runners: dict[str, Callable[[], Any]] = {}
    launches: dict[str, int] = {}
    for dtype in (None, "bfloat16"):
        for loop in (False, True):
            name = f"sg {'bf16' if dtype else 'fp32'} {'loop' if loop else 'unrolled'}"
            try:
                trainer = shapegrad_trainer(stack, tok, pos, loop, dtype, args.backend)
                t0 = time.perf_counter()
                trainer.step(xs[0], ys[0])
                first = time.perf_counter() - t0
            except Exception as exc:  # a variant the backend cannot run yet: say so, go on
                print(f"{name}: not run ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
                continue
            print(f"{name}: first step (compile + run) {first:.2f} s")
            bound = getattr(trainer.strategy, "live", None)  # CUDA: the bound executable
            if bound is not None and hasattr(
                getattr(bound.bound, "exe", None), "launches_per_step"
            ):
                launches[name] = int(bound.bound.exe.launches_per_step)
            runners[name + " step"] = lambda tr=trainer: tr.step(xs[0], ys[0])
            runners[name + " K-step"] = lambda tr=trainer: tr.step_many(xs, ys)
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no CUDA device for PyTorch")
        runners["torch fp32 eager"] = torch_step(tok, pos, args.blocks, xs, ys, bf16=False)
        runners["torch bf16 autocast"] = torch_step(tok, pos, args.blocks, xs, ys, bf16=True)
    except ImportError as exc:
        print(f"PyTorch columns missing: {exc}")
    for run in runners.values():
        run()  # warm-up (PyTorch's kernels, our first replays)
    results: dict[str, list[float]] = {}
    for _ in range(args.rounds):  # interleaved: every variant sees the same GPU state
        for name, run in runners.items():
            steps = k if name.endswith("K-step") else 1
            calls = 20 if steps == 1 else 2
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            results.setdefault(name, []).append((time.perf_counter() - t0) / (calls * steps))
    torch_fp32 = statistics.median(results.get("torch fp32 eager", [float("nan")]))
    print(
        f"\ncharlm step on the GPU (d {D}, {args.blocks} blocks, {HEADS} heads, context {T}, "
        f"batch {args.batch}, AdamW); medians of {args.rounds} interleaved rounds"
    )
    for name, values in results.items():
        med = statistics.median(values)
        base = name.split(" step")[0].split(" K-step")[0]
        extra = f"  launches/step {launches[base]}" if base in launches else ""
        print(
            f"{name:>28}: {med * 1e3:8.3f} ms/step  torch fp32 / this {torch_fp32 / med:6.2f}x{extra}"
        )


if __name__ == "__main__":
    main()
