"""Per-example gradients by ``sg.vmap(sg.grad(loss))`` against the plain batch gradient,
both compiled to C: the MLP 784-512-512-10 at batch 128 (issue 26's target: within 1.5x).

    PYTHONPATH=src python benchmarks/vmap_per_example.py [--batch 128] [--backend c]

The per-example step returns every example's gradient (batch x the parameters); the batch
step returns their mean. Both run from warm compiled artifacts; times are medians.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from train_step import mlp_logits, mlp_loss, per_call, workload

import shapegrad as sg


def example_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return sg.cross_entropy(mlp_logits(params, x[None]), y[None])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--backend", default="c")
    args = parser.parse_args()
    w = workload("mlp", args.batch, 1)
    params = [sg.tensor(p) for p in w["params"]]
    x, y = sg.tensor(w["xs"][0]), sg.tensor(w["ys"][0])
    per_example = sg.compile(
        sg.vmap(sg.grad(example_loss), in_axes=(None, 0, 0)), backend=args.backend
    )
    batch = sg.compile(sg.grad(mlp_loss), backend=args.backend)
    t0 = time.perf_counter()
    g_ex: Any = per_example(params, x, y)
    t_compile = time.perf_counter() - t0
    g_batch: Any = batch(params, x, y)
    for a, b in zip(g_ex, g_batch, strict=True):  # the mean of per-example grads is the grad
        np.testing.assert_allclose(a.numpy().mean(0), b.numpy(), rtol=2e-3, atol=2e-5)
    t_ex = per_call(lambda: per_example(params, x, y))
    t_b = per_call(lambda: batch(params, x, y))
    print(f"backend {args.backend}, batch {args.batch}: first per-example call {t_compile:.2f} s")
    print(f"per-example grads (vmap(grad)): {t_ex * 1e3:.3f} ms")
    print(f"batch grad:                     {t_b * 1e3:.3f} ms")
    print(f"ratio: {t_ex / t_b:.2f}x (issue 26 target: <= 1.5x)")


if __name__ == "__main__":
    main()
