"""Eager elementwise ops, forward + backward, µs per op: shapegrad vs PyTorch eager (CPU).

Each measurement applies one op to ``--fan`` independent leaves (so per-op time is not
dominated by the fixed cost of entering backward, and no gradient accumulation is
added), then runs the backward pass with a random cotangent per output:

* shapegrad: ``out, pull = sg.vjp(fan, *leaves); pull(cotangents)``
* PyTorch:   ``torch.autograd.grad(fan(*leaves), leaves, cotangents)``, one thread

and divides by the fan. Tensor operands (``b``) are constants (no gradient), as are the
masks of ``where``. Rounds alternate shapegrad and PyTorch on every (op, size) cell,
and the table gives medians over the rounds and their ratio. Issue #12's target is
ratio <= 3 on a quiet machine and with ``--background-load 2``; on a shared machine
only the ratio of one interleaved run means anything.

Usage::

    python benchmarks/eager_ops.py [--sizes 1,1000,1000000] [--ops mul_s,exp]
                                   [--rounds 5] [--fan 16] [--background-load N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg

Fn = Callable[..., Any]


def sg_ops(b: Any, mask: Any) -> dict[str, Fn]:
    return {
        "add_t": lambda x: x + b,
        "add_s": lambda x: x + 0.5,
        "mul_t": lambda x: x * b,
        "mul_s": lambda x: x * 0.999,
        "exp": sg.exp,
        "tanh": sg.tanh,
        "relu": sg.relu,
        "maximum": lambda x: sg.maximum(x, b),
        "where": lambda x: sg.where(mask, x, b),
        "where_s": lambda x: sg.where(mask, x, 0.0),
    }


def torch_ops(torch: Any, b: Any, mask: Any) -> dict[str, Fn]:
    return {
        "add_t": lambda x: x + b,
        "add_s": lambda x: x + 0.5,
        "mul_t": lambda x: x * b,
        "mul_s": lambda x: x * 0.999,
        "exp": torch.exp,
        "tanh": torch.tanh,
        "relu": torch.relu,
        "maximum": lambda x: torch.maximum(x, b),
        "where": lambda x: torch.where(mask, x, b),
        "where_s": lambda x: torch.where(mask, x, 0.0),
    }


def per_call(fn: Callable[[], Any], budget: float) -> float:
    """Best-of-3 mean seconds per call, each batch sized to about ``budget / 3`` seconds."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(budget / 3 / once))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def make_cells(
    size: int, fan: int, names: list[str], torch: Any
) -> dict[str, tuple[Fn, Fn | None]]:
    """(shapegrad call, PyTorch call) per op at one size."""
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-1.0, 1.0, size).astype(np.float32) for _ in range(fan)]
    gs = [rng.standard_normal(size).astype(np.float32) for _ in range(fan)]
    b_np = rng.uniform(0.5, 1.5, size).astype(np.float32)
    m_np = rng.random(size) < 0.5
    sg_x = [sg.tensor(x) for x in xs]
    sg_g = tuple(sg.tensor(g) for g in gs)
    sg_table = sg_ops(sg.tensor(b_np), sg.tensor(m_np))
    if torch is not None:
        t_x = [torch.tensor(x, requires_grad=True) for x in xs]
        t_g = [torch.tensor(g) for g in gs]
        t_table = torch_ops(torch, torch.tensor(b_np), torch.tensor(m_np))
    cells: dict[str, tuple[Fn, Fn | None]] = {}
    for name in names:
        op = sg_table[name]

        def fan_sg(*leaves: Any, op: Fn = op) -> tuple[Any, ...]:
            return tuple(op(x) for x in leaves)

        def run_sg(fan_sg: Fn = fan_sg) -> None:
            _, pull = sg.vjp(fan_sg, *sg_x)
            pull(sg_g)

        run_torch: Fn | None = None
        if torch is not None:
            t_op = t_table[name]

            def run_torch(t_op: Fn = t_op) -> None:
                outs = [t_op(x) for x in t_x]
                torch.autograd.grad(outs, t_x, t_g)

        cells[name] = (run_sg, run_torch)
    return cells


def background_load(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that keep one CPU busy each until killed."""
    code = "while True:\n    pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1000,1000000")
    parser.add_argument("--ops", help="subset of: " + ",".join(sg_ops(None, None)))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fan", type=int, default=16, help="independent ops per measurement")
    parser.add_argument("--budget", type=float, default=0.15, help="seconds per cell per round")
    parser.add_argument("--background-load", type=int, default=0, metavar="N")
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    names = args.ops.split(",") if args.ops else list(sg_ops(None, None))
    sizes = [int(s) for s in args.sizes.split(",")]
    busy = background_load(args.background_load)
    try:
        print(
            f"background load: {args.background_load} busy processes; load average "
            f"{os.getloadavg()[0]:.2f}; fan {args.fan}, {args.rounds} interleaved rounds; "
            f"PyTorch {torch.__version__ + ', 1 thread' if torch else 'not installed'}"
        )
        print(f"{'op':10s}{'size':>9s}{'sg us/op':>11s}{'torch us/op':>13s}{'sg/torch':>10s}")
        for size in sizes:
            fan = args.fan if size < 100_000 else max(1, args.fan // 4)
            cells = make_cells(size, fan, names, torch)
            for name in names:
                run_sg, run_torch = cells[name]
                sg_t: list[float] = []
                torch_t: list[float] = []
                for _ in range(args.rounds):
                    sg_t.append(per_call(run_sg, args.budget) / fan * 1e6)
                    if run_torch is not None:
                        torch_t.append(per_call(run_torch, args.budget) / fan * 1e6)
                s = statistics.median(sg_t)
                line = f"{name:10s}{size:>9d}{s:>11.2f}"
                if torch_t:
                    t = statistics.median(torch_t)
                    line += f"{t:>13.2f}{s / t:>9.2f}x"
                print(line, flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        for proc in busy:
            proc.kill()


if __name__ == "__main__":
    main()
