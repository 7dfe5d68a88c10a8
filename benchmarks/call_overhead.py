"""Per-call overhead of a compiled function: a tiny moons training step, µs per call.

The step is a 2-16-16-1 MLP (tanh, logistic loss) on a batch of 10 with plain SGD;
its native work is about a microsecond, so the time per call is almost all Python
dispatch (argument flattening, signature lookup, validation, buffer hand-off).

Usage::

    .venv/bin/python benchmarks/call_overhead.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import shapegrad as sg


def loss_fn(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.tanh(x @ w1 + b1)
    h = sg.tanh(h @ w2 + b2)
    z = sg.reshape(h @ w3 + b3, (-1,))
    return sg.mean(sg.log(1.0 + sg.exp(-y * z)))


def step(params: Any, x: sg.Tensor, y: sg.Tensor, lr: float) -> Any:
    loss, grads = sg.value_and_grad(loss_fn)(params, x, y)
    return loss, tuple(p - lr * g for p, g in zip(params, grads, strict=True))


def make_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    sizes = [(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)]
    params = tuple(sg.tensor(rng.standard_normal(s).astype(np.float32) * 0.3) for s in sizes)
    x = rng.standard_normal((10, 2)).astype(np.float32)
    y = np.sign(rng.standard_normal(10)).astype(np.float32)
    return params, x, y, 0.1


def us_per_call(backend: str, calls: int) -> float:
    fast = sg.compile(step, backend=backend)
    args = make_args()
    fast(*args)  # compile
    best = float("inf")
    for _ in range(5):  # best of 5 rounds: the machine is shared
        t0 = time.perf_counter()
        for _ in range(calls):
            fast(*args)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    options = parser.parse_args()
    for backend in ("numpy", "c"):
        try:
            print(f"{backend:>6}: {us_per_call(backend, options.calls):8.1f} us/call")
        except Exception as exc:  # report an unusable backend, keep going
            print(f"{backend:>6}: unavailable ({exc})")


if __name__ == "__main__":
    main()
