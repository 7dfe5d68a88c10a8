"""In-process A/B of two C renderers on one lowered training step, under the same load.

Run:
    git worktree add --detach /tmp/base <commit>
    python benchmarks/threads_ab.py /tmp/base mlp [--rounds 60] [--background-load 2] [--jax]

The step of ``train_step.py``'s row (moons10, mlp, w1024, cnn, ...) is lowered once by
this tree; ``render_c`` of the base tree (``<base>/src/shapegrad/backends/c/render.py``)
and of this tree each render it, and both libraries are loaded into this process. Every
round runs each variant for ~20 ms, in alternating order, so a busy machine (other users,
``--background-load N`` busy processes) slows all variants alike; mean and median per
step are printed. Variants: base at the default and at one thread, this tree with the
adaptive team, the fixed full team and one thread, and ``jax.jit`` with ``--jax``.

Only the C source differs between the variants (lowering is this tree's), so the base
renderer must accept this tree's loop IR.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import shapegrad as sg
from shapegrad.backends.base import CompileOptions
from shapegrad.backends.c import c_target
from shapegrad.backends.c.executable import CExecutable, load_library, num_threads
from shapegrad.backends.c.render import render_c, uses_blas
from shapegrad.backends.c.toolchain import has_vector_math, library_for, make_spec
from shapegrad.compiler.pipeline import lower_program

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as T


def base_renderer(tree: str) -> Callable[..., str]:
    path = os.path.join(tree, "src", "shapegrad", "backends", "c", "render.py")
    spec = importlib.util.spec_from_file_location("base_render", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["base_render"] = module
    spec.loader.exec_module(module)
    render: Callable[..., str] = module.render_c
    return render


def build(graph: Any, render: Callable[..., str], label: str, threads: int, policy: int) -> Any:
    """A bound step of ``graph`` rendered by ``render``; ``sg_set_threads(threads, policy)``
    (a base library without the policy argument ignores it)."""
    program, _ = lower_program(graph, c_target(CompileOptions()), label)
    vector_math = has_vector_math()
    spec = make_spec(render(program, False, vector_math), uses_blas(program), vector_math)
    path, _ = library_for(spec)
    lib = load_library(path, spec.key)
    lib.sg_set_threads(threads, policy)
    return CExecutable(graph, program, lib, path)


def jax_step(w: dict[str, Any], name: str) -> Callable[[], None] | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None

    def loss(params: list[Any], x: Any, y: Any) -> Any:
        if name == "cnn":
            dn = ("NCHW", "OIHW", "NCHW")
            h = x
            for i in (0, 2):
                h = jax.lax.conv_general_dilated(h, params[i], (1, 1), "SAME", dimension_numbers=dn)
                h = jax.nn.relu(h + params[i + 1].reshape(1, -1, 1, 1))
            out = h.mean((2, 3)) @ params[4] + params[5]
        else:
            h = x
            for i in range(0, len(params) - 2, 2):
                h = jax.nn.relu(h @ params[i] + params[i + 1])
            out = h @ params[-2] + params[-1]
        if name == "moons":
            return jax.nn.relu(1 - y * out[:, 0]).mean()
        logp = jax.nn.log_softmax(out)
        return -jnp.take_along_axis(logp, y[:, None], axis=1).mean()

    @jax.jit
    def step(params: list[Any], x: Any, y: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return [p - T.LR * g for p, g in zip(params, grads, strict=True)], value

    state = {"p": [jnp.asarray(p) for p in w["params"]]}
    x, y = jnp.asarray(w["xs"][0]), jnp.asarray(w["ys"][0])

    def run() -> None:
        state["p"], value = step(state["p"], x, y)
        value.block_until_ready()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="source tree whose render.py is the baseline")
    parser.add_argument("row", help="a train_step.py row: moons10, mlp, w1024, cnn, ...")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--background-load", type=int, default=0, metavar="N")
    parser.add_argument("--jax", action="store_true")
    args = parser.parse_args()
    name, batch, k = T.ROWS[args.row]
    w = T.workload(name, batch, k)
    step = T.sgd_step(w["loss"])
    graph = sg.compile(step, backend="numpy", donate_argnums=0).graph(
        w["params"], w["xs"][0], w["ys"][0]
    )
    base, n = base_renderer(args.base), num_threads()
    specs = {
        "base": (base, n, 0),
        "base 1 thread": (base, 1, 0),
        "adaptive team": (render_c, n, 1),
        "full team": (render_c, n, 0),
        "1 thread": (render_c, 1, 0),
    }
    x, y = w["xs"][0], w["ys"][0]
    runs: dict[str, Callable[[], Any]] = {}
    for label, (render, threads, policy) in specs.items():
        bound = build(graph, render, f"ab_{label.replace(' ', '_')}", threads, policy).bind(
            [p.copy() for p in w["params"]]
        )
        runs[label] = lambda bound=bound: bound(x, y)
    if args.jax and (jax_run := jax_step(w, name)) is not None:
        runs["JAX jit"] = jax_run
    for run in runs.values():
        for _ in range(3):
            run()
    t0 = time.perf_counter()
    runs["1 thread"]()
    calls = max(1, int(0.02 / (time.perf_counter() - t0)))
    code = "while True:\n    pass"
    busy = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(args.background_load)]
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {label: [] for label in runs}
    try:
        for r in range(args.rounds):
            items = list(runs.items())
            for label, run in items if r % 2 == 0 else items[::-1]:
                t0 = time.perf_counter()
                for _ in range(calls):
                    run()
                times[label].append((time.perf_counter() - t0) / calls)
    finally:
        for proc in busy:
            proc.kill()
    print(
        f"{args.row}: {n} threads, {args.background_load} busy processes, load average "
        f"{load:.2f} -> {os.getloadavg()[0]:.2f}; {args.rounds} rounds of {calls} calls"
    )
    for label, ts in times.items():
        mean, median = statistics.mean(ts) * 1e3, statistics.median(ts) * 1e3
        print(f"  {label:14s} mean {mean:8.3f} ms   median {median:8.3f} ms")


if __name__ == "__main__":
    main()
