"""A/B of ``Target.batch_interleave`` on the CNN training step of ``train_step.py``.

Interleaving runs a batch-fused convolution product's neighbouring per-image kernels
(bias + ReLU + mean after it, the ReLU-masked output gradient before the input
gradient, bias + ReLU + pad before the next layer's patches) inside the product's
per-image loop (``compiler/batchfuse.py``). Results are bitwise equal; only memory
traffic changes. Both variants are compiled once and timed in interleaved rounds.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=src:benchmarks python
benchmarks/batch_interleave_ab.py [--threads 1|2] [--rounds 9] [--profile]``
(``--threads 1``: CPU time per step; otherwise wall time). ``SHAPEGRAD_BENCH_CONV=auto``
uses ``sg.conv2d`` instead of the im2col-written convolution, as in ``train_step.py``.

Measured (AMD EPYC Zen 5, 2 cores shared with 4 other helpers' jobs, im2col-written
model), median step, off -> on, 2026-11-26:
  1 thread, CPU time: 11.96 -> 11.96 ms (9 rounds, load 7.3); 11.55 -> 11.75 (7 rounds,
    load 7.6 -> 8.3): no difference beyond the noise;
  2 threads, wall time: 22.0 -> 22.4 ms (11 rounds, load 5.1);
  load 2.1 (one core busy elsewhere): 1 thread CPU 11.20 -> 11.28 ms, 2 threads wall
    11.18 -> 11.45 ms (11 rounds each); load 1.2-1.4: 2 threads wall 7.08 -> 7.01 ms
    (15 rounds). No gain beyond the noise, so the target default stays off.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
from typing import Any

import train_step as T

import shapegrad as sg
from shapegrad.compiler.target import C_TARGET


def _variants(profile: bool) -> dict[str, tuple[Any, Any]]:
    w = T.workload("cnn", 64, 4)
    out = {}
    for name, target in {
        "off": C_TARGET.replace(batch_interleave=False),
        "on": C_TARGET.replace(batch_interleave=True),
    }.items():
        fn = sg.compile(
            T.sgd_step(w["loss"]), backend="c", donate_argnums=0, target=target, profile=profile
        )
        exe = fn.lower(w["params"], w["xs"][0], w["ys"][0]).executable
        out[name] = (exe, exe.bind([p.copy() for p in w["params"]]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per round")
    parser.add_argument("--profile", action="store_true", help="per-kernel wall times")
    args = parser.parse_args()
    os.environ["SHAPEGRAD_NUM_THREADS"] = str(args.threads)
    clock = time.process_time if args.threads == 1 else time.perf_counter
    w = T.workload("cnn", 64, 4)
    x, y = w["xs"][0], w["ys"][0]
    variants = _variants(args.profile)
    times: dict[str, list[float]] = {n: [] for n in variants}
    kernels: dict[str, collections.Counter[str]] = {n: collections.Counter() for n in variants}
    load = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, (exe, bound) in variants.items():
            for _ in range(5):
                bound(x, y)
            before = {f"{k} {r}": s for k, r, s in exe.profile()} if args.profile else {}
            t0 = clock()
            for _ in range(args.steps):
                bound(x, y)
            times[name].append((clock() - t0) / args.steps * 1e3)
            for k, r, s in exe.profile() if args.profile else ():
                kernels[name][f"{k} {r}"] += (s - before[f"{k} {r}"]) / args.steps * 1e3
    what = "CPU time" if args.threads == 1 else "wall time"
    print(f"CNN b64 step, {args.threads} thread(s), {what}, {args.rounds} interleaved rounds")
    for name, values in times.items():
        shown = " ".join(f"{v:.2f}" for v in values)
        print(f"  {name:>3}: median {statistics.median(values):.3f} ms  [{shown}]")
        for k, total in kernels[name].items():
            if total / args.rounds > 0.02:
                print(f"       {k:<24} {total / args.rounds:7.3f} ms")
    print(f"load average {load:.2f} -> {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
