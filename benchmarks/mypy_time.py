"""How long mypy takes with and without shapegrad's plugin: cold cache, warm cache, and after an edit.

Targets: the realistic corpus (tests/mypy_fixtures/corpus), all static-checking
fixtures (corpus included) and a generated ~1,000-line model file (transformer blocks, CNNs, training steps).
Each cell is the median CPU time (user + system) of a `python -m mypy` subprocess, with
the median wall time in parentheses; CPU time is what the plugin adds, wall time
also counts waiting for a core on a shared machine. Runs with and without the
plugin are interleaved so that background load hits both alike.

- cold: an empty cache directory (mypy also analyses shapegrad and its imports);
- warm: the same command again, nothing changed (the "nothing to do" floor);
- edit: warm cache, the target file(s) changed (what a check on save costs).

Also reports the import time of the plugin entry points.

Usage: python benchmarks/mypy_time.py [--repeat 3] [--cold-repeat 1] [--only corpus,fixtures,model]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "mypy_fixtures"

CONFIG = """[mypy]
python_version = 3.11
disallow_untyped_defs = True
{plugins}
"""

_BLOCK = """

@sg.typechecked
def attention_{i}(
    x: Float[Tensor, "b t c"], w_qkv: Float[Tensor, "c 3*c"], w_proj: Float[Tensor, "c c"]
) -> Float[Tensor, "b t c"]:
    B, T, C = x.shape
    hs = C // N_HEAD
    qkv = x @ w_qkv
    q = qkv[:, :, :C].reshape(B, T, N_HEAD, hs).transpose(0, 2, 1, 3)
    k = qkv[:, :, C : 2 * C].reshape(B, T, N_HEAD, hs).transpose(0, 2, 1, 3)
    v = qkv[:, :, 2 * C :].reshape(B, T, N_HEAD, hs).transpose(0, 2, 1, 3)
    att = sg.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hs), axis=-1)
    att = sg.where(causal_mask(T), att, -1e9)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return y @ w_proj


@sg.typechecked
def mlp_block_{i}(
    x: Float[Tensor, "b t c"], gain: Float[Tensor, " c"], w_fc: Float[Tensor, "c h"],
    w_out: Float[Tensor, "h c"],
) -> Float[Tensor, "b t c"]:
    h = sg.gelu(sg.layer_norm(x, gain) @ w_fc)
    return x + h @ w_out


class Conv{i}(ParamList[Float[Tensor, "8 1 3 3"], Float[Tensor, "16 8 3 3"], Float[Tensor, "10 784"]]):
    names = ("c1", "c2", "fc")


@sg.typechecked
def cnn_{i}(p: Conv{i}, x: Float[Tensor, "b 1 28 28"]) -> Float[Tensor, "b 10"]:
    c1, c2, fc = p
    h = sg.max_pool2d(sg.relu(sg.conv2d(x, c1, padding=1)), 2)
    h = sg.max_pool2d(sg.relu(sg.conv2d(h, c2, padding=1)), 2)
    flat = h.reshape(x.shape[0], 16 * 7 * 7)
    return flat @ fc.T


@sg.typechecked
def loss_{i}(p: Conv{i}, x: Float[Tensor, "b 1 28 28"], y: Int[Tensor, " b"]) -> Float[Tensor, ""]:
    return sg.cross_entropy(cnn_{i}(p, x), y)


def train_{i}(p: Conv{i}, xs: list[Tensor], ys: list[Tensor]) -> float:
    step = sg.value_and_grad(loss_{i})
    total = 0.0
    for x, y in zip(xs, ys, strict=True):
        value, grads = step(p, x, y)
        p = p.map(lambda w, g: w - 0.01 * g, grads)
        total += float(value.item())
    return total
"""

_HEADER = '''"""A generated ~1,000-line model file for timing mypy (benchmarks/mypy_time.py)."""

import math

import shapegrad as sg
from shapegrad import Bool, Float, Int, ParamList, Tensor

N_HEAD = 4


def causal_mask(t: int) -> Bool[Tensor, "t t"]:
    i = sg.arange(t)
    return i[:, None] >= i[None, :]
'''


def model_source(lines: int = 1000) -> str:
    """Repeat the block template until the file has about ``lines`` lines."""
    text, i = _HEADER, 0
    while text.count("\n") < lines:
        text += _BLOCK.format(i=i)
        i += 1
    return text


Timing = tuple[float, float]  # (cpu, wall) seconds


def run_mypy(config: Path, cache: Path, targets: list[Path]) -> Timing:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([*cmd, *map(str, targets)], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "INTERNAL ERROR" in done.stdout + done.stderr or done.returncode not in (0, 1):
        raise RuntimeError(done.stdout + done.stderr)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall


def _edit(targets: list[Path], k: int) -> None:
    """Change one checked file's content so that mypy must check it again."""
    for t in targets:
        f = t if t.is_file() else (sorted(t.rglob("good_*.py")) or sorted(t.glob("*.py")))[0]
        f.write_text(f.read_text() + f"\n# edit {k}\n")


def measure(
    work: Path, name: str, targets: list[Path], repeat: int, cold_repeat: int
) -> dict[bool, dict[str, Timing]]:
    """Cold, warm and edit timings, with and without the plugin, runs interleaved."""
    configs, caches, copies = {}, {}, {}
    for plugin in (False, True):
        configs[plugin] = work / f"{name}-{plugin}.ini"
        configs[plugin].write_text(
            CONFIG.format(plugins="plugins = shapegrad_mypy" if plugin else "")
        )
        caches[plugin] = work / f"cache-{name}-{plugin}"
        # Each configuration checks its own copy: an edit made for one must not leave
        # the other's cache stale.
        copies[plugin] = []
        for t in targets:
            dest = work / f"{name}-{plugin}" / t.name
            dest.parent.mkdir(exist_ok=True)
            if t.is_dir():
                shutil.copytree(t, dest)
            else:
                shutil.copy(t, dest)
            copies[plugin].append(dest)
    runs: dict[bool, dict[str, list[Timing]]] = {
        p: {"cold": [], "warm": [], "edit": []} for p in (False, True)
    }
    for _ in range(cold_repeat):
        for plugin in (False, True):
            shutil.rmtree(caches[plugin], ignore_errors=True)
            runs[plugin]["cold"].append(run_mypy(configs[plugin], caches[plugin], copies[plugin]))
    for k in range(repeat):
        for plugin in (False, True):
            runs[plugin]["warm"].append(run_mypy(configs[plugin], caches[plugin], copies[plugin]))
        for plugin in (False, True):
            _edit(copies[plugin], k)
            runs[plugin]["edit"].append(run_mypy(configs[plugin], caches[plugin], copies[plugin]))
    return {
        p: {
            kind: (
                statistics.median(c for c, _ in timings),
                statistics.median(w for _, w in timings),
            )
            for kind, timings in runs[p].items()
        }
        for p in (False, True)
    }


def import_time(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    runs = [
        float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True).stdout)
        for _ in range(5)
    ]  # fmt: skip
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cold-repeat", type=int, default=1)
    parser.add_argument("--only", default="corpus,fixtures,model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fixtures = work / "fixtures"
        shutil.copytree(FIXTURES, fixtures, ignore=shutil.ignore_patterns("*.ini"))
        model = work / "model_1000.py"
        model.write_text(model_source())
        corpus = fixtures / "corpus"
        cases = {
            "corpus": ([corpus], f"corpus ({len(list(corpus.glob('*.py')))} files)"),
            "fixtures": ([fixtures], f"fixtures ({len(list(fixtures.rglob('*.py')))} files)"),
            "model": ([model], f"model file ({model.read_text().count(chr(10))} lines)"),
        }
        print("CPU seconds (wall seconds), medians")
        print("| target | plugin | cold | warm | edit |")
        print("|---|---|---|---|---|")
        for key in args.only.split(","):
            targets, label = cases[key]
            results = measure(work, key, targets, args.repeat, args.cold_repeat)
            for plugin in (False, True):
                r = results[plugin]
                cells = " | ".join(
                    f"{r[k][0]:.2f} ({r[k][1]:.2f})" for k in ("cold", "warm", "edit")
                )
                print(f"| {label} | {'yes' if plugin else 'no'} | {cells} |", flush=True)
            on, off = results[True], results[False]
            print(
                f"| {label} | overhead | {100 * (on['cold'][0] / off['cold'][0] - 1):+.0f}% | "
                f"{on['warm'][0] - off['warm'][0]:+.2f} s | {on['edit'][0] - off['edit'][0]:+.2f} s |",
                flush=True,
            )
    for module in ("shapegrad_mypy", "shapegrad.mypy_plugin", "mypy.checker"):
        print(f"import {module}: {1000 * import_time(module):.0f} ms")


if __name__ == "__main__":
    main()
