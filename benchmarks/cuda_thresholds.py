"""Where the CUDA backend's schedule thresholds should sit, measured on the GPU at hand.

Two choices in the CUDA schedule are guesses until this runs on a GPU:

* ``CUDA_TARGET.contract_min_macs`` (``compiler/target.py``): the smallest product sent
  to cuBLAS; smaller ones become generated loop kernels (one thread per output element,
  with fused epilogues in real programs).
* ``TREE_MIN_REDUCED`` / ``TREE_MAX_OUTPUTS`` (``backends/cuda/render.py``): a ``Reduce``
  runs as a block tree (one block per output point) when it reduces at least
  ``TREE_MIN_REDUCED`` elements into at most ``TREE_MAX_OUTPUTS`` points; otherwise each
  thread reduces one point alone.

For each size this builds both variants of a one-op program (``a @ b`` as loops / as
cuBLAS; ``x.sum(axis=1)`` as a tree / per thread) through the backend's own pipeline,
renderer, nvcc build and executable, captures ``K`` steps of it in one CUDA graph (the
way training steps run) and times graph replays: the per-step figure is the op's cost
inside a step, launch gaps included. It prints one table per choice and the crossover.

Run (on a machine with an NVIDIA GPU, nvcc, pycuda and cuBLAS); about 30-50 s on an H200
with 16 cores, most of it the parallel nvcc builds:
    python benchmarks/cuda_thresholds.py
    python benchmarks/cuda_thresholds.py --check   # no GPU: lower, render, nvcc -cubin
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

import shapegrad as sg
from shapegrad.backends.cuda.render import (
    INCLUDES,
    TREE_MAX_OUTPUTS,
    TREE_MIN_REDUCED,
    TREE_MIN_REDUCED_WIDE,
    TREE_WIDE_OUTPUTS,
    launches_per_step,
    render_cuda,
    render_cuda_unit,
    uses_cublas,
)
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import CUDA_TARGET
from shapegrad.ir import Graph

K = 32  # steps per captured graph
NEVER = 1 << 62
# (m, k, n): products a[m, k] @ b[k, n], from the moons step's sizes to a small MLP's
PRODUCTS = [
    (10, 16, 16),
    (16, 16, 16),
    (32, 32, 32),
    (128, 16, 16),
    (64, 64, 64),
    (128, 64, 64),
    (128, 128, 128),
    (512, 128, 128),
    (256, 256, 256),
    (1024, 256, 256),
    (512, 512, 512),
]
# (outputs, reduced): x[outputs, reduced].sum(axis=1); at most 2**26 elements (256 MB)
REDUCTIONS = [
    (o, r)
    for o in (1, 16, 256, 4096, 65536, 262144)
    for r in (16, 64, 256, 1024, 4096, 16384)
    if o * r <= 1 << 26
]


@dataclass
class Variant:
    """One program to time: ``label`` names the schedule, ``size`` the case."""

    kind: str  # "product" or "reduction"
    size: tuple[int, ...]
    label: str  # "loops" / "cublas" or "tree" / "thread"
    graph: Graph
    program: L.Program
    source: str
    tree: tuple[int, int] | None = None  # forced block-tree thresholds (reductions)


def _graph(fn: Callable[..., Any], *arrays: np.ndarray) -> Graph:
    graph: Graph = sg.compile(fn, backend="numpy").graph(*arrays)
    return graph


def _has_contract(program: L.Program) -> bool:
    return uses_cublas(program)


def _has_tree(source: str) -> bool:
    return "sg_block_reduce<" in source.split("#define SG_NSLOTS", 1)[1]


def variants() -> list[Variant]:
    """Every (case, schedule) pair, lowered and rendered; each checked to be what it says."""
    out: list[Variant] = []
    rng = np.random.default_rng(0)
    targets = {"loops": CUDA_TARGET.replace(contract_min_macs=NEVER)}
    targets["cublas"] = CUDA_TARGET.replace(contract_min_macs=0)
    for m, k, n in PRODUCTS:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        graph = _graph(lambda a, b: a @ b, a, b)
        for label, target in targets.items():
            program, _ = lower_program(graph, target, f"mm{m}x{k}x{n}_{label}")
            assert _has_contract(program) == (label == "cublas"), (m, k, n, label)
            out.append(Variant("product", (m, k, n), label, graph, program, render_cuda(program)))
    trees = {"tree": (0, NEVER), "thread": (NEVER, 0)}
    for outputs, reduced in REDUCTIONS:
        x = np.ones((outputs, reduced), np.float32)
        graph = _graph(lambda x: x.sum(axis=1), x)
        for label, tree in trees.items():
            program, _ = lower_program(graph, CUDA_TARGET, f"sum{outputs}x{reduced}_{label}")
            source = render_cuda(program, tree=tree)
            assert _has_tree(source) == (label == "tree"), (outputs, reduced, label)
            out.append(
                Variant("reduction", (outputs, reduced), label, graph, program, source, tree)
            )
    return out


def check(all_variants: list[Variant]) -> None:
    """Without a GPU: every variant's source through ``nvcc -cubin`` (a few translation
    units, one namespace per program)."""
    from shapegrad.backends.cuda.toolchain import compile_check

    chunk = 16
    for start in range(0, len(all_variants), chunk):
        units = [
            render_cuda_unit(v.program, namespace=f"v{start + i}", tree=v.tree)
            for i, v in enumerate(all_variants[start : start + chunk])
        ]
        compile_check(INCLUDES + "\n".join(units))
    print(f"{len(all_variants)} variants lowered, rendered and compiled (nvcc -cubin)")


def build_all(all_variants: list[Variant], arch: str) -> list[str]:
    """Launcher libraries of every variant, built in parallel (nvcc runs in subprocesses)."""
    from shapegrad.backends.cuda.toolchain import build_launcher, make_spec

    def build(v: Variant) -> str:
        return build_launcher(make_spec(v.source, arch, uses_cublas(v.program)))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        return list(pool.map(build, all_variants))


_DATA: dict[tuple[int, ...], np.ndarray] = {}


def _data(shape: tuple[int, ...]) -> np.ndarray:
    """Random inputs, made once per shape (the largest are 256 MB)."""
    if shape not in _DATA:
        _DATA[shape] = np.random.default_rng(1).random(shape, dtype=np.float32) - 0.5
    return _DATA[shape]


def time_variant(v: Variant, path: str, device: Any, budget: float = 0.02) -> float:
    """Seconds per step: ``K`` steps captured in one CUDA graph, replays timed (best of 3)."""
    from shapegrad.backends.cuda.executable import CudaExecutable, _void
    from shapegrad.backends.cuda.launcher import ffi, load_launcher
    from shapegrad.backends.cuda.toolchain import make_spec

    key = make_spec(v.source, device.info.arch, uses_cublas(v.program)).key
    lib = load_launcher(path, key)
    exe = CudaExecutable(v.graph, v.program, lib, path, device, launches_per_step(v.program))
    for i, node in enumerate(v.graph.inputs):
        device.upload(exe._buffers[exe._slot_of_input[i]], _data(node.shape))
    f = ffi()
    steps = f.new("int64_t[]", exe.n_slots)  # every step on the same buffers
    handle = f.new("void **")
    stream = _void(device.stream_handle)
    with device.active():
        rc = lib.sg_graph_build(
            exe.io, exe._arena_ptr, exe._err_ptr, stream, exe.blas, K, steps, handle
        )
    exe.raise_launch_error(rc)

    def replays(n: int) -> float:
        device.sync()
        start = time.perf_counter()
        with device.active():
            for _ in range(n):
                exe.raise_launch_error(lib.sg_graph_launch(handle[0], stream))
        device.sync()
        return time.perf_counter() - start

    replays(2)  # warm up (first replay uploads the graph)
    once = max(replays(1), 1e-6)
    n = max(1, int(budget / once))
    best = min(replays(n) for _ in range(3)) / (n * K)
    exe.finish(1)
    lib.sg_graph_free(handle[0])
    return best


def _table(title: str, rows: list[tuple[str, float, float]], names: tuple[str, str]) -> None:
    print(f"\n{title}")
    print(f"{'case':>22} {names[0]:>10} {names[1]:>10}  faster")
    for case, first, second in rows:
        win = names[0] if first <= second else names[1]
        print(
            f"{case:>22} {first * 1e6:9.2f}u {second * 1e6:9.2f}u  {win} ({max(first, second) / min(first, second):.2f}x)"
        )


def report(times: dict[tuple[str, tuple[int, ...], str], float]) -> None:
    rows = []
    crossover = None  # smallest MACs from which cuBLAS wins at every larger size tried
    products = sorted(PRODUCTS, key=math.prod)
    for size in products:
        loops, blas = times[("product", size, "loops")], times[("product", size, "cublas")]
        rows.append((f"{size[0]}x{size[1]}x{size[2]} ({math.prod(size)})", loops, blas))
    for i, size in enumerate(products):
        if all(
            times[("product", s, "cublas")] < times[("product", s, "loops")] for s in products[i:]
        ):
            crossover = math.prod(size)
            break
    _table("products a[m,k] @ b[k,n], per step (m x k x n (MACs))", rows, ("loops", "cuBLAS"))
    print(
        f"crossover: cuBLAS wins from {crossover} MACs on"
        if crossover is not None
        else "crossover: loops win at the largest size tried"
    )
    print(f"current CUDA_TARGET.contract_min_macs = {CUDA_TARGET.contract_min_macs}")

    rows = []
    for outputs, reduced in REDUCTIONS:
        tree = times[("reduction", (outputs, reduced), "tree")]
        thread = times[("reduction", (outputs, reduced), "thread")]
        rows.append((f"{outputs} x {reduced}", tree, thread))
    _table("reductions x[outputs, reduced].sum(axis=1), per step", rows, ("tree", "thread"))
    print("tree wins (per outputs: smallest reduced length from which the tree is faster):")
    for outputs in sorted({o for o, _ in REDUCTIONS}):
        sizes = sorted(r for o, r in REDUCTIONS if o == outputs)
        first = next(
            (
                r
                for i, r in enumerate(sizes)
                if all(
                    times[("reduction", (outputs, s), "tree")]
                    < times[("reduction", (outputs, s), "thread")]
                    for s in sizes[i:]
                )
            ),
            None,
        )
        print(f"  outputs {outputs:>7}: {first if first is not None else 'never (in range)'}")
    print(
        f"current TREE_MIN_REDUCED = {TREE_MIN_REDUCED} (up to {TREE_WIDE_OUTPUTS} outputs), "
        f"TREE_MIN_REDUCED_WIDE = {TREE_MIN_REDUCED_WIDE}, TREE_MAX_OUTPUTS = {TREE_MAX_OUTPUTS}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="no GPU: lower, render, nvcc -cubin")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    all_variants = variants()
    print(f"{len(all_variants)} variants lowered in {time.perf_counter() - start:.1f} s")
    if args.check:
        check(all_variants)
        return
    from shapegrad.backends.cuda.driver import device_context

    device = device_context(0)
    if not os.environ.get("XDG_CACHE_HOME"):  # a throwaway cache: nothing left behind
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="sg-thresholds-")
    built = time.perf_counter()
    paths = build_all(all_variants, device.info.arch)
    print(
        f"built in {time.perf_counter() - built:.1f} s on {device.info.name} ({device.info.arch})"
    )
    times = {
        (v.kind, v.size, v.label): time_variant(v, path, device)
        for v, path in zip(all_variants, paths, strict=True)
    }
    report(times)
    print(f"\ntotal {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
