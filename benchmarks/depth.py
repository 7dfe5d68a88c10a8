"""Depth: compile time, step time and memory of deep stacks, unrolled vs layer loop vs remat.

Run: ``python benchmarks/depth.py [--only mlp,transformer,charlm] [--threads 1]``

* MLP stacks (width 64, batch 64, tanh, MSE) of 2, 8, 32, 64 layers and pre-LN
  transformer stacks (d 64, 4 heads, f 256, context 32, batch 8) of 2, 8, 16 blocks;
  the step is ``sg.value_and_grad`` compiled for C, three ways: ``unrolled`` (a Python
  loop: one copy of the layer per depth), ``loop`` (``sg.scan`` with stored residuals)
  and ``loop+remat`` (``sg.scan`` recomputing each layer from its stored input).
  Columns: cold compile (empty cache: trace + passes + lowering + cc; wall and CPU incl.
  the compiler process), warm step (median), arena bytes and kernel count
  (``Compiled.stats()``). JAX ``jit`` of the same step with ``lax.scan`` (and
  ``jax.checkpoint`` for remat) when importable; ``--torch-compile`` adds
  ``torch.compile`` of the unrolled model (slow to compile).
* charlm: the examples/charlm.py training step at d_model 128, 2 blocks, 4 heads,
  context 64, batch 32, AdamW: shapegrad ``ScalarTrainer`` (compiled C, K steps per
  native call) vs PyTorch eager vs JAX ``jit`` (hand-written AdamW), measured in one run,
  interleaved rounds.

charlm, 2026-11-26 (AMD EPYC Zen 5, 2 cores, AVX-512; load average 4.4-5.7 from other
jobs, so CPU time at one thread each: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
python benchmarks/train_step.py --gpt --cpu-time``; ms per step, best round (median of 5),
two runs per tree interleaved):

==========================  ===============  ===============  ==============  ==============
tree                        unrolled         layer loop       PyTorch eager   JAX jit
==========================  ===============  ===============  ==============  ==============
before (main a78e11f)       35.04 (35.83)    37.49 (38.39)    74.51 (76.18)   95.71 (96.43)
                            35.87 (36.19)    37.12 (38.14)    73.29 (76.73)   94.17 (97.21)
after (layer loop work)     34.78 (35.14)    34.12 (34.26)    74.95 (77.01)   93.99 (97.61)
                            35.91 (37.03)    34.96 (36.00)    74.65 (76.28)   96.79 (98.04)
==========================  ===============  ===============  ==============  ==============

Layer loop / unrolled on medians: 1.05-1.07 before, 0.97 after (the residual backward no
longer zero-pads a cotangent of the whole stacked output, 26 MB a step; residuals are
stored after their epilogue with heads merged; an output copied from a temp is written in
its place). Wall time at 2 threads was not measurable at that load (rounds swung 2x).

Threads: default 1 for every framework (``SHAPEGRAD_NUM_THREADS``, torch, XLA flags):
this box has 2 cores shared by several users, where OpenMP teams stall. Timings swing
+-25% run to run here: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--only", default="mlp,transformer,charlm")
ARGS.add_argument("--threads", type=int, default=1)
ARGS.add_argument("--mlp-depths", default="2,8,32,64")
ARGS.add_argument("--blocks", default="2,8,16")
ARGS.add_argument("--torch-compile", action="store_true")
OPTS = ARGS.parse_args()
os.environ["SHAPEGRAD_NUM_THREADS"] = str(OPTS.threads)
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="sg-depth-")  # cold compiles
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    if OPTS.threads == 1
    else "",
)

import numpy as np  # noqa: E402

import shapegrad as sg  # noqa: E402
from shapegrad.nn.transformer import BlockStack, block_init, transformer_stack  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from charlm_model import charlm_loss  # noqa: E402

VARIANTS = {"unrolled": (False, False), "loop": (True, False), "loop+remat": (True, True)}


def cpu_seconds() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def median_time(fn: Callable[[], Any], calls: int, rounds: int = 3) -> float:
    """Best over ``rounds`` of the median of ``calls`` calls (seconds)."""
    best = []
    for _ in range(rounds):
        ts = []
        for _ in range(calls):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        best.append(statistics.median(ts))
    return min(best)


def sg_row(loss: Callable[..., Any], args: tuple[Any, ...], calls: int) -> dict[str, Any]:
    fast = sg.compile(sg.value_and_grad(loss), backend="c")
    t0, c0 = time.perf_counter(), cpu_seconds()
    fast(*args)
    cold, cold_cpu = time.perf_counter() - t0, cpu_seconds() - c0
    stats = fast.stats(*args)
    step = median_time(lambda: fast(*args), calls)
    return {
        "cold": cold,
        "cold_cpu": cold_cpu,
        "step": step,
        "arena": stats.arena_bytes,
        "kernels": stats.kernels,
    }


def show(title: str, rows: list[tuple[str, dict[str, Any]]]) -> None:
    print(f"\n{title}")
    print(
        f"{'':>22} {'cold compile':>14} {'(cpu)':>8} {'warm step':>11} {'arena':>10} {'kernels':>8}"
    )
    for name, r in rows:
        arena = f"{r['arena'] / 1e6:.2f} MB" if r.get("arena") is not None else "-"
        kernels = str(r.get("kernels") or "-")
        cpu = f"{r['cold_cpu']:.2f}s" if r.get("cold_cpu") is not None else ""
        print(
            f"{name:>22} {r['cold']:>13.2f}s {cpu:>8} {r['step'] * 1e3:>9.3f}ms {arena:>10} {kernels:>8}"
        )


# --- MLP stacks -------------------------------------------------------------------------------


def mlp_layer(h: sg.Tensor, wb: tuple[sg.Tensor, sg.Tensor]) -> tuple[sg.Tensor, None]:
    return sg.tanh(h @ wb[0].T + wb[1]), None


def mlp_bench(depths: list[int]) -> None:
    rng = np.random.default_rng(0)
    for depth in depths:
        w = sg.tensor((rng.normal(size=(depth, 64, 64)) / 8).astype(np.float32))
        b = sg.tensor(np.zeros((depth, 64), np.float32))
        x = sg.tensor(rng.normal(size=(64, 64)).astype(np.float32))
        y = sg.tensor(rng.normal(size=(64, 64)).astype(np.float32))
        rows = []
        for name, (loop, remat) in VARIANTS.items():

            def loss(
                params: tuple[sg.Tensor, sg.Tensor],
                x: sg.Tensor,
                y: sg.Tensor,
                loop: bool = loop,
                remat: bool = remat,
            ) -> sg.Tensor:
                w, b = params
                if loop:
                    h, _ = sg.scan(
                        mlp_layer, x, (w, b), policy="recompute" if remat else "residuals"
                    )
                else:
                    h = x
                    for i in range(w.shape[0]):
                        h, _ = mlp_layer(h, (w[i], b[i]))
                return sg.mse(h, y)

            rows.append((name, sg_row(loss, ((w, b), x, y), 50)))
        rows += jax_mlp(w.numpy(), x.numpy(), y.numpy())
        show(f"MLP width 64, batch 64, {depth} layers (value_and_grad)", rows)


def jax_mlp(w: Any, x: Any, y: Any) -> list[tuple[str, dict[str, Any]]]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    b = np.zeros(w.shape[:2], np.float32)

    def make(remat: bool) -> Any:
        def layer(h: Any, wb: Any) -> Any:
            return jnp.tanh(h @ wb[0].T + wb[1]), None

        body = jax.checkpoint(layer) if remat else layer

        def loss(params: Any, x: Any, y: Any) -> Any:
            h, _ = jax.lax.scan(body, x, params)
            return jnp.mean((h - y) ** 2)

        return jax.jit(jax.value_and_grad(loss))

    rows = []
    for name, remat in (("jax scan", False), ("jax scan+checkpoint", True)):
        fn = make(remat)
        t0, c0 = time.perf_counter(), cpu_seconds()
        jax.block_until_ready(fn((w, b), x, y))
        cold, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        step = median_time(lambda fn=fn: jax.block_until_ready(fn((w, b), x, y)), 50)
        rows.append((name, {"cold": cold, "cold_cpu": cpu, "step": step}))
    return rows


# --- transformer stacks -------------------------------------------------------------------------


def transformer_bench(blocks: list[int]) -> None:
    rng = np.random.default_rng(1)
    for n in blocks:
        stack = BlockStack.init(block_init(), seed=0, layers=n, d=64, f=256)
        x = sg.tensor(rng.normal(size=(8, 32, 64)).astype(np.float32))
        rows = []
        for name, (loop, remat) in VARIANTS.items():

            def loss(
                params: Any, x: sg.Tensor, loop: bool = loop, remat: bool = remat
            ) -> sg.Tensor:
                out = transformer_stack(params, x, heads=4, causal=True, loop=loop, remat=remat)
                return (out * out).mean()

            rows.append((name, sg_row(loss, (stack, x), 10)))
        rows += jax_transformer([t.numpy() for t in stack], x.numpy())
        rows += torch_transformer([t.numpy() for t in stack], x.numpy(), OPTS.torch_compile)
        show(f"pre-LN transformer d 64, 4 heads, context 32, batch 8, {n} blocks", rows)


def jax_block(p: Any, x: Any, heads: int) -> Any:
    import jax
    import jax.numpy as jnp

    def ln(h: Any, w: Any, b: Any) -> Any:
        mu = h.mean(-1, keepdims=True)
        var = ((h - mu) ** 2).mean(-1, keepdims=True)
        return (h - mu) / jnp.sqrt(var + 1e-5) * w + b

    ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_1, b_1, w_2, b_2 = p
    bsz, t, d = x.shape
    qkv = ln(x, ln1_w, ln1_b) @ w_qkv.T + b_qkv
    q, k, v = (
        qkv[..., i * d : (i + 1) * d].reshape(bsz, t, heads, d // heads).transpose(0, 2, 1, 3)
        for i in range(3)
    )
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // heads)
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30)
    a = jax.nn.softmax(s, -1) @ v
    x = x + a.transpose(0, 2, 1, 3).reshape(bsz, t, d) @ w_o.T + b_o
    h = jax.nn.gelu(ln(x, ln2_w, ln2_b) @ w_1.T + b_1, approximate=True)
    return x + h @ w_2.T + b_2


def jax_transformer(params: list[Any], x: Any) -> list[tuple[str, dict[str, Any]]]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    rows = []
    for name, remat in (("jax scan", False), ("jax scan+checkpoint", True)):

        def layer(h: Any, p: Any) -> Any:
            return jax_block(p, h, 4), None

        body = jax.checkpoint(layer) if remat else layer

        def loss(p: Any, x: Any, body: Any = body) -> Any:
            h, _ = jax.lax.scan(body, x, p)
            return jnp.mean(h * h)

        fn = jax.jit(jax.value_and_grad(loss))
        t0, c0 = time.perf_counter(), cpu_seconds()
        jax.block_until_ready(fn(params, x))
        cold, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        step = median_time(lambda fn=fn: jax.block_until_ready(fn(params, x)), 10)
        rows.append((name, {"cold": cold, "cold_cpu": cpu, "step": step}))
    return rows


def torch_transformer(
    params: list[Any], x: Any, compile_: bool
) -> list[tuple[str, dict[str, Any]]]:
    try:
        import torch
    except ImportError:
        return []
    torch.set_num_threads(OPTS.threads)
    n, d = params[0].shape
    layers = []
    for _ in range(n):
        layer = torch.nn.TransformerEncoderLayer(
            d,
            4,
            params[8].shape[1],
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation=lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        )
        layers.append(layer)
    model = torch.nn.Sequential(*layers)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(x.shape[1])
    tx = torch.tensor(x)

    def step(m: Any) -> Any:
        h = tx
        for layer in m:
            h = layer(h, src_mask=mask, is_causal=True)
        loss = (h * h).mean()
        model.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    rows = [("torch eager", {"cold": 0.0, "step": median_time(lambda: step(model), 10)})]
    if compile_:
        compiled = torch.compile(lambda: step(model))
        t0 = time.perf_counter()
        compiled()
        rows.append(
            ("torch.compile", {"cold": time.perf_counter() - t0, "step": median_time(compiled, 10)})
        )
    return rows


# --- the charlm step ----------------------------------------------------------------------------


def charlm_bench() -> None:
    vocab, d, blocks, heads, t, bsz = 94, 128, 2, 4, 64, 32
    rng = np.random.default_rng(2)
    k = 10
    xs = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    ys = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    tok = (rng.normal(size=(vocab, d)) * 0.02).astype(np.float32)
    pos = (rng.normal(size=(t, d)) * 0.01).astype(np.float32)
    stack = BlockStack.init(block_init(0.02), seed=0, layers=blocks, d=d, f=4 * d)
    results: dict[str, list[float]] = {}

    # shapegrad: the examples/charlm.py model and loss, K steps per native call

    def make_loss(loop: bool) -> Any:
        return charlm_loss(blocks, heads, vocab, loop)

    trainers = {}
    for name, loop in (("shapegrad C (unrolled)", False), ("shapegrad C (layer loop)", True)):
        params = {
            "tokens": sg.tensor(tok),
            "positions": sg.tensor(pos),
            "blocks": stack,
            "ln_w": sg.ones(d),
            "ln_b": sg.zeros(d),
        }
        trainer = sg.ScalarTrainer(
            make_loss(loop), params, mode="compiled", backend="c", optimizer=sg.optim.AdamW(lr=1e-3)
        )
        t0 = time.perf_counter()
        trainer.step_many(xs, ys)
        print(f"{name}: first K={k} call (compile + run) {time.perf_counter() - t0:.2f} s")
        trainers[name] = trainer

    def runner(trainer: Any) -> Callable[[], None]:
        return lambda: trainer.step_many(xs, ys) is None or None

    runners: dict[str, Callable[[], None]] = {name: runner(tr) for name, tr in trainers.items()}
    runners.update(torch_charlm(tok, pos, stack, xs, ys, heads))
    runners.update(jax_charlm(tok, pos, stack, xs, ys, heads))
    # ``train_step.py --gpt --cpu-time``: CPU time of the process, one thread each (the
    # other processes' load then slows a step less than it delays its wall clock)
    cpu = bool(os.environ.get("SG_BENCH_CPU_TIME"))
    clock = time.process_time if cpu else time.perf_counter
    for _ in range(5):  # interleaved rounds: each framework sees the same machine load
        for name, run in runners.items():
            t0 = clock()
            run()
            results.setdefault(name, []).append((clock() - t0) / k)
    kind = "CPU time, one thread each" if cpu else "wall time"
    print(f"\ncharlm training step (d 128, 2 blocks, 4 heads, context 64, batch 32, AdamW; {kind})")
    base = {name: min(v) for name, v in results.items()}
    for name, best in base.items():
        print(
            f"{name:>28}: {best * 1e3:8.2f} ms/step (median {statistics.median(results[name]) * 1e3:.2f})"
        )


def torch_charlm(
    tok: Any, pos: Any, stack: Any, xs: Any, ys: Any, heads: int
) -> dict[str, Callable[[], None]]:
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(OPTS.threads)
    d = tok.shape[1]
    layers = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(
            d,
            heads,
            4 * d,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation=lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        )
        for _ in range(stack[0].shape[0])
    )
    emb = torch.nn.Parameter(torch.tensor(tok))
    positions = torch.nn.Parameter(torch.tensor(pos))
    final = torch.nn.LayerNorm(d)
    params = [emb, positions, *layers.parameters(), *final.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    t = xs.shape[2]
    mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
    txs, tys = torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)

    def run() -> None:
        for i in range(len(txs)):
            h = emb[txs[i]] + positions[:t]
            for layer in layers:
                h = layer(h, src_mask=mask, is_causal=True)
            logits = final(h) @ emb.T
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, emb.shape[0]), tys[i].reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return {"PyTorch eager": run}


def jax_charlm(
    tok: Any, pos: Any, stack: Any, xs: Any, ys: Any, heads: int
) -> dict[str, Callable[[], None]]:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return {}
    blocks = [t.numpy() for t in stack]
    params = {
        "tok": tok,
        "pos": pos,
        "blocks": blocks,
        "ln_w": np.ones(tok.shape[1], np.float32),
        "ln_b": np.zeros(tok.shape[1], np.float32),
    }

    def loss(p: Any, ids: Any, targets: Any) -> Any:
        h = p["tok"][ids] + p["pos"][: ids.shape[1]]
        h, _ = jax.lax.scan(lambda h, w: (jax_block(w, h, heads), None), h, p["blocks"])
        mu = h.mean(-1, keepdims=True)
        h = (h - mu) / jnp.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * p["ln_w"] + p[
            "ln_b"
        ]
        logits = h @ p["tok"].T
        logp = jax.nn.log_softmax(logits, -1)
        return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

    @jax.jit
    def step(p: Any, m: Any, v: Any, i: Any, ids: Any, targets: Any) -> Any:
        value, g = jax.value_and_grad(loss)(p, ids, targets)
        lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1**i, 1 - b2**i
        p = jax.tree.map(
            lambda p, m, v: p - lr * (m / c1 / (jnp.sqrt(v / c2) + eps) + wd * p), p, m, v
        )
        return p, m, v, value

    state = [params, jax.tree.map(np.zeros_like, params), jax.tree.map(np.zeros_like, params)]
    counter = [1]

    def run() -> None:
        for i in range(len(xs)):
            p, m, v, value = step(*state, float(counter[0]), xs[i], ys[i])
            state[:] = [p, m, v]
            counter[0] += 1
        jax.block_until_ready(value)

    t0 = time.perf_counter()
    run()
    print(f"JAX jit: first K call (compile + run) {time.perf_counter() - t0:.2f} s")
    return {"JAX jit": run}


if __name__ == "__main__":
    only = set(OPTS.only.split(","))
    print(f"threads {OPTS.threads}; cache {os.environ['XDG_CACHE_HOME']}; load {os.getloadavg()}")
    if "mlp" in only:
        mlp_bench([int(v) for v in OPTS.mlp_depths.split(",")])
    if "transformer" in only:
        transformer_bench([int(v) for v in OPTS.blocks.split(",")])
    if "charlm" in only:
        charlm_bench()
    sys.stdout.flush()
