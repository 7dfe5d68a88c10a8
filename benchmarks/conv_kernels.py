"""Per-kernel profile of a CNN SGD step compiled to C (``profile=True``), batch 64.

Run: ``python benchmarks/conv_kernels.py [--model cnn|pool|stride] [--steps 20] [--top 10]``
(``SHAPEGRAD_NUM_THREADS=1`` for codegen comparisons; ``SHAPEGRAD_DEBUG=<dir>`` to read
the generated C of each kernel).

``--ab blas,auto`` instead compiles the step once per ``$SHAPEGRAD_GEMM`` mode named (the
products' library, ``backends/c/gemm_kernel.py``) and times the variants interleaved, in
this process's CPU time at one thread (``--rounds`` rounds of ``--steps`` steps each): an
A/B that a shared machine's load disturbs far less than wall time. ``--threads 2`` times
wall time instead, after 200 warm-up steps per variant.

Models (1x28x28 input, 10 classes, cross-entropy, SGD):

* ``cnn``: ``train_step.py``'s row ``cnn`` (two 3x3 convolutions 16 and 32, padding 1,
  ReLU, global average pool, linear);
* ``pool``: ``sg.conv2d`` 16 -> ReLU -> ``max_pool2d(2)`` -> ``sg.conv2d`` 32 -> ReLU ->
  ``max_pool2d(2)`` -> linear;
* ``stride``: the same with stride-2 convolutions (padding 1) instead of pooling.

Prints the CPU (and its vector width), the OpenBLAS kernel set the products run on, the
load average, the median step time (per-call timing of the bound executable) and the
kernels ranked by accumulated wall time per step. Timings are noisy on a shared machine:
compare two source trees in alternating runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import shapegrad as sg
import shapegrad.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step  # the benchmark's cnn model and data (after the path entry)


def _head(h: sg.Tensor, w: sg.Tensor, b: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return F.cross_entropy(h.reshape((h.shape[0], -1)) @ w + b, y)


def pool_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.max_pool2d(sg.relu(sg.conv2d(x, w1, b1, padding=1)), 2)
    h = sg.max_pool2d(sg.relu(sg.conv2d(h, w2, b2, padding=1)), 2)
    return _head(h, w3, b3, y)


def stride_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(sg.conv2d(x, w1, b1, padding=1, stride=2))
    h = sg.relu(sg.conv2d(h, w2, b2, padding=1, stride=2))
    return _head(h, w3, b3, y)


def workload(model: str) -> dict[str, Any]:
    w = train_step.workload("cnn", 64, 1)
    if model == "cnn":
        return w
    shapes = [(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (32 * 49, 10), (10,)]
    w["params"] = train_step.init_params(shapes)
    w["loss"] = pool_loss if model == "pool" else stride_loss
    return w


def profile(model: str, steps: int) -> tuple[float, list[tuple[str, str, float]]]:
    """(median seconds per step, [(kernel, root, seconds per step)] slowest first)."""
    w = workload(model)
    step: Callable[..., Any] = train_step.sgd_step(w["loss"])
    fn = sg.compile(step, backend="c", donate_argnums=0, profile=True)
    exe = fn.lower(w["params"], w["xs"][0], w["ys"][0]).executable
    bound = exe.bind(w["params"])
    x, y = w["xs"][0], w["ys"][0]
    for _ in range(3):
        bound(x, y)
    before = {(k, r): s for k, r, s in exe.profile()}
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        bound(x, y)
        times.append(time.perf_counter() - t0)
    kernels = [(k, r, (s - before[(k, r)]) / steps) for k, r, s in exe.profile()]
    return statistics.median(times), sorted(kernels, key=lambda t: -t[2])


def ab(model: str, modes: list[str], steps: int, rounds: int, threads: int) -> None:
    """Median and fastest time per step of each ``$SHAPEGRAD_GEMM`` mode, interleaved: CPU
    time at one thread, wall time at more (after 200 warm-up steps, so the adaptive team
    has settled)."""
    os.environ["SHAPEGRAD_NUM_THREADS"] = str(threads)
    clock = time.process_time if threads == 1 else time.perf_counter
    w = workload(model)
    x, y = w["xs"][0], w["ys"][0]
    bound = {}
    for mode in modes:
        os.environ["SHAPEGRAD_GEMM"] = mode  # read when the program is rendered
        fn = sg.compile(train_step.sgd_step(w["loss"]), backend="c", donate_argnums=0)
        bound[mode] = fn.lower(w["params"], x, y).executable.bind(w["params"])
        for _ in range(20 if threads == 1 else 200):
            bound[mode](x, y)
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode in modes:
            t0 = clock()
            for _ in range(steps):
                bound[mode](x, y)
            times[mode].append((clock() - t0) / steps)
    what = "CPU" if threads == 1 else "wall"
    for mode in modes:
        ms = [t * 1e3 for t in times[mode]]
        print(
            f"{model} SHAPEGRAD_GEMM={mode:5s} {what} ms/step: median {statistics.median(ms):.3f}"
            f"  fastest {min(ms):.3f}  ({rounds} rounds x {steps} steps, {threads} thread(s))"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=["cnn", "pool", "stride"], default="cnn")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--ab", help="$SHAPEGRAD_GEMM modes to compare (comma separated)")
    parser.add_argument("--rounds", type=int, default=7, help="with --ab")
    parser.add_argument("--threads", type=int, default=1, help="with --ab (wall time at > 1)")
    args = parser.parse_args()
    print(f"CPU: {train_step.cpu_description()}")
    print(train_step.blas_description())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    if args.ab:
        ab(args.model, args.ab.split(","), args.steps, args.rounds, args.threads)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    step, kernels = profile(args.model, args.steps)
    total = sum(s for *_, s in kernels)
    print(f"{args.model}: step {step * 1e3:.2f} ms (median), kernels {total * 1e3:.2f} ms")
    for name, root, seconds in kernels[: args.top]:
        print(f"{seconds * 1e3:8.3f} ms  {name:5s} {root[:70]}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
