"""In-process A/B of two versions of the own product (``backends/c/sgemm.h``) in whole steps.

``compare_revisions.py`` runs each cell in a fresh process, where a step's time moves by
a few percent between processes (where the weights' pages land, the VM's placement).
A change to ``sgemm.h`` alone is measured better in one process: this script builds
every step twice, once with the working tree's ``sgemm.h`` and once with another version
of it (``--base``, a git revision or a file), runs the two interleaved in random order
per round and prints each one's median and the median of the per-round ratios with its
quartiles. Only the header differs: the product rule (``gemm_kernel.py``) and the rest
of the program are the working tree's in both.

Rows: ``mlp`` (784-512-512-10) and ``w1024`` (784-1024-1024-10), batch 128, SGD (the
update folded into the weight gradient) or ``mlp_adam``/``w1024_adam`` (``sg.optim.Adam``:
the gradients written), ``cnn`` (two 3x3 convolutions, batch 64, SGD), ``gpt`` (the
charlm step of ``depth.py``, unrolled, AdamW, two steps per call). ``--profile`` adds the
per-kernel timers (``profile=True``) and prints each kernel's time per call.

Run: ``python benchmarks/sgemm_ab.py --base HEAD~1 [--rows mlp,w1024] [--rounds 15]``
(``SHAPEGRAD_NUM_THREADS`` / ``SHAPEGRAD_ADAPTIVE_THREADS`` as usual).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import gemm_in_step  # benchmarks/: the Adam step
import numpy as np
import train_step  # benchmarks/: the workloads

import shapegrad as sg
from shapegrad.backends.c import gemm_kernel

HEADER = "src/shapegrad/backends/c/sgemm.h"
# row -> (gemm_in_step.py's workload, calls per round)
SGD_ROWS = {"mlp": ("mlp", 40), "w1024": ("w1024", 15), "cnn": ("cnn", 5)}
ADAM_ROWS = {"mlp_adam": ("mlp", 40), "w1024_adam": ("w1024", 15)}


def base_source(base: str) -> str:
    """The other ``sgemm.h``: a file's text, else the header at git revision ``base``."""
    if os.path.isfile(base):
        with open(base, encoding="utf-8") as f:
            return f.read()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run(
        ["git", "show", f"{base}:{HEADER}"], cwd=root, check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip


def with_header(source: str, build: Callable[[], Any]) -> Any:
    """``build()`` with ``gemm_kernel.SOURCE`` (read when a program is rendered) swapped."""
    own = gemm_kernel.SOURCE
    gemm_kernel.SOURCE = source  # type: ignore[misc]
    try:
        return build()
    finally:
        gemm_kernel.SOURCE = own  # type: ignore[misc]


def mlp_step(row: str, tag: str, profile: bool) -> tuple[Callable[[], Any], Any, int]:
    """(one call, its executable, calls per round) of an SGD or Adam row."""
    adam = row in ADAM_ROWS
    workload, calls = (ADAM_ROWS if adam else SGD_ROWS)[row]
    step, exe = gemm_in_step.compiled_step(
        workload, "adam" if adam else "sgd", f"{row}_{tag}", profile
    )
    return step, exe, calls


def gpt_step() -> Callable[[], Any]:
    """Two charlm steps (``depth.py``'s model, unrolled, AdamW) per call."""
    from charlm_model import charlm_loss, charlm_params

    vocab, d, blocks, heads, t, bsz = 94, 128, 2, 4, 64, 32
    rng = np.random.default_rng(2)
    xs = rng.integers(0, vocab, size=(2, bsz, t)).astype(np.int32)
    ys = rng.integers(0, vocab, size=(2, bsz, t)).astype(np.int32)
    params = charlm_params(rng, vocab, d, t, blocks)
    trainer = sg.ScalarTrainer(
        charlm_loss(blocks, heads, vocab, False), params, mode="compiled", backend="c",
        optimizer=sg.optim.AdamW(lr=1e-3),
    )  # fmt: skip
    trainer.step_many(xs, ys)  # compiles
    return lambda: trainer.step_many(xs, ys)


def measure(row: str, sources: dict[str, str], rounds: int, profile: bool) -> None:
    steps: dict[str, Callable[[], Any]] = {}
    exes: dict[str, Any] = {}
    calls = 1
    for tag, source in sources.items():
        if row == "gpt":
            steps[tag] = with_header(source, gpt_step)
        else:
            steps[tag], exes[tag], calls = with_header(
                source, lambda tag=tag: mlp_step(row, tag, profile)
            )
    for step in steps.values():
        for _ in range(10 if row == "gpt" else 200):
            step()
    before = {tag: {k: t for k, _, t in exe.profile()} for tag, exe in exes.items() if profile}
    seconds: dict[str, list[float]] = {tag: [] for tag in steps}
    for _ in range(rounds):
        order = list(steps)
        random.shuffle(order)
        for tag in order:
            t0 = time.perf_counter()
            for _ in range(calls):
                steps[tag]()
            seconds[tag].append((time.perf_counter() - t0) / calls)
    ratios = sorted(n / b for n, b in zip(seconds["new"], seconds["base"], strict=True))
    q = len(ratios) // 4
    med = {tag: statistics.median(v) * 1e3 for tag, v in seconds.items()}
    print(
        f"{row:11s} base {med['base']:8.3f} ms  new {med['new']:8.3f} ms  new/base "
        f"{statistics.median(ratios):.3f} [{ratios[q]:.3f}-{ratios[-q - 1]:.3f}]", flush=True,
    )  # fmt: skip
    if profile and exes:
        n = rounds * calls
        spent = {
            tag: {k: (t - before[tag][k]) / n * 1e6 for k, _, t in exe.profile()}
            for tag, exe in exes.items()
        }
        for kernel, product in gemm_in_step.products(exes["new"]).items():
            print(f"  {kernel:6s} {product:34s} base {spent['base'][kernel]:7.1f} us"
                  f"  new {spent['new'][kernel]:7.1f} us")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision or file of the other sgemm.h")
    parser.add_argument("--rows", default="mlp,w1024,mlp_adam,w1024_adam,cnn,gpt")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="per-kernel timers too")
    args = parser.parse_args()
    sources = {"base": base_source(args.base), "new": gemm_kernel.SOURCE}
    threads = os.environ.get("SHAPEGRAD_NUM_THREADS", "default")
    adaptive = os.environ.get("SHAPEGRAD_ADAPTIVE_THREADS", "1")
    print(train_step.cpu_description())
    print(f"sgemm.h: working tree vs {args.base}; threads {threads}, adaptive {adaptive}; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for row in args.rows.split(","):
        measure(row, sources, args.rounds, args.profile)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
