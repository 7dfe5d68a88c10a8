"""Compile time: cold (empty cache) and warm-cache first calls, next to JAX jit's first call.

Run: ``python benchmarks/compile_time.py [--only mlp64,gpt] [--rounds 3] [--threads 1]``
A/B of two source trees, interleaved: ``git worktree add /tmp/base main`` and
``python benchmarks/compile_time.py --trees /tmp/base,.``

Workloads (the targets of issue #12):

* ``mlp64``: ``sg.value_and_grad`` of a 64-layer MLP (width 64, batch 64, tanh, MSE; a
  Python loop, as ``benchmarks/depth.py``'s unrolled row), compiled for C;
* ``gpt``: the charlm training step through ``ScalarTrainer`` (vocab 65, context 64,
  d_model 128, 4 heads, 2 pre-LN blocks, GELU 4x, batch 32, cross-entropy, AdamW 3e-4).

Every measurement is a fresh Python process (imports are not counted; the first call is:
trace + compile + one run):

* ``sg cold``: an empty temporary ``XDG_CACHE_HOME``;
* ``sg warm``: the same cache directory, now populated, in a new process;
* ``JAX first``: ``jax.jit`` of the same math (the same Python loop; AdamW written out),
  first call, no persistent compilation cache.

The shapegrad columns split the first call: ``trace`` (Python tracing), ``optimize``
(graph passes), ``lower`` (loop pipeline), ``render`` (C source), ``cc`` (compile + link,
or the object/library cache), ``load`` (``dlopen`` + executable), ``manifest`` (keyed
cache lookup on a warm hit), ``run`` (the rest of the first call: the step itself and
Python around it); ``cc cpu`` is the CPU time of the compiler processes (what the machine's
load does not change much, unlike the wall-clock ``cc``). Rounds are interleaved (cold, warm, JAX, cold, ...) so every kind
sees the same machine load; the table shows the median per column and the spread of the
total. On a shared machine compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --- the child processes ------------------------------------------------------------------

_SG_COMMON = r"""
import json, os, resource, sys, time
import numpy as np
import shapegrad as sg
import shapegrad.jit as jit
from shapegrad.backends import native
from shapegrad.backends.c import toolchain

LOWERED = []
_orig = jit.Compiled._lower
def _record(self, *a, **k):
    lowered = _orig(self, *a, **k)
    if not any(x is lowered for x in LOWERED):
        LOWERED.append(lowered)
    return lowered
jit.Compiled._lower = _record

def report(total):
    parts = {"trace": 0.0, "optimize": 0.0}
    hits = []
    for lw in LOWERED:
        parts["trace"] += lw.trace_seconds
        parts["optimize"] += lw.optimize_seconds
        for name, sec in getattr(lw.executable, "phase_seconds", {}).items():
            parts[name] = parts.get(name, 0.0) + sec
        hits.append(getattr(lw, "from_cache", False))  # older trees: no keyed cache
    parts["run"] = total - sum(parts.values())
    parts["total"] = total
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    parts["cc cpu"] = kids.ru_utime + kids.ru_stime  # the compiler processes' CPU seconds
    print("RESULT " + json.dumps({"parts": parts, "hits": hits, "cc_runs": native.compile_count}))
"""

_SG_MLP = r"""
depth = 64
rng = np.random.default_rng(0)
w = (rng.normal(size=(depth, 64, 64)) / 8).astype(np.float32)
b = np.zeros((depth, 64), np.float32)
x = rng.normal(size=(64, 64)).astype(np.float32)
y = rng.normal(size=(64, 64)).astype(np.float32)

def loss(params, x, y):
    w, b = params
    h = x
    for i in range(w.shape[0]):
        h = sg.tanh(h @ w[i].T + b[i])
    return sg.mse(h, y)

fast = sg.compile(sg.value_and_grad(loss), backend="c")
t0 = time.perf_counter()
value, grads = fast((w, b), x, y)
report(time.perf_counter() - t0)
"""

_SG_GPT = r"""
from shapegrad.nn.transformer import BlockStack, block_init, embed, transformer_block
vocab, d, blocks, heads, t, bsz = 65, 128, 2, 4, 64, 32
rng = np.random.default_rng(2)
ids = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)
targets = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)
tok = (rng.normal(size=(vocab, d)) * 0.02).astype(np.float32)
pos = (rng.normal(size=(t, d)) * 0.01).astype(np.float32)
stack = BlockStack.init(block_init(0.02), seed=0, layers=blocks, d=d, f=4 * d)

def loss(p, ids, targets):
    h = embed(p["tokens"], p["positions"], ids)
    for i in range(blocks):
        h = transformer_block([w[i] for w in p["blocks"]], h, heads, causal=True)
    h = sg.layer_norm(h, p["ln_w"], p["ln_b"])
    logits = h @ p["tokens"].T
    return sg.cross_entropy(logits.reshape((-1, vocab)), targets.reshape((-1,)))

params = {"tokens": sg.tensor(tok), "positions": sg.tensor(pos), "blocks": stack,
          "ln_w": sg.ones(d), "ln_b": sg.zeros(d)}
trainer = sg.ScalarTrainer(loss, params, mode="compiled", backend="c",
                           optimizer=sg.optim.AdamW(lr=3e-4))
t0 = time.perf_counter()
trainer.step(ids, targets)
report(time.perf_counter() - t0)
"""

_JAX_COMMON = r"""
import json, time
import numpy as np
import jax
import jax.numpy as jnp
"""

_JAX_MLP = r"""
depth = 64
rng = np.random.default_rng(0)
w = (rng.normal(size=(depth, 64, 64)) / 8).astype(np.float32)
b = np.zeros((depth, 64), np.float32)
x = rng.normal(size=(64, 64)).astype(np.float32)
y = rng.normal(size=(64, 64)).astype(np.float32)

def loss(p, x, y):
    w, b = p
    h = x
    for i in range(depth):
        h = jnp.tanh(h @ w[i].T + b[i])
    return jnp.mean((h - y) ** 2)

step = jax.jit(jax.value_and_grad(loss))
t0 = time.perf_counter()
jax.block_until_ready(step((w, b), x, y))
total = time.perf_counter() - t0
print("RESULT " + json.dumps({"parts": {"total": total}}))
"""

_JAX_GPT = r"""
vocab, d, blocks, heads, t, bsz = 65, 128, 2, 4, 64, 32
rng = np.random.default_rng(2)
ids = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)
targets = rng.integers(0, vocab, size=(bsz, t)).astype(np.int32)

def init(shape, std):
    return (rng.normal(size=shape) * std).astype(np.float32)

def block_params():
    o, z = np.ones, np.zeros
    return [o(d, np.float32), z(d, np.float32), init((3 * d, d), 0.02), z(3 * d, np.float32),
            init((d, d), 0.02), z(d, np.float32), o(d, np.float32), z(d, np.float32),
            init((4 * d, d), 0.02), z(4 * d, np.float32), init((d, 4 * d), 0.02), z(d, np.float32)]

params = {"tok": init((vocab, d), 0.02), "pos": init((t, d), 0.01),
          "blocks": [block_params() for _ in range(blocks)],
          "ln_w": np.ones(d, np.float32), "ln_b": np.zeros(d, np.float32)}

def ln(h, w, b):
    mu = h.mean(-1, keepdims=True)
    var = ((h - mu) ** 2).mean(-1, keepdims=True)
    return (h - mu) / jnp.sqrt(var + 1e-5) * w + b

def block(p, x):
    ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w_1, b_1, w_2, b_2 = p
    n, tt, dd = x.shape
    qkv = ln(x, ln1_w, ln1_b) @ w_qkv.T + b_qkv
    q, k, v = (qkv[..., i * dd:(i + 1) * dd].reshape(n, tt, heads, dd // heads)
               .transpose(0, 2, 1, 3) for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dd // heads)
    s = jnp.where(jnp.tril(jnp.ones((tt, tt), bool)), s, -1e30)
    a = jax.nn.softmax(s, -1) @ v
    x = x + a.transpose(0, 2, 1, 3).reshape(n, tt, dd) @ w_o.T + b_o
    h = jax.nn.gelu(ln(x, ln2_w, ln2_b) @ w_1.T + b_1, approximate=True)
    return x + h @ w_2.T + b_2

def loss(p, ids, targets):
    h = p["tok"][ids] + p["pos"][: ids.shape[1]]
    for bp in p["blocks"]:
        h = block(bp, h)
    logits = ln(h, p["ln_w"], p["ln_b"]) @ p["tok"].T
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, targets[..., None], -1).mean()

@jax.jit
def step(p, m, v, i, ids, targets):
    value, g = jax.value_and_grad(loss)(p, ids, targets)
    lr, b1, b2, eps, wd = 3e-4, 0.9, 0.999, 1e-8, 0.01
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    c1, c2 = 1 - b1**i, 1 - b2**i
    p = jax.tree.map(lambda p, m, v: p - lr * (m / c1 / (jnp.sqrt(v / c2) + eps) + wd * p), p, m, v)
    return p, m, v, value

zeros = jax.tree.map(np.zeros_like, params)
t0 = time.perf_counter()
jax.block_until_ready(step(params, zeros, zeros, 1.0, ids, targets))
total = time.perf_counter() - t0
print("RESULT " + json.dumps({"parts": {"total": total}}))
"""

WORKLOADS = {"mlp64": (_SG_MLP, _JAX_MLP), "gpt": (_SG_GPT, _JAX_GPT)}
COLUMNS = ["trace", "optimize", "manifest", "lower", "render", "cc", "load", "run", "cc cpu"]


def run_child(code: str, cache: str, threads: int, src: str) -> dict[str, object]:
    env = dict(os.environ, XDG_CACHE_HOME=cache, SHAPEGRAD_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    if threads == 1:
        env.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    if out.returncode != 0:
        raise RuntimeError(f"child failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result: dict[str, object] = json.loads(line[len("RESULT ") :])
    return result


def has_jax() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True)
    return probe.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp64,gpt")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-jax", action="store_true")
    parser.add_argument(
        "--trees",
        default=str(ROOT),
        help="comma-separated source trees to compare, interleaved (e.g. a `git worktree "
        "add /tmp/base main` checkout and .); each tree's src/ is imported",
    )
    opts = parser.parse_args()
    jax_ok = not opts.no_jax and has_jax()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"load average at start {load:.2f}; {opts.rounds} interleaved rounds, {opts.threads} thread(s)"
    )
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    hits: dict[tuple[str, str], list[object]] = {}
    trees = [str(Path(t).resolve()) for t in opts.trees.split(",")]
    label = {t: (f"[{n}] " if len(trees) > 1 else "") for n, t in enumerate(trees)}
    for n, tree in enumerate(trees):
        print(f"[{n}] {tree}" if len(trees) > 1 else f"tree {tree}")
    for _ in range(opts.rounds):
        for name in opts.only.split(","):
            sg_code, jax_code = WORKLOADS[name]
            for tree in trees:
                src = os.path.join(tree, "src")
                with tempfile.TemporaryDirectory(prefix="sg-compile-time-") as cache:
                    for kind in ("sg cold", "sg warm"):
                        result = run_child(_SG_COMMON + sg_code, cache, opts.threads, src)
                        row = (name, label[tree] + kind)
                        rows.setdefault(row, []).append(result["parts"])  # type: ignore[arg-type]
                        hits.setdefault(row, []).append((result["hits"], result["cc_runs"]))
            if jax_ok:
                with tempfile.TemporaryDirectory(prefix="sg-compile-time-") as cache:
                    result = run_child(_JAX_COMMON + jax_code, cache, opts.threads, trees[0])
                rows.setdefault((name, "JAX first"), []).append(result["parts"])  # type: ignore[arg-type]
    end_load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average at end {end_load:.2f}\n")
    head = f"{'workload':<8} {'kind':<14} {'total s':>8} {'(min-max)':>13}"
    print(head + "".join(f" {c:>8}" for c in COLUMNS) + "  keyed hit / cc runs")
    for (name, kind), results in rows.items():
        totals = [r["total"] for r in results]
        line = f"{name:<8} {kind:<14} {statistics.median(totals):>8.3f} "
        line += f"{f'{min(totals):.2f}-{max(totals):.2f}':>13}"
        for column in COLUMNS:
            values = [r[column] for r in results if column in r]
            line += f" {statistics.median(values):>8.3f}" if values else f" {'-':>8}"
        note = hits.get((name, kind))
        if note:
            line += f"  {note[0][0]} / {note[0][1]}"
        print(line)


if __name__ == "__main__":
    main()
