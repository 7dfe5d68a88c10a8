"""Training-step time of examples/lstm.py, llama.py and unet.py: shapegrad (compiled C and
eager) next to PyTorch (eager, CPU) for the same model, batch and optimizer.

Both run on ONE thread by default (``--threads N`` to change): on a shared, loaded machine
a thread team that waits for a busy core costs PyTorch up to 25x (measured: the llama step
62 ms on one thread, 1,567 ms on two, load average 3.6 on 2 cores). Each (example,
framework) is measured in its own process (no shared thread pools or
allocator state): a few warm-up steps (shapegrad's first compiles), then the median of
timed steps. The models come from the examples themselves (their definitions are loaded
without running their scripts) and from tests/torch_models.py.
Run: python benchmarks/examples_time.py [--threads 1]  (prints a Markdown table)
     python benchmarks/examples_time.py lstm torch      (one measurement, as JSON)
"""

from __future__ import annotations

import ast
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("compiled", "eager", "torch")
EXAMPLES = ("lstm", "llama", "unet")
STEPS = {"compiled": 30, "eager": 5, "torch": 30}


def definitions(name: str) -> ModuleType:
    """The example's imports, classes, functions and constants, without its script part."""
    path = ROOT / "examples" / f"{name}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    keep = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)
    body = [node for node in tree.body if isinstance(node, keep) or _is_setting(node)]
    module = ModuleType(f"example_{name}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), module.__dict__)
    return module


def _is_setting(node: ast.stmt) -> bool:
    """A constant (``digits, delay = 8, 3``) or an initializer (``normal = sg.nn.init...``)."""
    if not isinstance(node, ast.Assign):
        return False
    if ast.unparse(node.value).startswith("sg.nn.init."):
        return True
    try:
        ast.literal_eval(node.value)
    except ValueError:
        return False
    return True


def problem(name: str, rng: np.random.Generator) -> tuple[Any, Any, tuple[np.ndarray, ...], dict]:
    """(our model, our loss, one batch, PyTorch settings) at the sizes the example trains."""
    ex = definitions(name)
    if name == "lstm":
        ids = rng.integers(0, ex.digits, size=(32, ex.length)).astype(np.int32)
        model = ex.Recaller.init(seed=0, v=ex.digits, d=16, h=64)
        return model, ex.loss, (ids, ids[:, : ex.length - ex.delay]), {"delay": ex.delay}
    if name == "llama":
        ids = rng.integers(0, 94, size=(32, 33)).astype(np.int32)  # difflib's 94 characters
        model = ex.Llama.init(seed=0, v=94, d=64, f=256, layers=2)
        return model, ex.loss, (ids[:, :-1], ids[:, 1:]), {}
    clean = rng.uniform(0, 1, size=(32, 1, 8, 8)).astype(np.float32)
    noisy = clean + rng.normal(0, 0.3, size=clean.shape).astype(np.float32)
    return ex.UNet.init(seed=0, c=16), ex.loss, (noisy, clean), {}


def torch_step(name: str, batch: tuple[np.ndarray, ...], settings: dict) -> Any:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "tests"))
    import torch_models as tm

    inputs = [
        torch.as_tensor(a).long() if a.dtype.kind == "i" else torch.as_tensor(a) for a in batch
    ]
    if name == "lstm":
        model: Any = tm.Recaller(8, 16, 64)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        d = settings["delay"]

        def loss() -> Any:
            return F.cross_entropy(model(inputs[0])[:, d:].reshape(-1, 8), inputs[1].reshape(-1))
    elif name == "llama":
        model = tm.Llama(94, 64, 256, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)

        def loss() -> Any:
            return tm.llama_loss(model, *inputs)
    else:
        model = tm.UNet(16)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

        def loss() -> Any:
            return F.mse_loss(model(inputs[0]), inputs[1])

    def step() -> float:
        value = loss()
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        return value.item()

    return step


def measure(name: str, framework: str) -> dict[str, Any]:
    batch_rng = np.random.default_rng(0)
    if framework == "torch":
        import torch

        ex_model, _, batch, settings = problem(name, batch_rng)
        torch.set_num_threads(int(os.environ["SHAPEGRAD_NUM_THREADS"]))
        step = torch_step(name, batch, settings)
        threads = torch.get_num_threads()
    else:
        import shapegrad as sg

        optimizer = {
            "lstm": sg.optim.Adam(lr=1e-2),
            "llama": sg.optim.AdamW(lr=3e-3, weight_decay=0.01),
        }
        model, loss, batch, _ = problem(name, batch_rng)
        opt = optimizer.get(name, sg.optim.Adam(lr=3e-3))
        trainer = sg.ScalarTrainer(loss, model, mode=framework, optimizer=opt)

        def step() -> float:
            return trainer.step(*batch)

        threads = int(os.environ["SHAPEGRAD_NUM_THREADS"])
    for _ in range(3):  # warm-up; shapegrad's first step compiles
        step()
    times = []
    for _ in range(STEPS[framework]):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {
        "example": name,
        "framework": framework,
        "ms": 1e3 * statistics.median(times),
        "threads": threads,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] != "--threads":
        os.environ.setdefault("SHAPEGRAD_NUM_THREADS", "1")
        print(json.dumps(measure(sys.argv[1], sys.argv[2])))
        return
    threads = sys.argv[2] if len(sys.argv) == 3 else "1"
    env = {**os.environ, "SHAPEGRAD_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
    results: dict[tuple[str, str], float] = {}
    load_before = os.getloadavg()[0]
    for name in EXAMPLES:
        for framework in FRAMEWORKS:
            done = subprocess.run(
                [sys.executable, __file__, name, framework],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            results[name, framework] = json.loads(done.stdout.strip().splitlines()[-1])["ms"]
    print(
        f"{cpu_name()}, {os.cpu_count()} cores; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; median ms per training step, {threads} thread(s)"
    )
    print("| example | shapegrad compiled C | shapegrad eager | PyTorch (eager, CPU) |")
    print("|---|---:|---:|---:|")
    for name in EXAMPLES:
        row = [f"{results[name, f]:.1f}" for f in FRAMEWORKS]
        print(f"| {name} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
