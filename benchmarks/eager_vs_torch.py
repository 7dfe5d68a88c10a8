"""Eager training steps side by side: shapegrad eager with native kernels, shapegrad eager on
NumPy alone (``SHAPEGRAD_EAGER_KERNELS=0``'s path), and PyTorch eager, on four models.

Workloads (float32, the same initial weights and batch in every framework):

* ``cnn``: train_step.py's CNN b64 (two 3x3 convolutions 1-16-32 through ``sg.conv2d``,
  ReLU, global average pool, linear 10, cross-entropy, SGD);
* ``gpt``: the charlm model (charlm_model.py: d 128, 2 pre-LN blocks, 4 heads, context 64,
  batch 32, AdamW) through ``ScalarTrainer(mode="eager")``;
* ``unet`` and ``llama``: examples/unet.py and examples/llama.py through
  ``ScalarTrainer(mode="eager")`` (examples_time.py's sizes; PyTorch: tests/torch_models.py).

All runners live in one process and are timed in interleaved rounds (each round runs every
runner of a workload once for a few steps), so background load hits them alike; the table
gives the median over rounds of the mean step time, and ratios of those medians. Every
framework runs ``--threads`` threads (default 1: OpenBLAS through NumPy, the C kernels'
team, PyTorch's intra-op pool). The native column's first two steps compile its kernels
(a key compiles on its second sighting, its VJP on its first backward) or, with a warm
disk cache, trace and load them: they are printed apart ("warm-up") and not timed in the
table; ``--cold`` starts from an empty cache. Kernels compile in the background (the
op runs on NumPy meanwhile), so the warm-up waits for them (``CKernels.drain``) before the
timed rounds.

``--cold-start`` prints the cold-start table instead: what a new user's first steps cost.
Each (workload, variant) runs in a fresh process over an empty kernel cache (a temporary
``SHAPEGRAD_CACHE_DIR``), shapegrad eager alone, and reports the time of its first 1, 5
and 20 steps (cumulative), its slowest step (the stall), the steady step time once every
kernel is ready (median of ``--steady`` steps) and the kernels compiled. Variants
(``--cold-modes``): ``numpy`` (``SHAPEGRAD_EAGER_KERNELS=0``: no compile at all),
``sync`` (compiles in the foreground: the step that needs a kernel waits for it, as before
background compiles), ``background`` (the default); ``--baseline-src DIR`` adds ``base``,
shapegrad imported from ``DIR`` (e.g. an export of main's ``src``) with its defaults.
Rounds (``--rounds``) interleave the variants.

Run: python benchmarks/eager_vs_torch.py [--only cnn,gpt] [--rounds 5]
                                         [--threads 1] [--background-load 2]
     python benchmarks/eager_vs_torch.py --cold-start [--rounds 2] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--only", default="cnn,gpt,unet,llama")
ARGS.add_argument("--rounds", type=int, default=5)
ARGS.add_argument("--steps", type=int, default=3, help="steps per runner per round")
ARGS.add_argument("--threads", type=int, default=1)
ARGS.add_argument("--background-load", type=int, default=0, metavar="N")
ARGS.add_argument("--cold", action="store_true", help="an empty kernel cache (compile all)")
ARGS.add_argument("--cold-start", action="store_true", help="the cold-start table (see above)")
ARGS.add_argument("--cold-modes", default="numpy,sync,background")
ARGS.add_argument("--cold-steps", type=int, default=20)
ARGS.add_argument("--steady", type=int, default=15, help="steps timed for the steady state")
ARGS.add_argument("--baseline-src", default="", metavar="DIR")
ARGS.add_argument("--child", default="", help=argparse.SUPPRESS)  # one cold run (internal)
OPTS = ARGS.parse_args()
if OPTS.cold:
    _empty = tempfile.mkdtemp(prefix="sg-eager-cold-")
    os.environ["XDG_CACHE_HOME"] = os.environ["SHAPEGRAD_CACHE_DIR"] = _empty
for _var in ("SHAPEGRAD_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = str(OPTS.threads)
# The CNN's convolutions are sg.conv2d (as PyTorch's are F.conv2d), not train_step.py's
# hand-written im2col (pad, slices, stack, einsum): a composite the kernels can fuse.
os.environ.setdefault("SHAPEGRAD_BENCH_CONV", "auto")

import numpy as np  # noqa: E402

import shapegrad as sg  # noqa: E402
from shapegrad.ops import kernels  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import examples_time  # noqa: E402
import train_step  # noqa: E402
from charlm_model import charlm_loss  # noqa: E402

Step = Callable[[], Any]


def cnn_runners() -> dict[str, Step]:
    w = train_step.workload("cnn", 64, 1)
    step = train_step.sgd_step(w["loss"])
    x, y = sg.tensor(w["xs"][0]), sg.tensor(w["ys"][0])
    state = {"p": [sg.tensor(p) for p in w["params"]]}

    def run() -> None:
        state["p"], _ = step(state["p"], x, y)

    return {"sg": run, "torch": train_step.torch_sgd_step(w, "cnn")}


GPT = {"vocab": 94, "d": 128, "blocks": 2, "heads": 4, "t": 64, "batch": 32}


def gpt_runners() -> dict[str, Step]:
    from shapegrad.nn.transformer import BlockStack, block_init

    vocab, d, t = GPT["vocab"], GPT["d"], GPT["t"]
    rng = np.random.default_rng(2)
    ids = rng.integers(0, vocab, size=(GPT["batch"], t)).astype(np.int32)
    targets = rng.integers(0, vocab, size=(GPT["batch"], t)).astype(np.int32)
    tok = (rng.normal(size=(vocab, d)) * 0.02).astype(np.float32)
    pos = (rng.normal(size=(t, d)) * 0.01).astype(np.float32)
    stack = BlockStack.init(block_init(0.02), seed=0, layers=GPT["blocks"], d=d, f=4 * d)
    params = {
        "tokens": sg.tensor(tok),
        "positions": sg.tensor(pos),
        "blocks": stack,
        "ln_w": sg.ones(d),
        "ln_b": sg.zeros(d),
    }
    loss = charlm_loss(GPT["blocks"], GPT["heads"], vocab, loop=False)
    trainer = sg.ScalarTrainer(loss, params, mode="eager", optimizer=sg.optim.AdamW(lr=1e-3))
    return {
        "sg": lambda: trainer.step(ids, targets),
        "torch": torch_gpt(tok, pos, [b.numpy() for b in stack], ids, targets),
    }


def torch_gpt(tok: Any, pos: Any, blocks: list[Any], ids: Any, targets: Any) -> Step:
    """depth.py's PyTorch charlm (TransformerEncoderLayer, pre-LN, tanh GELU, AdamW)."""
    import torch

    d, t, heads = tok.shape[1], ids.shape[1], GPT["heads"]
    layers = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(
            d,
            heads,
            4 * d,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation=lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        )
        for _ in range(GPT["blocks"])
    )
    emb = torch.nn.Parameter(torch.tensor(tok))
    positions = torch.nn.Parameter(torch.tensor(pos))
    final = torch.nn.LayerNorm(d)
    opt = torch.optim.AdamW([emb, positions, *layers.parameters(), *final.parameters()], lr=1e-3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
    x, y = torch.tensor(ids, dtype=torch.long), torch.tensor(targets, dtype=torch.long)

    def run() -> None:
        h = emb[x] + positions[:t]
        for layer in layers:
            h = layer(h, src_mask=mask, is_causal=True)
        logits = final(h) @ emb.T
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, emb.shape[0]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return run


def example_runners(name: str) -> dict[str, Step]:
    model, loss, batch, settings = examples_time.problem(name, np.random.default_rng(0))
    if name == "llama":
        opt = sg.optim.AdamW(lr=3e-3, weight_decay=0.01)
    else:
        opt = sg.optim.Adam(lr=3e-3)
    trainer = sg.ScalarTrainer(loss, model, mode="eager", optimizer=opt)
    return {
        "sg": lambda: trainer.step(*batch),
        "torch": examples_time.torch_step(name, batch, settings),
    }


WORKLOADS: dict[str, Callable[[], dict[str, Step]]] = {
    "cnn": cnn_runners,
    "gpt": gpt_runners,
    "unet": lambda: example_runners("unet"),
    "llama": lambda: example_runners("llama"),
}
COLUMNS = ("sg native", "sg numpy", "PyTorch")


def columns(name: str) -> dict[str, Step]:
    """The workload's three runners; shapegrad's two run the same step with the kernel
    provider switched on or off around each call."""
    runners = WORKLOADS[name]()

    def native() -> None:
        with kernels.enabled(True):
            runners["sg"]()

    def numpy_only() -> None:
        with kernels.enabled(False):
            runners["sg"]()

    return {"sg native": native, "sg numpy": numpy_only, "PyTorch": runners["torch"]}


def cpu_description() -> str:
    """``lscpu``'s model name and whether the CPU has AVX-512 (the vector width matters)."""
    model, flags = "unknown CPU", ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name":
            model = value.strip()
        elif key.strip() == "Flags":
            flags = value
    vector = "AVX-512" if "avx512f" in flags.split() else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {os.cpu_count()} cores, {vector}"


def wait_for_kernels(run: Step) -> None:
    """Until every kernel the step asks for is ready: each step may queue compiles (its
    forward kernels, then their VJPs at the first backward that runs a kernel)."""
    from shapegrad.jit import eager_kernels

    provider = eager_kernels.installed()
    drain = getattr(provider, "drain", None)  # None: an older shapegrad (compiles inline)
    if drain is None:
        return
    for _ in range(3):
        drain()
        run()
    drain()


def measure(name: str) -> dict[str, list[float]]:
    from shapegrad.jit import eager_kernels

    runners = columns(name)
    provider = eager_kernels.installed()
    compiled_before = provider.compiles if provider else 0
    warmup: dict[str, list[float]] = {}
    for column, run in runners.items():  # native kernels compile (or load) here
        for _ in range(2):
            t0 = time.perf_counter()
            run()
            warmup.setdefault(column, []).append(time.perf_counter() - t0)
    wait_for_kernels(runners["sg native"])
    kernels_built = (provider.compiles if provider else 0) - compiled_before
    print(
        f"  {name} warm-up steps 1, 2 (ms): "
        + "; ".join(f"{c} {a * 1e3:.0f}, {b * 1e3:.0f}" for c, (a, b) in warmup.items())
        + f"; {kernels_built} forward kernels",
        flush=True,
    )
    times: dict[str, list[float]] = {column: [] for column in runners}
    for _ in range(OPTS.rounds):
        for column, run in runners.items():
            t0 = time.perf_counter()
            for _ in range(OPTS.steps):
                run()
            times[column].append((time.perf_counter() - t0) / OPTS.steps)
    return times


def cold_child(name: str) -> None:
    """One cold run (in its own process, over an empty cache): its figures as JSON."""
    from shapegrad.jit import eager_kernels

    load = os.getloadavg()[0]
    run = WORKLOADS[name]()["sg"]
    provider = eager_kernels.installed()
    pending = getattr(provider, "pending", None)  # None: an older shapegrad (compiles inline)
    steps: list[float] = []
    ready = None  # the first step after which no compile was pending
    for _ in range(OPTS.cold_steps):
        t0 = time.perf_counter()
        run()
        steps.append(time.perf_counter() - t0)
        if ready is None and pending is not None and provider and provider.compiles:
            ready = len(steps) if pending() == 0 else None
    t0 = time.perf_counter()
    wait_for_kernels(run)
    waited = time.perf_counter() - t0
    steady = []
    for _ in range(OPTS.steady):
        t0 = time.perf_counter()
        run()
        steady.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "steps": steps,
                "ready": ready,
                "waited": waited,
                "steady": statistics.median(steady),
                "kernels": provider.compiles if provider else 0,
                "declined": len(provider.declined) if provider else 0,
                "load": load,
            }
        )
    )


COLD_ENV = {"numpy": "0", "sync": "sync", "background": "1", "base": "1"}


def cold_run(name: str, mode: str) -> dict[str, Any]:
    """``cold_child`` in a fresh process over a fresh empty cache."""
    src = OPTS.baseline_src if mode == "base" else str(HERE.parent / "src")
    with tempfile.TemporaryDirectory(prefix="sg-eager-cold-") as cache:
        env = {
            **os.environ,
            "SHAPEGRAD_CACHE_DIR": cache,
            "XDG_CACHE_HOME": cache,
            "SHAPEGRAD_EAGER_KERNELS": COLD_ENV[mode],
            "PYTHONPATH": os.pathsep.join([src, str(HERE)]),
        }
        argv = [sys.executable, __file__, "--child", name, "--threads", str(OPTS.threads)]
        argv += ["--cold-steps", str(OPTS.cold_steps), "--steady", str(OPTS.steady)]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"cold run {name}/{mode} failed:\n{out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def ready(runs: list[dict[str, Any]]) -> str:
    """The runs' "ready at" steps (see the table's note)."""
    marks = {r["ready"] for r in runs}
    if marks == {None}:
        return "-" if all(r["kernels"] == 0 or r["waited"] < 0.05 for r in runs) else "later"
    return ",".join(sorted("later" if m is None else str(m) for m in marks))


def cold_start() -> None:
    modes = [m for m in OPTS.cold_modes.split(",") if m]
    if OPTS.baseline_src:
        modes.insert(0, "base")
    unknown = set(modes) - set(COLD_ENV)
    if unknown:
        sys.exit(f"--cold-modes: unknown {sorted(unknown)}; known: {sorted(COLD_ENV)}")
    names = OPTS.only.split(",")
    print(
        f"{cpu_description()}; {OPTS.threads} thread(s); cold start (empty kernel cache per "
        f"run); {OPTS.rounds} interleaved rounds; load average {os.getloadavg()[0]:.2f}"
        + (f"; base = {OPTS.baseline_src}" if OPTS.baseline_src else "")
    )
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(OPTS.rounds):
        for name in names:
            for mode in modes:
                runs.setdefault((name, mode), []).append(cold_run(name, mode))
    print(f"load average after: {os.getloadavg()[0]:.2f} (median of runs' start loads below)\n")
    n = OPTS.cold_steps
    print(
        f"{'model':7s}{'variant':>11s}{'step 1 s':>10s}{'1-5 s':>8s}{'1-' + str(n) + ' s':>8s}"
        f"{'worst step s':>14s}{'steady ms':>11s}{'kernels':>9s}{'ready at':>10s}{'load':>6s}"
    )
    for name in names:
        for mode in modes:
            rs = runs[(name, mode)]

            def med(f: Callable[[dict[str, Any]], float], rs: list[dict[str, Any]] = rs) -> float:
                return statistics.median(f(r) for r in rs)

            print(
                f"{name:7s}{mode:>11s}{med(lambda r: r['steps'][0]):10.2f}"
                f"{med(lambda r: sum(r['steps'][:5])):8.2f}{med(lambda r: sum(r['steps'])):8.2f}"
                f"{med(lambda r: max(r['steps'])):14.2f}{med(lambda r: r['steady']) * 1e3:11.1f}"
                f"{med(lambda r: r['kernels']):9.0f}{ready(rs):>10s}{med(lambda r: r['load']):6.2f}"
            )
    print(
        "\nready at: the step after which no compile was pending (background), 'later': after "
        f"the first {n} steps; '-': compiled inline (base) or nothing to compile (numpy)."
    )


def main() -> None:
    if OPTS.child:
        cold_child(OPTS.child)
        return
    if OPTS.cold_start:
        cold_start()
        return
    try:
        import torch
    except ImportError:
        sys.exit("eager_vs_torch.py compares against PyTorch eager: pip install torch (CPU)")

    torch.set_num_threads(OPTS.threads)
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass"])
        for _ in range(OPTS.background_load)
    ]
    try:
        print(
            f"{cpu_description()}; {OPTS.threads} thread(s) per framework; background load "
            f"{OPTS.background_load} busy processes; load average {os.getloadavg()[0]:.2f}; "
            f"PyTorch {torch.__version__}; {OPTS.rounds} interleaved rounds of {OPTS.steps} steps"
        )
        results = {name: measure(name) for name in OPTS.only.split(",")}
    finally:
        for proc in busy:
            proc.kill()
    print(f"load average after: {os.getloadavg()[0]:.2f}\n")
    head = "".join(f"{c:>12s}" for c in COLUMNS)
    print(f"{'ms/step':8s}{head}{'native/torch':>14s}{'numpy/torch':>13s}")
    for name, times in results.items():
        med = {c: statistics.median(v) for c, v in times.items()}
        cells = "".join(f"{med[c] * 1e3:12.1f}" for c in COLUMNS)
        torch_ms = med["PyTorch"]
        print(
            f"{name:8s}{cells}{med['sg native'] / torch_ms:13.2f}x"
            f"{med['sg numpy'] / torch_ms:12.2f}x"
        )


if __name__ == "__main__":
    main()
