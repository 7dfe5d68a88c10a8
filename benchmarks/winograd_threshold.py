"""Winograd F(2x2, 3x3) vs im2col for one 3x3 convolution (padding 1), compiled to C.

Run: ``python benchmarks/winograd_threshold.py [--batch 64] [--size 28] [--rounds 5]
[--channels 1x16,8x8,16x16,16x32,32x32,64x64] [--eager]``
(``SHAPEGRAD_NUM_THREADS=1`` for codegen comparisons).

Per ``CinxCout`` pair it times a training-style call, ``value_and_grad`` of
``sum(conv2d(x, w) * c)`` with respect to both ``x`` and ``w`` (forward, input and
weight gradients: the three products of a step), with ``algorithm="im2col"`` and
``"winograd"`` in the same process, alternating the two per round so that a busy
machine's slow phases hit both alike. Prints each side's median and the ratio
im2col / winograd (> 1: Winograd faster). ``_conv.WINOGRAD_MIN_CHANNELS`` (the
``algorithm="auto"`` rule) comes from this table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg


def make(algorithm: str, eager: bool) -> Callable[..., Any]:
    def loss(x: sg.Tensor, w: sg.Tensor, c: sg.Tensor) -> sg.Tensor:
        return (sg.conv2d(x, w, padding=1, algorithm=algorithm) * c).sum()

    grad = sg.value_and_grad(loss, argnums=(0, 1))
    return grad if eager else sg.compile(grad, backend="c")


def timed(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=28)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--channels", default="1x16,8x8,16x16,16x32,32x32,64x64")
    parser.add_argument("--eager", action="store_true", help="time eager mode instead of C")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"batch {args.batch}, {args.size}x{args.size}, {'eager' if args.eager else 'C'}")
    print(f"{'Cin x Cout':>12} {'im2col':>10} {'winograd':>10} {'ratio':>6}")
    for pair in args.channels.split(","):
        cin, cout = (int(v) for v in pair.split("x"))
        x = sg.tensor(rng.standard_normal((args.batch, cin, args.size, args.size)), "float32")
        w = sg.tensor(rng.standard_normal((cout, cin, 3, 3)) * 0.1, "float32")
        c = sg.tensor(rng.standard_normal((args.batch, cout, args.size, args.size)), "float32")
        fns = {a: make(a, args.eager) for a in ("im2col", "winograd")}
        for fn in fns.values():  # compile and warm up
            fn(x, w, c)
        times: dict[str, list[float]] = {a: [] for a in fns}
        for r in range(args.rounds):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for a in order:
                times[a].append(timed(fns[a], (x, w, c), args.calls))
        im2col, wino = (statistics.median(times[a]) for a in ("im2col", "winograd"))
        print(f"{pair:>12} {im2col * 1e3:8.2f}ms {wino * 1e3:8.2f}ms {im2col / wino:6.2f}")


if __name__ == "__main__":
    main()
