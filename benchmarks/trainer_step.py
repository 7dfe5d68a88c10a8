"""Per-call cost of ``ScalarTrainer.step`` and per-step cost of ``step_many`` (moons 2-16-16-1,
batch 10, compiled C, one thread): the Python around a microsecond-scale native step.

Run: ``python benchmarks/trainer_step.py``. Targets (issue 12): ``step`` <= 4 us per call,
``step_many`` <= 1.5 us per step (SGD). Adam is printed too: with dead ReLU units its
first moment decays into denormal floats, which x86 computes ~100x slower; the row
``Adam ftz`` is the same trainer with ``flush_denormals=True`` (denormals flushed to zero).
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

os.environ.setdefault("SHAPEGRAD_NUM_THREADS", "1")

import shapegrad as sg
from shapegrad.models import MoonsMLP


def loss(p: MoonsMLP, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return sg.hinge(sg.nn.mlp(p, x).reshape((x.shape[0],)), y)


def main() -> None:
    rng = np.random.default_rng(0)
    x, labels = sg.data.make_moons(10, noise=0.1, seed=0)
    y = (2 * labels - 1).astype(np.float32)
    xs = rng.standard_normal((1000, 10, 2)).astype(np.float32)
    ys = np.sign(rng.standard_normal((1000, 10))).astype(np.float32)
    params = MoonsMLP.init(sg.nn.init.kaiming, seed=0, h=16)
    cases = [
        ("SGD", sg.optim.SGD(lr=0.05), False),
        ("Adam", sg.optim.Adam(lr=0.01), False),
        ("Adam ftz", sg.optim.Adam(lr=0.01), True),
    ]
    for name, opt, ftz in cases:
        kw = {"mode": "compiled", "backend": "c", "optimizer": opt, "flush_denormals": ftz}
        trainer = sg.ScalarTrainer(loss, params, **kw)
        for _ in range(100):
            trainer.step(x, y)
        calls = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(5000):
                trainer.step(x, y)
            calls.append((time.perf_counter() - t0) / 5000)
        fresh = sg.ScalarTrainer(loss, params, **kw)
        fresh.step_many(xs, ys)
        many = []
        for _ in range(5):
            t0 = time.perf_counter()
            fresh.step_many(xs, ys)
            many.append((time.perf_counter() - t0) / 1000)
        print(
            f"{name:8s} step {statistics.median(calls) * 1e6:6.2f} us/call   "
            f"step_many {statistics.median(many) * 1e6:6.2f} us/step"
        )


if __name__ == "__main__":
    main()
