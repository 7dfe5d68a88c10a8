"""Per-kernel profile of the charlm (GPT) training step, compiled C.

Run: ``SHAPEGRAD_NUM_THREADS=1 python benchmarks/gpt_profile.py [--top 15] [--steps 20]``

Builds ``depth.py``'s charlm step (unrolled blocks, AdamW; ``--loop``: one layer loop)
through ``ScalarTrainer`` with ``profile=True`` forced on the C backend (no manifest
is read or written, so the profiled library is built and never cached as a plain one),
runs ``--steps`` steps and prints the step time (wall and CPU), the time in large
library products, in small ones (attention) and in the rest, the time in the kernels with
a batched product (attention's: ``sg_sgemm_batch`` or one library call per product,
``$SHAPEGRAD_BATCH_GEMM``), then the kernels ranked by time (ms per step) with their root
op. ``--no-profile`` times the step only;
``--target row_fusion=False,strided_batches=False`` changes ``C_TARGET`` fields, for an
A/B of a stage within one tree. Profiled times are wall clock: on a busy machine compare
the CPU time of the step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import shapegrad as sg
import shapegrad.backends.c as cback
from shapegrad.backends.c.executable import CExecutable

sys.path.insert(0, os.path.dirname(__file__))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-profile", action="store_true", help="time the step only")
    parser.add_argument("--loop", action="store_true", help="blocks as one layer loop (sg.scan)")
    parser.add_argument(
        "--target", default="", help="C_TARGET fields to change, e.g. 'row_fusion=False'"
    )
    args = parser.parse_args()
    if args.target:  # an A/B of one stage or rule within one tree
        import shapegrad.backends.c.options as copts

        changes = dict(kv.split("=") for kv in args.target.split(","))
        copts.C_TARGET = copts.C_TARGET.replace(**{k: v == "True" for k, v in changes.items()})

    made: list[CExecutable] = []
    if not args.no_profile:
        units = cback.render_c_units

        def profiled(program: Any, profile: bool = False, *a: Any, **k: Any) -> Any:
            return units(program, True, *a, **k)

        cback.render_c_units = profiled  # type: ignore[assignment]
        # a manifest hit would load the unprofiled library without rendering: skip it (and
        # the manifest written after this build keys a profiled library under plain options,
        # so the profiled build must not be stored as one either)
        cback.CBackend.load_keyed = lambda self, *a, **k: None  # type: ignore[method-assign]
        cback.manifest.write = lambda *a, **k: None  # type: ignore[assignment]
    init = CExecutable.__init__

    def record(self: CExecutable, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        made.append(self)

    CExecutable.__init__ = record  # type: ignore[method-assign]

    from charlm_model import charlm_params

    from shapegrad.nn.transformer import (
        embed,
        transformer_block,
        transformer_stack,
    )

    vocab, d, blocks, heads, t, bsz, k = 94, 128, 2, 4, 64, 32, 10
    rng = np.random.default_rng(2)
    xs = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    ys = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    params = charlm_params(rng, vocab, d, t, blocks)

    def loss(p: dict[str, Any], ids: sg.Tensor, targets: sg.Tensor) -> sg.Tensor:
        h = embed(p["tokens"], p["positions"], ids)
        if args.loop:
            h = transformer_stack(p["blocks"], h, heads, causal=True, loop=True, remat=False)
        for i in range(0 if args.loop else blocks):
            h = transformer_block([w[i] for w in p["blocks"]], h, heads, causal=True)
        h = sg.layer_norm(h, p["ln_w"], p["ln_b"])
        logits = h @ p["tokens"].T
        return sg.cross_entropy(logits.reshape((-1, vocab)), targets.reshape((-1,)))

    trainer = sg.ScalarTrainer(
        loss, params, mode="compiled", backend="c", optimizer=sg.optim.AdamW(lr=1e-3)
    )
    t0 = time.perf_counter()
    first = trainer.step_many(xs, ys)
    print(f"first call {time.perf_counter() - t0:.2f} s; losses {first[0]:.4f} .. {first[-1]:.4f}")
    exe = made[-1]
    if not args.no_profile:
        base = {name: s for name, _, s in exe.profile()}
    rounds = max(1, args.steps // k)
    best = cpu = float("inf")
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.step_many(xs, ys)
        best = min(best, (time.perf_counter() - t0) / k)
        cpu = min(cpu, (time.process_time() - c0) / k)
    # CPU time (one thread) is what a busy machine disturbs least: compare it across runs
    print(f"step: {best * 1e3:.2f} ms wall, {cpu * 1e3:.2f} ms CPU (best of {rounds} x {k} steps)")
    if args.no_profile:
        return
    prof = [(name, root, (s - base[name]) / (rounds * k)) for name, root, s in exe.profile()]
    work = {kern.name: kern.work for kern in exe.program.kernels}
    total = sum(p[2] for p in prof)
    print(f"kernels: {len(prof)}, profiled total {total * 1e3:.2f} ms/step")
    by_op: dict[str, float] = {}
    for _, root, s in prof:
        op = root.split("%")[0]
        by_op[op] = by_op.get(op, 0.0) + s
    shown = ", ".join(f"{op} {s * 1e3:.1f}" for op, s in sorted(by_op.items(), key=lambda p: -p[1]))
    print(f"by root op (ms/step): {shown}")
    products = {k.name for k in exe.program.kernels if _has_contract(k)}
    big = sum(s for name, _, s in prof if name in products and work[name] >= 1 << 26)
    small = sum(s for name, _, s in prof if name in products and work[name] < 1 << 26)
    print(
        f"library products: large {big * 1e3:.1f} ms, small (< 2^26 ops, attention) "
        f"{small * 1e3:.1f} ms; the rest {(total - big - small) * 1e3:.1f} ms"
    )
    batched = {k.name for k in exe.program.kernels if _has_contract(k, batched=True)}
    shown = ", ".join(f"{name} {s * 1e3:.3f}" for name, _, s in prof if name in batched)
    in_batched = sum(s for name, _, s in prof if name in batched)
    print(f"batched products (attention; ms/step): {in_batched * 1e3:.2f} in all: {shown}")
    for name, root, s in sorted(prof, key=lambda p: -p[2])[: args.top]:
        rate = work[name] / s / 1e9 if s > 0 else 0.0  # work: scalar ops (2 per multiply-add)
        print(
            f"  {s * 1e3:7.3f} ms {100 * s / total:5.1f}% {rate:6.1f} Gop/s  {name:6} {root[:80]}"
        )


def _has_contract(kernel: Any, batched: bool = False) -> bool:
    """Whether a kernel's body holds a library product (a Contract, fed or not); with
    ``batched``, a Contract of several products (``batch > 1``: attention's)."""
    from shapegrad.compiler import loops as L

    def walk(stmts: Any) -> bool:
        for s in stmts:
            if batched and isinstance(s, L.Contract) and s.batch > 1:
                return True
            if not batched and isinstance(s, (L.Contract, L.BatchFused)):
                return True
            if walk(getattr(s, "body", ())):
                return True
        return False

    return walk(kernel.body)


if __name__ == "__main__":
    main()
