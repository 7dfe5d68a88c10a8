"""Median time per SGD training step: shapegrad eager / compiled C vs NumPy, PyTorch, JAX.

Run: ``.venv/bin/python benchmarks/train_step.py [--quick]``

Workloads (float32, plain SGD, forward + backward + update per step):

* moons MLP 2-16-16-1, hinge loss, batch 10 and 256;
* MLP 784-512-512-10, softmax cross-entropy, batch 128;
* CNN 1x28x28 -> conv3x3 16 (pad 1) -> ReLU -> conv3x3 32 (pad 1) -> ReLU ->
  global average pool -> linear 10, cross-entropy, batch 64;
* MLP width scaling 784-W-W-10, W = 256, 512, 1024, 2048, batch 128 (rows ``w256``...):
  with ``--widths`` a second table gives GFLOP/s of the C step next to the machine's
  sgemm rate measured in the same run (OpenBLAS through NumPy, 2048^3).

``--gpt`` runs the transformer workload instead (char-level GPT: context 64, d_model 128,
4 heads, 2 pre-LN blocks, GELU 4x, batch 32, cross-entropy, AdamW): ``depth.py``'s
charlm step for shapegrad C (unrolled and layer loop), PyTorch eager and JAX jit, in
interleaved rounds (``--threads`` sets every framework's thread count).

``--background-load N`` runs N busy processes during the whole measurement (users'
laptops and CI runners are busy too); the 1-minute load average is printed.

``--rounds N`` measures the table N times, interleaved (every cell of a row once per round,
in turn), and prints each cell's median with the per-round ratios of the C step to JAX jit
and PyTorch eager: a burst of load from other processes then hits every column alike.

``--cpu-time``: every framework on one thread in a process pinned to one CPU, and the time
is the process's CPU time per step: on a shared machine it does not count the time the
process waits for a CPU (wall time there grows with the other processes' load).

The header names the CPU, its vector width, the OpenBLAS kernel set the C step's products
run on (``SHAPEGRAD_BLAS_CORETYPE`` / ``OPENBLAS_CORETYPE``, see
``backends/c/blascore.py``) and the load average.

Columns: shapegrad eager; compiled C with one native call per step
(``exe.bind(params)(x, y)``) and with K steps per native call
(``run_steps`` on ``[K, ...]`` stacked batches); hand-written NumPy; PyTorch
eager and ``jax.jit`` when importable. Then cold compile time (empty cache,
trace + passes + codegen + cc + dlopen; wall time and CPU time, the latter
unaffected by other users of the machine) and warm-cache first call in a fresh
process after imports (trace + passes + codegen + cache hit + dlopen + first step). Timings are noisy on a shared machine: compare ratios within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import shapegrad as sg
import shapegrad.functional as F

LR = 0.05
Array = np.ndarray


# --- models written once against shapegrad -------------------------------------------------


def conv3x3(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
    """3x3 convolution, padding 1, stride 1, as im2col + one einsum (NCHW, OIHW).

    With ``SHAPEGRAD_BENCH_CONV`` set (``auto``, ``im2col`` or ``winograd``) it is
    ``sg.conv2d`` with that algorithm instead, for A/B runs of the same tree.
    """
    algorithm = os.environ.get("SHAPEGRAD_BENCH_CONV")
    if algorithm:
        return sg.conv2d(x, w, b, padding=1, algorithm=algorithm)
    _, c, h, wd = x.shape
    o = w.shape[0]
    xp = F.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = F.stack([xp[:, :, dy : dy + h, dx : dx + wd] for dy in range(3) for dx in range(3)], 2)
    out = F.einsum("bckhw,ock->bohw", cols, w.reshape((o, c, 9)))
    return out + b.reshape((1, o, 1, 1))


def mlp_logits(params: list[sg.Tensor], x: sg.Tensor) -> sg.Tensor:
    h = x
    for i in range(0, len(params) - 2, 2):
        h = sg.relu(h @ params[i] + params[i + 1])
    return h @ params[-2] + params[-1]


def moons_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return F.hinge(mlp_logits(params, x).reshape((-1,)), y)


def mlp_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    return F.cross_entropy(mlp_logits(params, x), y)


def cnn_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(conv3x3(x, w1, b1))
    h = sg.relu(conv3x3(h, w2, b2))
    return F.cross_entropy(h.mean(axis=(2, 3)) @ w3 + b3, y)


def sgd_step(loss: Callable[..., sg.Tensor]) -> Callable[..., Any]:
    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads, strict=True)], value

    return step


# --- data -------------------------------------------------------------------------------------


def init_params(shapes: list[tuple[int, ...]], seed: int = 0) -> list[Array]:
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        fan_in = int(np.prod(s[1:])) if len(s) == 4 else s[0]
        scale = np.sqrt(2.0 / fan_in) if len(s) > 1 else 0.0
        out.append((rng.standard_normal(s) * scale).astype(np.float32))
    return out


def workload(name: str, batch: int, k: int, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    if name.startswith("mlp") and name[3:].isdigit():  # 784-W-W-10
        width = int(name[3:])
        shapes = [(784, width), (width,), (width, width), (width,), (width, 10), (10,)]
        xs = rng.random((k, batch, 784), dtype=np.float32)
        ys = rng.integers(0, 10, (k, batch)).astype(np.int32)
        return {"params": init_params(shapes, seed), "xs": xs, "ys": ys, "loss": mlp_loss}
    if name == "moons":
        shapes = [(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)]
        xs = rng.standard_normal((k, batch, 2)).astype(np.float32)
        ys = np.where(rng.random((k, batch)) < 0.5, -1.0, 1.0).astype(np.float32)
        loss = moons_loss
    elif name == "mlp":
        shapes = [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
        xs = rng.random((k, batch, 784), dtype=np.float32)
        ys = rng.integers(0, 10, (k, batch)).astype(np.int32)
        loss = mlp_loss
    else:
        shapes = [(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (32, 10), (10,)]
        xs = rng.random((k, batch, 1, 28, 28), dtype=np.float32)
        ys = rng.integers(0, 10, (k, batch)).astype(np.int32)
        loss = cnn_loss
    return {"params": init_params(shapes, seed), "xs": xs, "ys": ys, "loss": loss}


# --- timing -------------------------------------------------------------------------------------


CPU_TIME = bool(os.environ.get("SG_BENCH_CPU_TIME"))  # set by --cpu-time for the cells
# --warmup N: untimed calls before each cell's timing. The C step's adaptive team probes
# team sizes over its first calls (runtime.h), and per_call's ~0.4 s window is only ~40
# CNN steps: at 2 threads the CNN cell read 8.5-8.7 ms without warm-up and 5.7-5.9 ms
# after 200 steps (5.9 at once with SHAPEGRAD_ADAPTIVE_THREADS=0); PyTorch 8.5 -> 8.0.
WARMUP = int(os.environ.get("SG_BENCH_WARMUP", "0"))


def clock() -> float:
    """Wall seconds, or this process's CPU seconds under ``--cpu-time``."""
    return time.process_time() if CPU_TIME else time.perf_counter()


def framework_threads() -> int:
    """Threads for PyTorch (and the C step's default): 2, or 1 under ``--cpu-time``."""
    return 1 if CPU_TIME else 2


def per_call(fn: Callable[[], Any], budget: float = 0.4, repeats: int = 5) -> float:
    """Median seconds per call of ``fn`` (batched into loops of >= ~budget/repeats seconds)."""
    for _ in range(WARMUP):
        fn()
    fn()
    t0 = clock()
    fn()
    once = max(clock() - t0, 1e-7)
    n = max(1, int(budget / repeats / once))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        samples.append((clock() - t0) / n)
    return statistics.median(samples)


def time_shapegrad_eager(w: dict[str, Any]) -> float:
    step = sgd_step(w["loss"])
    params = [sg.tensor(p) for p in w["params"]]
    x, y = sg.tensor(w["xs"][0]), sg.tensor(w["ys"][0])
    return per_call(lambda: step(params, x, y))


def compiled(w: dict[str, Any]) -> Any:
    fn = sg.compile(sgd_step(w["loss"]), backend="c", donate_argnums=0)
    return fn.lower(w["params"], w["xs"][0], w["ys"][0]).executable


def time_c_single(w: dict[str, Any]) -> float:
    bound = compiled(w).bind(w["params"])
    x, y = w["xs"][0], w["ys"][0]
    return per_call(lambda: bound(x, y))


def time_c_multi(w: dict[str, Any]) -> float:
    bound = compiled(w).bind(w["params"])
    k = len(w["xs"])
    return per_call(lambda: bound.run_steps(w["xs"], w["ys"])) / k


def time_numpy(w: dict[str, Any], name: str) -> float | None:
    if name == "cnn":
        return None  # no hand-written NumPy convolution backward here
    params = [p.copy() for p in w["params"]]
    x, y = w["xs"][0], w["ys"][0]

    def step() -> None:
        hs = [x]
        for i in range(0, len(params) - 2, 2):
            hs.append(np.maximum(hs[-1] @ params[i] + params[i + 1], 0))
        out = hs[-1] @ params[-2] + params[-1]
        if name == "moons":
            s = out[:, 0]
            margin = 1 - y * s
            g = np.where(margin > 0, -y, 0).astype(np.float32)[:, None] / len(y)
        else:
            e = np.exp(out - out.max(axis=1, keepdims=True))
            p = e / e.sum(axis=1, keepdims=True)
            p[np.arange(len(y)), y] -= 1
            g = p / len(y)
        for i in range(len(params) - 2, -1, -2):
            gw, gb = hs[i // 2].T @ g, g.sum(axis=0)
            if i:
                g = (g @ params[i].T) * (hs[i // 2] > 0)
            params[i] -= LR * gw
            params[i + 1] -= LR * gb

    return per_call(step)


def torch_sgd_step(w: dict[str, Any], name: str, device: str = "cpu") -> Callable[[], Any]:
    """The workload's SGD step in PyTorch (same math, same initial weights); returns the loss."""
    import torch

    params = [torch.tensor(p, requires_grad=True, device=device) for p in w["params"]]
    x = torch.tensor(w["xs"][0], device=device)
    y = torch.tensor(w["ys"][0], device=device)
    y = y if name == "moons" else y.long()

    def forward() -> Any:
        if name == "cnn":
            h = torch.relu(torch.nn.functional.conv2d(x, params[0], params[1], padding=1))
            h = torch.relu(torch.nn.functional.conv2d(h, params[2], params[3], padding=1))
            return torch.nn.functional.cross_entropy(h.mean((2, 3)) @ params[4] + params[5], y)
        h = x
        for i in range(0, len(params) - 2, 2):
            h = torch.relu(h @ params[i] + params[i + 1])
        out = h @ params[-2] + params[-1]
        if name == "moons":
            return torch.relu(1 - y * out[:, 0]).mean()
        return torch.nn.functional.cross_entropy(out, y)

    def step() -> Any:
        loss = forward()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(LR * g)
        return loss

    return step


def time_torch(w: dict[str, Any], name: str) -> float | None:
    try:
        import torch
    except Exception:  # not installed (or a broken install): leave the column empty
        return None
    torch.set_num_threads(framework_threads())
    return per_call(torch_sgd_step(w, name))


def time_jax(w: dict[str, Any], name: str) -> float | None:
    try:
        import jax
        import jax.numpy as jnp
    except Exception:  # not installed (or a broken install): leave the column empty
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
        return [p - LR * g for p, g in zip(params, grads, strict=True)], value

    state = {"p": [jnp.asarray(p) for p in w["params"]]}
    x, y = jnp.asarray(w["xs"][0]), jnp.asarray(w["ys"][0])

    def run() -> None:
        state["p"], value = step(state["p"], x, y)
        value.block_until_ready()

    return per_call(run)


def cold_compile(w: dict[str, Any]) -> float:
    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            t0 = time.perf_counter()
            compiled(w)
            return time.perf_counter() - t0
        finally:
            if old is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = old


def cold_compile_cpu(w: dict[str, Any]) -> float:
    """CPU seconds of a cold compile (this process + the C compiler): immune to other load."""
    import resource

    with tempfile.TemporaryDirectory() as cache:
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = cache
        try:
            before = [
                resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            ]
            compiled(w)
            after = [
                resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            ]
            return sum(
                (a.ru_utime + a.ru_stime) - (b.ru_utime + b.ru_stime)
                for a, b in zip(after, before, strict=True)
            )
        finally:
            if old is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = old


_WARM = """
import sys, time
sys.path.insert(0, {here!r})
import train_step as b
import shapegrad.backends.c as c
c.executable.ffi()  # imports (cffi/pycparser, the backend) are not part of the first call
w = b.workload({name!r}, {batch}, 1)
t0, c0 = time.perf_counter(), time.process_time()
bound = b.compiled(w).bind(w["params"])
bound(w["xs"][0], w["ys"][0])
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def warm_first_call(name: str, batch: int, cpu: bool = False) -> float:
    """Wall (or CPU) seconds of the first call in a fresh process with a warm cache."""
    compiled(workload(name, batch, 1))  # make sure the cache holds it
    code = _WARM.format(here=os.path.dirname(os.path.abspath(__file__)), name=name, batch=batch)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall, cpu_time = out.stdout.strip().splitlines()[-1].split()
    return float(cpu_time if cpu else wall)


def fmt(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms"


ROWS = {
    "moons10": ("moons", 10, 200),
    "moons256": ("moons", 256, 50),
    "mlp": ("mlp", 128, 10),
    "cnn": ("cnn", 64, 4),
}
WIDTHS = {f"w{w}": (f"mlp{w}", 128, 4) for w in (256, 512, 1024, 2048)}
ROWS.update(WIDTHS)
DEFAULT_ROWS = ["moons10", "moons256", "mlp", "cnn"]


def mlp_flops(width: int, batch: int) -> float:
    """Multiply-add FLOPs of one 784-W-W-10 step's products (forward and both backward)."""
    return 6.0 * batch * (784 * width + width * width + width * 10)


def sgemm_rate() -> float:
    """FLOP/s of a 2048^3 float32 product through NumPy's OpenBLAS (all threads)."""
    a = np.random.default_rng(0).random((2048, 2048), dtype=np.float32)
    return 2 * 2048**3 / per_call(lambda: a @ a, budget=1.0)


def cpu_description() -> str:
    """CPU model, family/model and vector width (``/proc/cpuinfo``; Linux)."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    width = "AVX-512 (512-bit)" if "avx512f" in flags else "AVX2 (256-bit)"
    if not flags & {"avx2", "avx512f"}:
        width = "no AVX2"
    return (
        f"{info.get('model name', '?')} (family {info.get('cpu family', '?')} model "
        f"{info.get('model', '?')}), {os.cpu_count()} CPUs, vectors: {width}"
    )


def blas_description() -> str:
    """The OpenBLAS kernel set the C step's products run on (as a cell process loads it)."""
    code = "from shapegrad.backends.c import toolchain; print(toolchain.blas_core())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    core = out.stdout.strip() or f"unknown ({out.stderr.strip()[-200:]})"
    settings = ", ".join(
        f"{v}={os.environ[v]!r}"
        for v in ("OPENBLAS_CORETYPE", "SHAPEGRAD_BLAS_CORETYPE")
        if os.environ.get(v)
    )
    from shapegrad.backends.c.blascore import SKYLAKEX_FLAGS, cpu_flags

    note = ""
    if cpu_flags() >= SKYLAKEX_FLAGS and core not in ("SkylakeX", "Cooperlake", "SapphireRapids"):
        note = (
            "; NOT the CPU's AVX-512 kernels: unset OPENBLAS_CORETYPE or set "
            "SHAPEGRAD_BLAS_CORETYPE=auto to measure what a user without it gets"
        )
    return f"OpenBLAS kernels of the C step: {core}" + (f" ({settings})" if settings else "") + note


def background_load(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes that keep one CPU busy each until killed."""
    code = "while True:\n    pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


COLUMNS = [
    "sg eager",
    "C 1-step",
    "C K-step",
    "NumPy",
    "PyTorch",
    "JAX jit",
    "cold",
    "cold cpu",
    "warm",
    "warm cpu",
]


def measure(column: str, row: str) -> float | None:
    """One cell of the table (run in its own process, see ``main``)."""
    name, batch, k = ROWS[row]
    if CPU_TIME and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if column in ("warm", "warm cpu"):
        return warm_first_call(name, batch, cpu=column == "warm cpu")
    w = workload(name, batch, k)
    cells: dict[str, Callable[[], float | None]] = {
        "sg eager": lambda: time_shapegrad_eager(w),
        "C 1-step": lambda: time_c_single(w),
        "C K-step": lambda: time_c_multi(w),
        "NumPy": lambda: time_numpy(w, name),
        "PyTorch": lambda: time_torch(w, name),
        "JAX jit": lambda: time_jax(w, name),
        "cold": lambda: cold_compile(w),
        "cold cpu": lambda: cold_compile_cpu(w),
    }
    return cells[column]()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", help="moons10,moons256,mlp,cnn (comma separated)")
    parser.add_argument("--columns", help="subset of: " + ", ".join(COLUMNS))
    parser.add_argument("--widths", action="store_true", help="MLP width scaling table")
    parser.add_argument("--gpt", action="store_true", help="the transformer (charlm) step")
    parser.add_argument("--threads", type=int, default=1, help="with --gpt: threads per framework")
    parser.add_argument("--background-load", type=int, default=0, metavar="N")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per row")
    parser.add_argument(
        "--warmup", type=int, default=0, metavar="N", help="untimed calls before each cell"
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="one thread each, CPU time per step"
    )
    parser.add_argument("--cell", nargs=2, metavar=("COLUMN", "ROW"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        value = measure(*args.cell)
        print("none" if value is None else repr(value))
        return
    if args.cpu_time:
        os.environ["SG_BENCH_CPU_TIME"] = "1"
        os.environ["SHAPEGRAD_NUM_THREADS"] = "1"
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    if args.warmup:
        os.environ["SG_BENCH_WARMUP"] = str(args.warmup)
    busy = background_load(args.background_load)
    try:
        run_tables(args)
    finally:
        for proc in busy:
            proc.kill()


def run_tables(args: argparse.Namespace) -> None:
    print(f"CPU: {cpu_description()}")
    print(blas_description())
    timing = "CPU time per step, 1 thread each" if args.cpu_time else "wall time per step"
    print(
        f"{timing}; background load: {args.background_load} busy processes; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if args.widths:
        width_table()
        return
    if args.gpt:
        depth = os.path.join(os.path.dirname(os.path.abspath(__file__)), "depth.py")
        threads = 1 if args.cpu_time else args.threads
        cmd = [sys.executable, depth, "--only", "charlm", "--threads", str(threads)]
        subprocess.run(cmd, check=False)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        return
    rows = [r for r in (args.only.split(",") if args.only else DEFAULT_ROWS) if r in ROWS]
    columns = [c for c in COLUMNS if not args.columns or c in args.columns.split(",")]
    # Every cell runs in a fresh process: thread pools of one framework (OpenMP, OpenBLAS,
    # PyTorch, XLA) would otherwise keep spinning and slow the next measurement down.
    print(f"{'workload':16s}" + "".join(f"{c:>13s}" for c in columns))
    for row in rows:
        rounds = [[cell(column, row) for column in columns] for _ in range(args.rounds)]
        values = [median_of([r[i] for r in rounds]) for i in range(len(columns))]
        k = ROWS[row][2]
        print(f"{row + f' K={k}':16s}" + "".join(f"{fmt(t):>13s}" for t in values), flush=True)
        if args.rounds > 1:
            print(ratio_line(columns, rounds), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def median_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio_line(columns: list[str], rounds: list[list[float | None]]) -> str:
    """Per-round ratios (other framework's time / the C step's), as ``median [min-max]``."""
    parts = []
    for other in ("JAX jit", "PyTorch"):
        if "C 1-step" not in columns or other not in columns:
            continue
        mine, theirs = columns.index("C 1-step"), columns.index(other)
        ratios = sorted(t / c for r in rounds if (c := r[mine]) and (t := r[theirs]) is not None)
        if ratios:
            parts.append(
                f"{other} / C 1-step {statistics.median(ratios):.2f}x "
                f"[{ratios[0]:.2f}-{ratios[-1]:.2f}]"
            )
    return f"{'':16s}" + "; ".join(parts) + f" over {len(rounds)} interleaved rounds"


def cell(column: str, row: str) -> float | None:
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--cell", column, row],
        capture_output=True,
        text=True,
    )
    last = proc.stdout.strip().splitlines()[-1:] or ["none"]
    return None if proc.returncode or last[0] == "none" else float(last[0])


def width_table() -> None:
    """C step GFLOP/s for 784-W-W-10 next to JAX, PyTorch and the in-run sgemm rate."""
    peak = sgemm_rate()
    print(f"sgemm 2048^3 through NumPy/OpenBLAS: {peak / 1e9:.1f} GFLOP/s")
    print(
        f"{'width':8s}{'C 1-step':>13s}{'GFLOP/s':>10s}{'% sgemm':>9s}{'JAX jit':>13s}{'PyTorch':>13s}"
    )
    for row, (_, batch, _) in WIDTHS.items():
        width = int(row[1:])
        c, jax, torch = (cell(col, row) for col in ("C 1-step", "JAX jit", "PyTorch"))
        rate = mlp_flops(width, batch) / c if c else float("nan")
        print(
            f"{width:<8d}{fmt(c):>13s}{rate / 1e9:10.1f}{100 * rate / peak:8.0f}%"
            f"{fmt(jax):>13s}{fmt(torch):>13s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
