"""A/B of the ``collapse_loops`` loop stage on a training step: CPU time at one thread.

Compiles the step twice (``C_TARGET`` and ``C_TARGET`` skipping ``collapse_loops``), checks
the two agree (max abs difference per output: a collapsed ``mean`` over ``H, W`` sums in
another lane order under ``-fassociative-math``, so the values are close, not equal),
then times them interleaved, ``--rounds`` rounds of ``--steps`` steps each.

Run (what a user gets; the environment's OpenBLAS settings unset):

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src:benchmarks \\
        python benchmarks/collapse_ab.py --model cnn

Measured (2026-11-26, Zen 5, 2 cores shared with other work, load average in the output):
CNN b64 step, one thread, CPU ms/step median (fastest), two runs: on 9.08 (8.86) vs off
9.95 (9.78) at load 1.1; on 9.10 (8.99) vs off 9.93 (9.89) at load 2.75. Max |on - off|
over the step's outputs 3e-8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import train_step

import shapegrad as sg
from shapegrad.compiler.target import C_TARGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    os.environ["SHAPEGRAD_NUM_THREADS"] = "1"
    batch = {"cnn": 64, "mlp": 128}[args.model]
    w = train_step.workload(args.model, batch, 1)
    x, y = w["xs"][0], w["ys"][0]
    off = C_TARGET.replace(skip_stages=C_TARGET.skip_stages | {"collapse_loops"})
    steps: dict[str, Any] = {}
    results: dict[str, list[np.ndarray]] = {}
    for name, target in (("on", C_TARGET), ("off", off)):
        fn = sg.compile(train_step.sgd_step(w["loss"]), backend="c", target=target)
        params, loss = fn(w["params"], x, y)
        results[name] = [np.asarray(p) for p in params] + [np.asarray(loss)]
        steps[name] = fn
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(*results.values(), strict=True))
    print(f"max |on - off| over the step's outputs: {diff:.3g}")
    for fn in steps.values():
        for _ in range(10):
            fn(w["params"], x, y)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, fn in steps.items():
            t0 = time.process_time()
            for _ in range(args.steps):
                fn(w["params"], x, y)
            times[name].append((time.process_time() - t0) / args.steps * 1e3)
    for name, ms in times.items():
        print(
            f"{args.model} collapse_loops {name:3s}: CPU ms/step median "
            f"{statistics.median(ms):.3f}  fastest {min(ms):.3f}  "
            f"({args.rounds} rounds x {args.steps} steps, 1 thread)"
        )
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
