"""Which product kernel is faster *inside* a compiled training step, per product.

``gemm_rate.py`` times each product alone, its operands hot in cache. Inside a step a
product reads operands another kernel wrote and writes a result another kernel reads,
and there the libraries rank differently: OpenBLAS, for instance, zeroes ``c`` in a pass
of its own before it adds the product when ``beta`` is not 1, which costs little on a
hot ``c`` and 60-100 us on the MLP's cold 784 x 512 weight gradient. This script compiles
the same step three times, with ``SHAPEGRAD_GEMM=blas`` (every product on OpenBLAS),
``auto`` (the rule of ``backends/c/gemm_kernel.py``) and ``own`` (every float32 product on
shapegrad's own kernel, where the compiler targets AVX-512), with per-kernel timers
(``profile=True``), runs the three interleaved in random order per round, and prints the
whole step's median and each product kernel's time per step side by side.

Rows: ``mlp`` (784-512-512-10) and ``w1024`` (784-1024-1024-10), batch 128, and ``cnn``
(two 3x3 convolutions, batch 64); ``--optimizer sgd`` (the update folded into the weight
gradient's product, beta 1) or ``adam`` (the gradient written, beta 0).

Run: ``python benchmarks/gemm_in_step.py [--rows mlp,w1024] [--optimizer sgd,adam]
[--rounds 20] [--threads 2]`` (``--threads`` sets ``SHAPEGRAD_NUM_THREADS``; the team is
fixed, ``SHAPEGRAD_ADAPTIVE_THREADS=0``, so the timers compare like with like).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import train_step  # benchmarks/train_step.py: the workloads (this script's folder)

import shapegrad as sg
from shapegrad.compiler import loops as L

MODES = ("blas", "auto", "own")
WORKLOADS = {"mlp": ("mlp", 128), "w1024": ("mlp1024", 128), "cnn": ("cnn", 64)}


def adam_step(loss: Callable[..., Any]) -> Callable[..., Any]:
    """One step of ``sg.optim.Adam`` (its gradients are written, beta 0)."""
    optimizer = sg.optim.Adam(lr=1e-3)

    def step(state: list[Any], x: Any, y: Any) -> Any:
        params, opt_state = state
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return list(optimizer.update(params, grads, opt_state)), value

    return step


def compiled_step(
    row: str, optimizer: str, name: str, profile: bool
) -> tuple[Callable[[], Any], Any]:
    """(one step, its executable) of ``row`` (``WORKLOADS``) with ``optimizer`` (``sgd``:
    the update folded into the weight gradient; ``adam``: the gradients written), bound
    to a copy of the workload's parameters. ``sgemm_ab.py`` builds its steps here too."""
    workload, batch = WORKLOADS[row]
    w = train_step.workload(workload, batch, 1)
    x, y = w["xs"][0], w["ys"][0]
    if optimizer == "adam":
        state = [w["params"], sg.optim.Adam(lr=1e-3).init([sg.tensor(p) for p in w["params"]])]
        fn = sg.compile(
            adam_step(w["loss"]), backend="c", profile=profile, donate_argnums=0, name=name
        )
        exe = fn.lower(state, x, y).executable
        bound = exe.bind([np.array(a) for a in sg.tree.flatten(state)[0]])
    else:
        fn = sg.compile(
            train_step.sgd_step(w["loss"]), backend="c", profile=profile, donate_argnums=0,
            name=name,
        )  # fmt: skip
        exe = fn.lower(w["params"], x, y).executable
        bound = exe.bind([p.copy() for p in w["params"]])
    return (lambda: bound(x, y)), exe


def build(row: str, optimizer: str, mode: str) -> tuple[Callable[[], Any], Any]:
    """(one step, its executable) compiled with ``SHAPEGRAD_GEMM=mode`` and the timers."""
    os.environ["SHAPEGRAD_GEMM"] = mode  # read when the program is rendered (and keyed)
    try:
        return compiled_step(row, optimizer, f"{row}_{optimizer}", profile=True)
    finally:
        del os.environ["SHAPEGRAD_GEMM"]


def products(exe: Any) -> dict[str, str]:
    """Kernel name -> its first product, as ``m x n x k`` and form (``a^T b``, beta)."""
    out: dict[str, str] = {}
    for kernel in exe.program.kernels:
        for s in L.walk(kernel.body):
            if isinstance(s, L.Contract):
                form = f"{'a^T' if s.trans_a else 'a'} {'b^T' if s.trans_b else 'b'}"
                batch = f" x{s.batch * s.sum_batch}" if s.batch * s.sum_batch > 1 else ""
                out[kernel.name] = f"{s.m}x{s.n}x{s.k}{batch} {form} beta {s.beta:g}"
                break
    return out


def measure(row: str, optimizer: str, rounds: int, calls: int) -> None:
    built = {mode: build(row, optimizer, mode) for mode in MODES}
    for step, _ in built.values():
        for _ in range(50):
            step()
    before = {mode: {k: t for k, _, t in exe.profile()} for mode, (_, exe) in built.items()}
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        order = list(MODES)
        random.shuffle(order)
        for mode in order:
            step = built[mode][0]
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            seconds[mode].append((time.perf_counter() - t0) / calls)
    n = rounds * calls
    spent = {
        mode: {k: (t - before[mode][k]) / n * 1e6 for k, _, t in exe.profile()}
        for mode, (_, exe) in built.items()
    }
    med = {mode: statistics.median(v) * 1e3 for mode, v in seconds.items()}
    print(f"\n{row}, {optimizer}: step ms " + ", ".join(f"{m} {med[m]:.3f}" for m in MODES))
    ratios = sorted(a / b for a, b in zip(seconds["auto"], seconds["blas"], strict=True))
    print(f"  auto / blas, median of per-round ratios {statistics.median(ratios):.3f}")
    print(f"  {'kernel':8s} {'product (m x n x k, form)':34s}" + "".join(f"{m:>8s}" for m in MODES))
    for kernel, product in products(built["auto"][1]).items():
        times = [spent[mode].get(kernel, float("nan")) for mode in MODES]
        if max(times) >= 5:
            print(f"  {kernel:8s} {product:34s}" + "".join(f"{t:8.0f}" for t in times))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", default="mlp,w1024,cnn")
    parser.add_argument("--optimizer", default="sgd,adam")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["SHAPEGRAD_NUM_THREADS"] = str(args.threads)
    os.environ["SHAPEGRAD_ADAPTIVE_THREADS"] = "0"
    print(train_step.cpu_description())
    print(f"{args.threads} thread(s), full team; load average {os.getloadavg()[0]:.2f}")
    print("per product kernel: us per step (the kernel's timer: the product and its epilogue)")
    for row in args.rows.split(","):
        for optimizer in args.optimizer.split(","):
            measure(row, optimizer, args.rounds, args.calls)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
