"""Costs of issue 14's features, compiled with the C backend (median of repeats, ms or µs).

* dropout on a [256, 1024] activation: Python-int seed (RANDOM primitive, baked in) vs a
  key input (the keyed permutation, five rounds of float64 integer arithmetic);
* the per-call overhead of ``sg.compile`` on the same 2-layer MLP held as a ParamList
  (exact-structure fast path) vs an ``sg.nn.Module`` (full flatten each call);
* a ScalarTrainer step (bound C strategy) of that MLP with and without per-step dropout keys.

Usage::

    .venv/bin/python benchmarks/keys_and_modules.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad import Float, Tensor
from shapegrad.nn import Linear, Module, field


def median_seconds(fn: Callable[[], Any], repeats: int = 7, number: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return float(np.median(times))


class MLP(Module):
    l1: Linear = field(dims={"d_in": "i", "d_out": "h"})
    l2: Linear = field(dims={"d_in": "h", "d_out": "o"})


class Flat(sg.ParamList[Float[Tensor, "h i"], Float[Tensor, " h"], Float[Tensor, "o h"], Float[Tensor, " o"]]):
    names = ("w1", "b1", "w2", "b2")


def module_loss(m: MLP, x: Tensor, y: Tensor) -> Tensor:
    return sg.cross_entropy(m.l2(sg.relu(m.l1(x))), y)


def flat_loss(p: Flat, x: Tensor, y: Tensor) -> Tensor:
    return sg.cross_entropy(sg.nn.mlp(p, x), y)


def keyed_loss(m: MLP, x: Tensor, y: Tensor, *, key: Tensor) -> Tensor:
    return sg.cross_entropy(m.l2(sg.dropout(sg.relu(m.l1(x)), 0.5, key)), y)


def main() -> None:
    act = np.ones((256, 1024), np.float32)
    seeded = sg.compile(lambda x: sg.dropout(x, 0.5, seed=1), backend="c")
    keyed = sg.compile(lambda x, k: sg.dropout(x, 0.5, k), backend="c")
    key = sg.random.key(0)
    print(f"dropout [256, 1024]  int seed: {median_seconds(lambda: seeded(act)) * 1e3:.3f} ms   "
          f"key input: {median_seconds(lambda: keyed(act, key)) * 1e3:.3f} ms")  # fmt: skip

    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 2)).astype(np.float32)
    y = rng.integers(0, 2, size=10).astype(np.int32)
    module = MLP.init(seed=0, i=2, h=16, o=2)
    flat = Flat.init(sg.nn.init.kaiming, seed=0, i=2, h=16, o=2)
    vg_module = sg.compile(sg.value_and_grad(module_loss), backend="c")
    vg_flat = sg.compile(sg.value_and_grad(flat_loss), backend="c")
    print(f"compiled value_and_grad call, MLP 2-16-2 b10  ParamList: "
          f"{median_seconds(lambda: vg_flat(flat, x, y), number=500) * 1e6:.1f} us   Module: "
          f"{median_seconds(lambda: vg_module(module, x, y), number=500) * 1e6:.1f} us")  # fmt: skip

    plain = sg.ScalarTrainer(module_loss, module, mode="compiled", backend="c", optimizer=sg.optim.Adam(lr=0.01))
    drop = sg.ScalarTrainer(keyed_loss, module, mode="compiled", backend="c", optimizer=sg.optim.Adam(lr=0.01))
    print(f"ScalarTrainer.step (bound C), Module MLP b10  no key: "
          f"{median_seconds(lambda: plain.step(x, y), number=500) * 1e6:.1f} us   dropout key: "
          f"{median_seconds(lambda: drop.step(x, y), number=500) * 1e6:.1f} us")  # fmt: skip


if __name__ == "__main__":
    main()
