"""Default threads vs one thread vs the full team, in steady state, under the same load.

Run:
    python benchmarks/threads_ab.py [--rows moons10,mlp,w1024,cnn,gpt,gptloop]
        [--warmup 200] [--steps 200] [--background-load 2] [--base TREE] [--jax] [--aa]

Per row (``train_step.py``'s moons10, mlp (784-512-512-10 b128), w1024, cnn (b64), plus
``gpt``: the charlm step of ``depth.py``, d 128, 2 blocks, 4 heads, context 64, batch 32,
unrolled, and ``gptloop``: the same as one layer loop, SGD instead of AdamW), one SGD step
is lowered once and built three times (distinct program names, so distinct libraries),
each loaded into this process:

* ``default``: ``sg_set_threads(n, 1)``, the adaptive team (what users get);
* ``full team``: ``sg_set_threads(n, 0)``;
* ``1 thread``: ``sg_set_threads(1, 0)`` (what ``SHAPEGRAD_NUM_THREADS=1`` gives).

``--background-load N`` busy processes start *before* the warm-up, so the adaptive choice
settles under the load it is measured under. Every variant first runs ``--warmup`` steps,
then ``--steps`` more are timed; both phases go in interleaved rounds of ~20 ms per variant
(a random order each round), so a busy machine slows every variant alike. Printed: median and mean
per step, the share of region calls the default ran on one thread during the timed phase
(when the library reports it), and ``default / best`` where best is the faster median of
``1 thread`` and ``full team`` (and the same of the means: on a busy box a round can lose
its CPU for tens of milliseconds, which the median hides and the mean shows). The load
average (1 minute) is printed before and after.

Each ratio of means also gets a 95% bootstrap interval over the rounds, resampled
together (round ``r`` of every variant ran back to back, so the pairing cancels the
load's swings): the target "within 1.1x" holds where the interval's top is under 1.1.

``--aa`` adds a second copy of ``1 thread`` (its own library, the same code) and prints
its median over the first's: the noise floor of this run. Under load on a 2-core machine
two copies read up to 1.6x apart (GPT, 2 busy processes, 300 steps), so a ``default /
best`` off by less than the floor says nothing.

``--tune FIELD=VALUE`` (repeatable) adds the three variants rendered with that field of
the target's ``CTuning`` replaced (e.g. ``split_parts=2``: more, smaller product blocks).
``--base TREE`` adds the same three variants rendered by another source tree's
``render.py`` (``git worktree add --detach /tmp/base <commit>``); only the C source differs
(lowering is this tree's), so the base renderer must accept this tree's loop IR.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.backends.base import CompileOptions
from shapegrad.backends.c import c_target, compile_units, load
from shapegrad.backends.c import render as this_render
from shapegrad.backends.c.executable import CExecutable, num_threads
from shapegrad.backends.c.manifest import RuntimeInfo
from shapegrad.backends.c.options import COptions
from shapegrad.backends.c.toolchain import has_vector_math
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import CTuning
from shapegrad.nn.transformer import BlockStack, block_init

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_step as T
from charlm_model import charlm_loss

DEFAULT_ROWS = "moons10,mlp,w1024,cnn,gpt"

# counters of the adaptive choice (runtime.h), read through a cdef of their own so a base
# library without them still loads
_COUNTS_CDEF = "void sg_team_counts(unsigned long long *out);"


def base_render(tree: str) -> ModuleType:
    path = os.path.join(tree, "src", "shapegrad", "backends", "c", "render.py")
    spec = importlib.util.spec_from_file_location("base_render", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["base_render"] = module
    spec.loader.exec_module(module)
    return module


def gpt_workload(loop: bool, k: int = 1) -> dict[str, Any]:
    """``depth.py``'s charlm model as a flat parameter list (SGD step)."""
    vocab, d, blocks, heads, t, bsz = 94, 128, 2, 4, 64, 32
    rng = np.random.default_rng(2)
    stack = BlockStack.init(block_init(0.02), seed=0, layers=blocks, d=d, f=4 * d)
    params = [
        (rng.normal(size=(vocab, d)) * 0.02).astype(np.float32),
        (rng.normal(size=(t, d)) * 0.01).astype(np.float32),
        *[np.asarray(p.numpy()) for p in stack],
        np.ones(d, np.float32),
        np.zeros(d, np.float32),
    ]
    inner = charlm_loss(blocks, heads, vocab, loop)

    def loss(p: list[sg.Tensor], ids: sg.Tensor, targets: sg.Tensor) -> sg.Tensor:
        tree = {"tokens": p[0], "positions": p[1], "blocks": list(p[2:14])}
        tree.update({"ln_w": p[14], "ln_b": p[15]})
        out: sg.Tensor = inner(tree, ids, targets)
        return out

    xs = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    ys = rng.integers(0, vocab, size=(k, bsz, t)).astype(np.int32)
    return {"params": params, "xs": xs, "ys": ys, "loss": loss}


def workload(row: str) -> dict[str, Any]:
    if row in ("gpt", "gptloop"):
        return gpt_workload(row == "gptloop")
    name, batch, k = T.ROWS[row]
    return T.workload(name, batch, k)


def build(
    graph: Any,
    render: ModuleType,
    label: str,
    threads: int,
    policy: int,
    tune: dict[str, int] | None = None,
) -> Any:
    """A step of ``graph`` rendered by ``render`` as the backend would (translation units),
    loaded, with ``sg_set_threads(threads, policy)``; ``tune`` replaces fields of the
    target's ``CTuning`` for rendering."""
    program, _ = lower_program(graph, c_target(CompileOptions()), label)
    if tune:
        tuning = dataclasses.replace(this_render.c_tuning(), **tune)
        units = render.render_c_units(program, False, has_vector_math(), tuning=tuning)
    else:
        units = render.render_c_units(program, False, has_vector_math())
    library = compile_units([(u.name, u.source) for u in units], program, COptions())
    lib = load(library)
    lib.sg_set_threads(threads, policy)
    info = RuntimeInfo.of(program, library.key)
    return CExecutable(graph, info, lib, library.path, program)


def team_counts(path: str) -> Callable[[], tuple[int, int]] | None:
    """(region calls, calls that ran on one thread) of the library at ``path``, if it
    counts them."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(_COUNTS_CDEF)
    lib = ffi.dlopen(path)
    try:
        fn = lib.sg_team_counts
    except AttributeError:
        return None
    out = ffi.new("unsigned long long[2]")

    def read() -> tuple[int, int]:
        fn(out)
        return int(out[0]), int(out[1])

    return read


def jax_step(w: dict[str, Any], name: str) -> Callable[[], None] | None:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    if name.startswith("gpt"):
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
        if name.startswith("moons"):
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


def rounds(runs: dict[str, Callable[[], Any]], calls: int, steps: int) -> dict[str, list[float]]:
    """Interleaved rounds of ``calls`` calls per variant until each has run ``steps`` steps;
    seconds per step of each round, per variant. Each round runs the variants in a fresh
    random order (seeded): under load a variant's place in the round biases it (with a
    fixed order alternating forward and back, two copies of one library read 0.81-0.86x
    apart on GPT under two busy processes), and a random place averages that out."""
    times: dict[str, list[float]] = {label: [] for label in runs}
    items = list(runs.items())
    order = np.random.default_rng(0)
    r = 0
    while r * calls < steps:
        for k in order.permutation(len(items)):
            label, run = items[k]
            t0 = time.perf_counter()
            for _ in range(calls):
                run()
            times[label].append((time.perf_counter() - t0) / calls)
        r += 1
    return times


def measure(row: str, args: argparse.Namespace, base: ModuleType | None) -> dict[str, float]:
    w = workload(row)
    step = T.sgd_step(w["loss"])
    x, y = w["xs"][0], w["ys"][0]
    graph = sg.compile(step, backend="numpy", donate_argnums=0).graph(w["params"], x, y)
    n = num_threads()
    renders: list[tuple[str, ModuleType, dict[str, int] | None]] = [("", this_render, None)]
    if base is not None:
        renders.append(("base ", base, None))
    for field, value in args.tune:
        renders.append((f"{field}={value} ", this_render, {field: value}))
    runs: dict[str, Callable[[], Any]] = {}
    counters: dict[str, Callable[[], tuple[int, int]] | None] = {}
    for prefix, render, tune in renders:
        variants = [("default", n, 1), ("full team", n, 0), ("1 thread", 1, 0)]
        if args.aa and not prefix:
            variants.append(("1 thread (A/A)", 1, 0))
        for label, threads, policy in variants:
            name = f"{prefix}{label}"
            tag = "".join(c if c.isalnum() else "_" for c in name)
            exe = build(graph, render, f"ab_{row}_{tag}", threads, policy, tune)
            bound = exe.bind([p.copy() for p in w["params"]])
            runs[name] = lambda bound=bound: bound(x, y)
            counters[name] = team_counts(exe.source_path) if label == "default" else None
    if args.jax and (jax_run := jax_step(w, row)) is not None:
        runs["JAX jit"] = jax_run
    t0 = time.perf_counter()
    runs["1 thread"]()
    calls = max(1, int(0.02 / max(time.perf_counter() - t0, 1e-7)))
    rounds(runs, calls, args.warmup)
    before = {k: c() for k, c in counters.items() if c is not None}
    load = os.getloadavg()[0]
    times = rounds(runs, calls, args.steps)
    medians = {label: statistics.median(ts) for label, ts in times.items()}
    best = min(medians["1 thread"], medians["full team"])
    print(
        f"{row}: {n} threads, load average {load:.2f} -> {os.getloadavg()[0]:.2f}; "
        f"{args.warmup} warm-up + {len(times['1 thread']) * calls} timed steps per variant"
    )
    for label, ts in times.items():
        extra = ""
        if (count := counters.get(label)) is not None:
            total, solo = (a - b for a, b in zip(count(), before[label], strict=True))
            extra = f"   one thread in {solo}/{total} region calls" if total else ""
        print(
            f"  {label:16s} median {medians[label] * 1e3:9.3f} ms   "
            f"mean {statistics.mean(ts) * 1e3:9.3f} ms{extra}"
        )
    means = {label: statistics.mean(ts) for label, ts in times.items()}
    best_mean = min(means["1 thread"], means["full team"])
    ratio, ratio_mean = medians["default"] / best, means["default"] / best_mean
    print(f"  default / best = {ratio:.3f} (medians), {ratio_mean:.3f} (means)", flush=True)
    print(f"  default / best of the means, {interval(times, 'default', ('1 thread', 'full team'))}")
    floor = None
    if "1 thread (A/A)" in medians:
        floor = max(medians["1 thread (A/A)"], medians["1 thread"]) / min(
            medians["1 thread (A/A)"], medians["1 thread"]
        )
        print(f"  A/A: two copies of 1 thread {floor:.3f} apart (the noise floor)", flush=True)
        print(f"  A/A of the means, {interval(times, '1 thread (A/A)', ('1 thread',))}")
    return {
        "default": medians["default"],
        "best": best,
        "load": load,
        "mean": ratio_mean,
        "floor": floor if floor is not None else float("nan"),
    }


def paired_interval(
    times: dict[str, list[float]], label: str, others: tuple[str, ...], draws: int = 2000
) -> tuple[float, float]:
    """95% bootstrap interval of ``mean(label) / min(mean(o) for o in others)``, rounds
    resampled *together* (round ``r`` of every variant ran back to back, under the same
    load: the pairing cancels the load's swings, which a variant's own spread does not)."""
    rows = np.array([times[k] for k in (label, *others)])  # [variants, rounds]
    rng = np.random.default_rng(0)
    picks = rng.integers(0, rows.shape[1], size=(draws, rows.shape[1]))
    means = rows[:, picks].mean(axis=2)  # [variants, draws]
    ratios = np.sort(means[0] / means[1:].min(axis=0))
    return float(ratios[int(0.025 * draws)]), float(ratios[int(0.975 * draws) - 1])


# Fewest rounds a bootstrap interval is printed for (a fast step runs a few long rounds).
MIN_ROUNDS = 10


def interval(times: dict[str, list[float]], label: str, others: tuple[str, ...]) -> str:
    """``paired_interval`` as text, or why there is none."""
    rounds_run = len(times[label])
    if rounds_run < MIN_ROUNDS:
        return f"no interval: {rounds_run} rounds (raise --steps)"
    lo, hi = paired_interval(times, label, others)
    return f"95% interval over {rounds_run} rounds: [{lo:.3f}, {hi:.3f}]"


def tune_arg(text: str) -> tuple[str, int]:
    field, _, value = text.partition("=")
    names = {f.name for f in dataclasses.fields(CTuning)}
    if field not in names or not value.lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(
            f"--tune {text!r}: FIELD=INT, FIELD one of {sorted(names)}"
        )
    return field, int(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help=f"default {DEFAULT_ROWS}")
    parser.add_argument("--warmup", type=int, default=200, help="steps before timing")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per variant")
    parser.add_argument("--background-load", type=int, default=0, metavar="N")
    parser.add_argument("--base", help="source tree whose render.py is also measured")
    parser.add_argument(
        "--tune",
        type=tune_arg,
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="also measure the variants rendered with this CTuning field (repeatable)",
    )
    parser.add_argument("--jax", action="store_true")
    parser.add_argument(
        "--aa", action="store_true", help="also a second copy of 1 thread: the noise floor"
    )
    args = parser.parse_args()
    base = base_render(args.base) if args.base else None
    code = "while True:\n    pass"
    busy = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(args.background_load)]
    table: dict[str, dict[str, float]] = {}
    try:
        for row in args.rows.split(","):
            table[row] = measure(row, args, base)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    print(f"\n{args.background_load} busy processes; default / best (median per step; means):")
    for row, m in table.items():
        floor = "" if math.isnan(m["floor"]) else f", A/A {m['floor']:.3f}"
        print(
            f"  {row:10s} {m['default'] / m['best']:6.3f}  {m['mean']:6.3f}   (default "
            f"{m['default'] * 1e3:.3f} ms, best {m['best'] * 1e3:.3f} ms, load {m['load']:.2f}"
            f"{floor})"
        )


if __name__ == "__main__":
    main()
