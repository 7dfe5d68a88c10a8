"""Per-example gradients by ``sg.vmap(sg.grad(loss))`` against the plain batch gradient,
both compiled to C: the MLP 784-512-512-10 at batch 128 (issue 26's target: within 1.5x).

    PYTHONPATH=src python benchmarks/vmap_per_example.py [--batch 128] [--backend c]

The per-example step returns every example's gradient (batch x the parameters); the batch
step returns their mean. Both run from warm compiled artifacts; times are medians. Each is
timed through ``sg.compile``'s call (fresh output arrays: the per-example one first touches
~343 MB of new pages every call) and as a bound step (outputs reused), next to the time
to fill that many bytes in place: the memory-bound floor of the per-example step.
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
    if args.backend != "c":
        return
    arrays = [p.numpy() for p in params] + [x.numpy(), y.numpy()]
    bound_ex = per_example.lower(params, x, y).executable.bind()
    bound_b = batch.lower(params, x, y).executable.bind()
    tb_ex = per_call(lambda: bound_ex.step(*arrays))
    tb_b = per_call(lambda: bound_b.step(*arrays))
    nbytes = sum(np.asarray(g.numpy()).nbytes for g in g_ex)
    buf = np.empty(nbytes // 4, np.float32)
    t_fill = per_call(lambda: buf.fill(1.0))
    print(
        f"bound steps (outputs reused): per-example {tb_ex * 1e3:.3f} ms, batch {tb_b * 1e3:.3f} ms"
    )
    print(f"bound ratio: {tb_ex / tb_b:.2f}x")
    print(
        f"floor: filling the {nbytes / 1e6:.0f} MB of per-example grads in place takes "
        f"{t_fill * 1e3:.3f} ms ({nbytes / t_fill / 1e9:.1f} GB/s) = {t_fill / tb_b:.2f}x the batch step"
    )


if __name__ == "__main__":
    main()
