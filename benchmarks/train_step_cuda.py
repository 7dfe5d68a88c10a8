"""Per-step medians on a GPU: shapegrad CUDA vs PyTorch CUDA eager and PyTorch CUDA graphs.

Run (on a machine with an NVIDIA GPU, pycuda and torch):
    python benchmarks/train_step_cuda.py [--only moons10,mlp,cnn,mlp4096]

Workloads are those of ``train_step.py`` (plain SGD, float32, forward + backward +
update per step) plus MLP 784-4096-4096-10 at batch 1024, in float32 and (``mlp4096bf``)
with parameters and data in bfloat16. Columns: shapegrad
``bound.step`` (one CUDA-graph replay per step, batch copied in, loss copied out,
one sync), shapegrad ``run_steps`` (K steps per replay), PyTorch CUDA eager (same
math, ``torch.autograd.grad`` + in-place SGD), PyTorch with the whole step captured
in a CUDA graph (static inputs), then the in-run cuBLAS SGEMM rate (8192^3, TF32
off) and bf16 GEMM rate, and the large MLP's achieved TFLOP/s as a fraction of the rate
of its dtype. Also prints kernels launched per step (from the generated launcher).

Targets (issues 11 and 21, H100/H200): moons b10 and MLP b128 >= 5x faster than PyTorch
CUDA eager and no slower than PyTorch CUDA graphs; CNN b64 within 1.5x of PyTorch eager;
the large MLP >= 60% of the measured SGEMM rate, >= 50% of the bf16 rate in bfloat16.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as base

import shapegrad as sg

ROWS = {
    "moons10": ("moons", 10, 200),
    "mlp": ("mlp", 128, 20),
    "cnn": ("cnn", 64, 10),
    "mlp4096": ("mlp4096", 1024, 5),
    "mlp4096bf": ("mlp4096", 1024, 5),  # parameters and data in bfloat16 (tensor cores)
}
BF16_ROWS = {"mlp4096bf"}


def as_bfloat16(w: dict[str, Any]) -> dict[str, Any]:
    import ml_dtypes

    bf = ml_dtypes.bfloat16
    return {**w, "params": [p.astype(bf) for p in w["params"]], "xs": w["xs"].astype(bf)}


def workload(name: str, batch: int, k: int) -> dict[str, Any]:
    if name != "mlp4096":
        return base.workload(name, batch, k)
    rng = np.random.default_rng(0)
    shapes = [(784, 4096), (4096,), (4096, 4096), (4096,), (4096, 10), (10,)]
    xs = rng.random((k, batch, 784), dtype=np.float32)
    ys = rng.integers(0, 10, (k, batch)).astype(np.int32)
    return {"params": base.init_params(shapes), "xs": xs, "ys": ys, "loss": base.mlp_loss}


def flops_per_step(name: str, w: dict[str, Any]) -> float:
    """Multiply-add FLOPs of the products (forward + both backward products) per step."""
    batch = w["xs"].shape[1]
    if name not in ("mlp", "mlp4096", "moons"):
        return float("nan")
    mats = [p for p in w["params"] if p.ndim == 2]
    return sum(6.0 * batch * m.shape[0] * m.shape[1] for m in mats)


def gpu_timer(fn: Callable[[], Any], sync: Callable[[], None], repeats: int = 5) -> float:
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-6)
    n = max(3, int(0.3 / once))
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def time_shapegrad(w: dict[str, Any]) -> tuple[float, float, int]:
    fn = sg.compile(base.sgd_step(w["loss"]), backend="cuda", donate_argnums=0)
    exe = fn.lower(w["params"], w["xs"][0], w["ys"][0]).executable
    bound = exe.bind(w["params"])
    x, y = w["xs"][0], w["ys"][0]
    one = gpu_timer(lambda: bound.step(x, y), lambda: None)
    k = w["xs"].shape[0]
    many = gpu_timer(lambda: bound.run_steps(w["xs"], w["ys"]), lambda: None) / k
    return one, many, exe.launches_per_step


def time_torch(name: str, w: dict[str, Any]) -> tuple[float, float]:
    import torch

    step = base.torch_sgd_step(w, "mlp" if name == "mlp4096" else name, device="cuda")
    sync = torch.cuda.synchronize
    eager = gpu_timer(lambda: float(step()), sync)  # .item(): the loss comes back, as ours
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    graphed = gpu_timer(lambda: (graph.replay(), float(static_loss)), sync)
    return eager, graphed


def sgemm_rate(dtype: str = "float32") -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(8192, 8192, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(8192, 8192, device="cuda", dtype=getattr(torch, dtype))
    seconds = gpu_timer(lambda: a @ b, torch.cuda.synchronize)
    return 2 * 8192**3 / seconds


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:9.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:9.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", help="comma-separated rows: " + ",".join(ROWS))
    args = parser.parse_args()
    rows = [r for r in ROWS if not args.only or r in args.only.split(",")]
    rate = sgemm_rate()
    rate_bf16 = sgemm_rate("bfloat16")
    print(f"cuBLAS SGEMM 8192^3 (TF32 off): {rate / 1e12:.1f} TFLOP/s")
    print(f"cuBLAS bf16 GEMM 8192^3 (float32 accumulation): {rate_bf16 / 1e12:.1f} TFLOP/s")
    head = [
        "sg step",
        "sg K-step",
        "torch eager",
        "torch graph",
        "eager/sg",
        "graph/sg",
        "launches",
    ]
    title = "   TFLOP/s (% GEMM of its dtype)"
    print(f"{'workload':10s}" + "".join(f"{h:>13s}" for h in head) + title)
    for row in rows:
        name, batch, k = ROWS[row]
        w = workload(name, batch, k)
        bf16 = row in BF16_ROWS
        one, many, launches = time_shapegrad(as_bfloat16(w) if bf16 else w)
        # PyTorch's columns stay float32 for a bfloat16 row: the target there is the
        # fraction of the in-run bf16 GEMM rate.
        eager, graphed = time_torch(name, w)
        flops = flops_per_step(name, w)
        tflops = flops / one / 1e12
        peak = rate_bf16 if bf16 else rate
        cells = [
            fmt(one),
            fmt(many),
            fmt(eager),
            fmt(graphed),
            f"{eager / one:9.2f}x",
            f"{graphed / one:9.2f}x",
            f"{launches:9d}",
        ]
        extra = f"   {tflops:.2f} ({100 * flops / one / peak:.0f}%)" if np.isfinite(flops) else ""
        print(f"{row:10s}" + "".join(f"{c:>13s}" for c in cells) + extra, flush=True)


if __name__ == "__main__":
    main()
