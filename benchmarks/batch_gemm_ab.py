"""Interleaved A/B of the GPT step with attention's batched products as one
``sg_sgemm_batch`` call (``$SHAPEGRAD_BATCH_GEMM=auto``) or one library call per product
(``blas``, what the C backend ran before), in one process.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src:benchmarks
python benchmarks/batch_gemm_ab.py [--threads 1] [--rounds 15] [--loop]``

The charlm step of ``depth.py`` (``charlm_model.py``) (d 128, 2 blocks, 4 heads, context 64, batch 32, AdamW,
unrolled; ``--loop``: one layer loop) is compiled once per mode (the mode is read when
the program is rendered and is part of the cache keys, so each mode is its own library),
both trainers start from the same parameters, and rounds of K = 10 steps alternate
between them (A B, then B A, ...), so a burst of load from other processes hits both.
Printed per mode: the fastest and the median round, in wall time and in the process's CPU
time per step (at one thread CPU time is what a busy machine disturbs least), the ratio
auto / blas of each, and the 1-minute load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.backends.c import batch_gemm
from shapegrad.nn.transformer import BlockStack, block_init

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charlm_model import charlm_loss  # after the path entry

MODES = ("blas", "auto")


def trainer(mode: str, loop: bool, seed_data: dict[str, Any]) -> Any:
    """The charlm trainer compiled under ``$SHAPEGRAD_BATCH_GEMM=mode``, first call done."""
    os.environ[batch_gemm.ENV] = mode
    d = seed_data["d"]
    params = {
        "tokens": sg.tensor(seed_data["tok"]),
        "positions": sg.tensor(seed_data["pos"]),
        "blocks": seed_data["stack"],
        "ln_w": sg.ones(d),
        "ln_b": sg.zeros(d),
    }
    tr = sg.ScalarTrainer(
        charlm_loss(2, 4, 94, loop), params, mode="compiled", backend="c",
        optimizer=sg.optim.AdamW(lr=1e-3),
    )  # fmt: skip
    t0 = time.perf_counter()
    losses = tr.step_many(seed_data["xs"], seed_data["ys"])
    print(f"{mode}: first call {time.perf_counter() - t0:.2f} s, losses {losses[0]:.5f}")
    return tr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--loop", action="store_true", help="the blocks as one layer loop")
    args = parser.parse_args()
    os.environ["SHAPEGRAD_NUM_THREADS"] = str(args.threads)
    vocab, d, t, bsz, k = 94, 128, 64, 32, 10
    rng = np.random.default_rng(2)
    data = {
        "d": d,
        "xs": rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32),
        "ys": rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32),
        "tok": (rng.normal(size=(vocab, d)) * 0.02).astype(np.float32),
        "pos": (rng.normal(size=(t, d)) * 0.01).astype(np.float32),
        "stack": BlockStack.init(block_init(0.02), seed=0, layers=2, d=d, f=4 * d),
    }
    print(f"load average {os.getloadavg()[0]:.2f}; {args.threads} thread(s)")
    trainers = {mode: trainer(mode, args.loop, data) for mode in MODES}
    wall: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds + 1):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            w0, c0 = time.perf_counter(), time.process_time()
            trainers[mode].step_many(data["xs"], data["ys"])
            if r:  # round 0 warms both up
                wall[mode].append((time.perf_counter() - w0) / k)
                cpu[mode].append((time.process_time() - c0) / k)
    print(f"\nms per step over {args.rounds} rounds of {k} steps (fastest / median):")
    for mode in MODES:
        print(
            f"  {mode:5} wall {min(wall[mode]) * 1e3:7.2f} / {statistics.median(wall[mode]) * 1e3:7.2f}"
            f"   cpu {min(cpu[mode]) * 1e3:7.2f} / {statistics.median(cpu[mode]) * 1e3:7.2f}"
        )
    for name, series in (("wall", wall), ("cpu", cpu)):
        fast = min(series["auto"]) / min(series["blas"])
        med = statistics.median(series["auto"]) / statistics.median(series["blas"])
        print(f"  auto / blas {name}: fastest {fast:.3f}, median {med:.3f}")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
