"""The CUDA backend without a GPU: generated source for every op-table case and the training
steps compiles with ``nvcc -cubin -arch=sm_90``; golden sources for a few kernels; the
host launcher builds and loads; without pycuda/a GPU the backend says what is missing.

What needs a GPU (values vs eager, training parity, K-step runs, IndexError on the
device) is in tests/test_cuda_gpu.py, skipped here with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from harness import Case
from op_table import CASES
from shapegrad.backends.base import BackendUnavailable, get_backend
from shapegrad.backends.cuda import generate
from shapegrad.backends.cuda.render import INCLUDES, render_cuda_unit
from shapegrad.backends.cuda.toolchain import compile_check, nvcc
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import CUDA_TARGET

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc not found (no CUDA toolkit)")
GOLDEN = Path(__file__).parent / "golden" / "cuda"


def _graph(fn: Any, *args: Any) -> Any:
    return sg.compile(fn, backend="numpy").graph(*args)


def _program(fn: Any, *args: Any) -> L.Program:
    return generate(_graph(fn, *args))[0]


def _compile_together(programs: list[L.Program]) -> None:
    """All programs in one translation unit (one namespace each): one nvcc run."""
    units = [render_cuda_unit(p, namespace=f"p{n}") for n, p in enumerate(programs)]
    compile_check(INCLUDES + "\n".join(units))


def _case_programs(cases: list[Case]) -> list[L.Program]:
    programs = []
    for case in cases:
        arrays = case.arrays()
        f32 = [a.astype(np.float32) if a.dtype.kind == "f" else a for a in arrays]
        programs.append(_program(case.fn, *f32))
        if case.grad:
            positions = case.diff_positions(arrays)
            ct_shape = np.shape(case.ref(*arrays))
            ct = np.random.default_rng(0).standard_normal(ct_shape)

            def loss(*xs: Any, fn: Any = case.fn) -> Any:
                *args, cot = xs
                return (fn(*args) * cot).sum()

            grad = sg.grad(loss, argnums=positions) if positions else None
            if grad is not None:
                programs.append(_program(grad, *arrays, ct))
    return programs


@needs_nvcc
@pytest.mark.parametrize("chunk", range(4))
def test_every_op_table_case_compiles_with_nvcc(chunk: int) -> None:
    cases = CASES[chunk::4]
    _compile_together(_case_programs(cases))


# --- whole training steps -----------------------------------------------------------------


def _sgd(loss: Any) -> Any:
    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return [p - 0.05 * g for p, g in zip(params, grads, strict=True)], value

    return step


def _init(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in shapes]


def _mlp(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = x
    for i in range(0, len(params) - 2, 2):
        h = sg.relu(h @ params[i] + params[i + 1])
    logits = h @ params[-2] + params[-1]
    return sg.cross_entropy(logits, y) if y.dtype == sg.int32 else sg.hinge(logits.reshape(-1), y)


def _cnn(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(sg.conv2d(x, w1, padding=1) + b1.reshape((1, -1, 1, 1)))
    h = sg.max_pool2d(h, 2)
    h = sg.relu(sg.conv2d(h, w2, padding=1) + b2.reshape((1, -1, 1, 1)))
    return sg.cross_entropy(h.mean(axis=(2, 3)) @ w3 + b3, y)


def _embedding_ce(params: list[sg.Tensor], tokens: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    table, w, b = params
    h = sg.embedding(table, tokens).mean(axis=1)
    return sg.cross_entropy(h @ w + b, y)


def _training_steps() -> dict[str, L.Program]:
    rng = np.random.default_rng(1)
    moons = _init([(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)])
    mlp = _init([(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)])
    cnn = _init([(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (32, 10), (10,)])
    emb = _init([(65, 32), (32, 65), (65,)])
    return {
        "moons": generate(
            _graph(
                _sgd(_mlp), moons, rng.random((10, 2), dtype=np.float32), np.ones(10, np.float32)
            )
        )[0],
        "mlp": generate(
            _graph(
                _sgd(_mlp),
                mlp,
                rng.random((128, 784), dtype=np.float32),
                rng.integers(0, 10, 128).astype(np.int32),
            )
        )[0],
        "cnn": generate(
            _graph(
                _sgd(_cnn),
                cnn,
                rng.random((64, 1, 28, 28), dtype=np.float32),
                rng.integers(0, 10, 64).astype(np.int32),
            )
        )[0],
        "embedding": generate(
            _graph(
                _sgd(_embedding_ce),
                emb,
                rng.integers(0, 65, (32, 16)).astype(np.int32),
                rng.integers(0, 65, 32).astype(np.int32),
            )
        )[0],
    }


@needs_nvcc
def test_training_steps_compile_with_nvcc() -> None:
    programs = _training_steps()
    # the big products go to cuBLAS, the moons step's tiny ones stay fused loops
    assert any(isinstance(s, L.Contract) for k in programs["mlp"].kernels for s in L.walk(k.body))
    assert not any(
        isinstance(s, L.Contract) for k in programs["moons"].kernels for s in L.walk(k.body)
    )
    _compile_together(list(programs.values()))


@needs_nvcc
def test_host_launcher_builds_and_loads_without_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shapegrad.backends.c.toolchain import compiler_version, library_for
    from shapegrad.backends.cuda.launcher import load_launcher
    from shapegrad.backends.cuda.toolchain import build_launcher, make_spec

    program = _training_steps()["moons"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = make_spec(render_source(program), "sm_90", uses_cublas=False)
    assert "release" in compiler_version(str(nvcc()))
    path = build_launcher(spec)
    assert library_for(spec)[1]  # the second call is a verified cache hit
    lib = load_launcher(path, spec.key)  # static CUDA runtime: loads without a driver
    assert lib.sg_enqueue_steps and lib.sg_graph_build and lib.sg_graph_launch


def render_source(program: L.Program) -> str:
    from shapegrad.backends.cuda.render import render_cuda

    return render_cuda(program)


# --- golden sources -------------------------------------------------------------------------


def _golden_programs() -> dict[str, L.Program]:
    rng = np.random.default_rng(2)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    labels = np.array([1, 0, 3, 2], np.int32)
    return {
        "matmul_bias_relu": _program(
            lambda x, w, b: sg.relu(x @ w + b), f32(4, 8), f32(8, 6), f32(6)
        ),
        "softmax_ce_backward": _program(
            lambda z: sg.grad(lambda z: sg.cross_entropy(z, labels))(z), f32(4, 5)
        ),
        "full_reduction": _program(lambda x: (x * x).mean(), f32(4096)),
        "scatter_add": _program(
            lambda t: sg.grad(lambda t: (sg.take(t, labels, axis=0) ** 2).sum())(t), f32(4, 3)
        ),
    }


@pytest.mark.parametrize("name", list(_golden_programs()))
def test_generated_source_matches_golden(name: str) -> None:
    from shapegrad.backends.cuda.render import render_cuda

    source = render_cuda(_golden_programs()[name])
    path = GOLDEN / f"{name}.cu"
    if os.environ.get("SHAPEGRAD_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    assert source == path.read_text(encoding="utf-8"), (
        f"{path} differs from the generated source; if the change is intended, "
        "rerun with SHAPEGRAD_UPDATE_GOLDEN=1 and review the diff"
    )


def test_golden_sources_show_the_gpu_schedule() -> None:
    from shapegrad.backends.cuda.render import render_cuda

    programs = _golden_programs()
    fused = render_cuda(programs["matmul_bias_relu"])
    assert fused.count("__global__") == 1  # product, bias and ReLU in one kernel
    assert "sg_maxf" in fused and "threadIdx.x" in fused
    full = render_cuda(programs["full_reduction"])
    assert "sg_block_reduce" in full and "grid 1 x block 256" in full  # a tree, not one thread
    scatter = render_cuda(programs["scatter_add"])
    assert "atomicAdd(" in scatter
    assert "atomicCAS(&sg_err[0], 0," in scatter  # the error-flag contract


# --- without a GPU ----------------------------------------------------------------------


def _has_gpu() -> bool:
    from shapegrad.backends.cuda.driver import availability

    return availability()[0]


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: nothing is unavailable here")
def test_without_a_gpu_the_backend_says_what_is_missing() -> None:
    with pytest.raises(BackendUnavailable, match="cuda"):
        get_backend("cuda")
    fn = sg.compile(lambda x: x * 2.0, backend="cuda")
    with pytest.raises(BackendUnavailable, match=r"pycuda|driver|GPU"):
        fn(sg.tensor(np.ones(3, np.float32)))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_nvcc_reports_a_clear_error_for_bad_source() -> None:
    from shapegrad.backends.cuda.toolchain import NvccError

    with pytest.raises(NvccError, match="nvcc -cubin -arch=sm_90 failed"):
        compile_check("__global__ void broken( {")
    assert subprocess.run(["nvcc", "--version"], capture_output=True).returncode == 0


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: nothing is unavailable here")
def test_trainer_on_cuda_raises_without_a_gpu_unless_asked_to_fall_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shapegrad.models import MoonsMLP

    params = MoonsMLP.init(sg.nn.init.kaiming, seed=0, h=4)

    def loss(p: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return sg.hinge(sg.nn.mlp(p, x).reshape((x.shape[0],)), y)

    with pytest.raises(BackendUnavailable, match="backend 'cuda' cannot run here"):
        sg.ScalarTrainer(loss, params, mode="compiled", backend="cuda")
    trainer = sg.ScalarTrainer(loss, params, mode="compiled", backend="cuda", fallback="numpy")
    assert trainer.backend == "numpy"
    assert "falling back to 'numpy'" in capsys.readouterr().out


@pytest.mark.skipif(_has_gpu(), reason="a GPU is present: cuda is available here")
def test_cuda_is_known_but_not_listed_as_available_without_a_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from shapegrad import cli
    from shapegrad.backends import available_backends, backend_status, known_backends

    assert "cuda" in known_backends() and "cuda" not in available_backends()
    assert "pycuda" in backend_status()["cuda"] or "GPU" in backend_status()["cuda"]
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "(not: cuda)" in " ".join(capsys.readouterr().out.split())


# --- layer loops (sg.scan, transformer_stack(loop=True)) -----------------------------------


def _scan_layer(h: sg.Tensor, wb: tuple[sg.Tensor, sg.Tensor]) -> tuple[sg.Tensor, sg.Tensor]:
    w, b = wb
    out = sg.tanh(h @ w.T + b)
    return out, (out * out).mean()


def _scan_step_program(layers: int, policy: str = "recompute") -> L.Program:
    """value_and_grad of a scanned tanh MLP (6x6 layers: loops, no cuBLAS)."""
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(layers, 6, 6)) * 0.6).astype(np.float32)
    b = (rng.normal(size=(layers, 6)) * 0.1).astype(np.float32)
    x = rng.normal(size=(3, 6)).astype(np.float32)

    def loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, ys = sg.scan(_scan_layer, x, (w, b), policy=policy)
        return (h * h).sum() + ys.sum()

    return _program(sg.value_and_grad(loss, argnums=(0, 1)), w, b, x)


def _transformer_step_program(layers: int) -> L.Program:
    """An SGD step through ``transformer_stack(loop=True)`` (d=64: products go to cuBLAS)."""
    from shapegrad.nn.transformer import BlockStack, block_init, transformer_stack

    stack = BlockStack.init(block_init(0.3), seed=1, layers=layers, d=64, f=256, dtype="float32")
    params = [np.asarray(p.numpy()) for p in stack]
    x = np.random.default_rng(2).normal(size=(4, 32, 64)).astype(np.float32)

    def loss(params: list[sg.Tensor], x: sg.Tensor) -> sg.Tensor:
        out = transformer_stack(params, x, heads=4, causal=True, loop=True)
        return (out * out).mean()

    def step(params: list[sg.Tensor], x: sg.Tensor) -> Any:
        value, grads = sg.value_and_grad(loss)(params, x)
        return [p - 0.01 * g for p, g in zip(params, grads, strict=True)], value

    return _program(step, params, x)


def _layer_functions(source: str) -> list[str]:
    """The text of each ``sg_layerN`` host function."""
    starts = [m.start() for m in re.finditer(r"^/\* layer body ", source, re.M)]
    return [source[s : source.index("\n}\n", s)] for s in starts]


@needs_nvcc
@pytest.mark.parametrize("policy", ["recompute", "residuals"])
def test_scan_body_is_rendered_once_whatever_the_depth(policy: str) -> None:
    from shapegrad.backends.cuda.render import launches_per_step, render_cuda

    small, deep = _scan_step_program(2, policy), _scan_step_program(16, policy)
    small_src, deep_src = render_cuda(small), render_cuda(deep)
    # same kernels and host code: only loop bounds, offsets and buffer sizes differ
    assert re.sub(r"[0-9]+", "N", deep_src) == re.sub(r"[0-9]+", "N", small_src)
    assert len(_layer_functions(deep_src)) == 2  # the forward and the backward body
    assert "for (int64_t sg_i = 0; sg_i < 16; ++sg_i)" in deep_src
    # the captured graph does grow: every layer's launches are enqueued
    per_layer = (launches_per_step(deep) - launches_per_step(small)) // 14
    assert per_layer >= 2
    assert launches_per_step(deep) == launches_per_step(small) + 14 * per_layer
    compile_check(deep_src)


@needs_nvcc
def test_transformer_loop_source_does_not_grow_with_depth() -> None:
    from shapegrad.backends.cuda.render import render_cuda, uses_cublas

    small, deep = _transformer_step_program(2), _transformer_step_program(16)
    small_src, deep_src = render_cuda(small), render_cuda(deep)
    assert len(deep_src) < 1.3 * len(small_src)
    assert deep_src.count("__global__") == small_src.count("__global__")
    bodies = _layer_functions(deep_src)
    assert bodies and any("cublasGemmStridedBatchedEx(blas" in b for b in bodies)
    # the body's products are found inside the layer loop: the launcher links cuBLAS
    assert uses_cublas(deep) and "#define SG_USES_CUBLAS 1" in deep_src
    compile_check(deep_src)


def _nested_scan_program() -> L.Program:
    """A scan whose body scans again (blocks of sub-layers), with its gradient."""
    rng = np.random.default_rng(5)
    w = (rng.normal(size=(3, 2, 6, 6)) * 0.5).astype(np.float32)
    x = rng.normal(size=(4, 6)).astype(np.float32)

    def inner(h: sg.Tensor, wl: sg.Tensor) -> tuple[sg.Tensor, None]:
        return sg.tanh(h @ wl), None

    def outer(h: sg.Tensor, ws: sg.Tensor) -> tuple[sg.Tensor, None]:
        return sg.scan(inner, h, ws)[0], None

    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, _ = sg.scan(outer, x, w)
        return (h * h).sum()

    return _program(sg.value_and_grad(loss), w, x)


@needs_nvcc
def test_nested_layer_loops_compile() -> None:
    from shapegrad.backends.cuda.render import render_cuda

    source = render_cuda(_nested_scan_program())
    bodies = _layer_functions(source)
    assert len(bodies) >= 4  # outer and inner bodies, forward and backward
    # an outer body calls an inner one, declared before the definitions
    assert any(re.search(r"sg_layer\d+\(sg_sub,", b) for b in bodies)
    assert source.index("void *blas, int64_t t);") < source.index("/* layer body")
    compile_check(source)


@needs_nvcc
def test_checkpoint_regions_render_as_layer_loops() -> None:
    from shapegrad.backends.cuda.render import render_cuda

    x, w = np.ones((4, 6), np.float32), np.full((6, 6), 0.1, np.float32)

    def block(h: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return sg.gelu(h @ w) + sg.tanh(h) * 0.5

    def loss(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (sg.checkpoint(block)(sg.checkpoint(block)(x, w), w) ** 2).mean()

    source = render_cuda(_program(sg.grad(loss, argnums=(0, 1)), x, w))
    assert _layer_functions(source)
    compile_check(source)


@needs_nvcc
def test_scan_launcher_builds_and_loads_without_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host side of a layer loop (pointer arithmetic, sg_layerN calls) links."""
    from shapegrad.backends.cuda.launcher import load_launcher
    from shapegrad.backends.cuda.render import render_cuda, uses_cublas
    from shapegrad.backends.cuda.toolchain import build_launcher, make_spec

    program = _scan_step_program(4)
    assert not uses_cublas(program)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    spec = make_spec(render_cuda(program), "sm_90", uses_cublas=False)
    lib = load_launcher(build_launcher(spec), spec.key)
    assert lib.sg_enqueue_steps and lib.sg_graph_build


# --- elementwise fusion ---------------------------------------------------------------------

UNFUSED = CUDA_TARGET.replace(skip_stages=frozenset({"fuse_elementwise_kernels"}))


def _gelu_grad_graph() -> Any:
    x = np.random.default_rng(3).standard_normal((64, 300)).astype(np.float32)
    return _graph(lambda x: sg.grad(lambda x: sg.gelu(x).sum())(x), x)


def _adam_step(
    params: list[sg.Tensor], m: list[sg.Tensor], v: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor
) -> Any:
    """One Adam step (bias correction folded into the rate): the new moments are read by
    the parameter update, so each parameter's update is several elementwise kernels."""
    value, grads = sg.value_and_grad(_mlp)(params, x, y)
    m2 = [0.9 * a + 0.1 * g for a, g in zip(m, grads, strict=True)]
    v2 = [0.999 * a + 0.001 * (g * g) for a, g in zip(v, grads, strict=True)]
    new = [p - 0.01 * a / (sg.sqrt(b) + 1e-8) for p, a, b in zip(params, m2, v2, strict=True)]
    return new, m2, v2, value


def _adam_graph() -> Any:
    params = _init([(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)])
    zeros = [np.zeros_like(p) for p in params]
    rng = np.random.default_rng(4)
    x = rng.random((10, 2), dtype=np.float32)
    y = np.sign(rng.standard_normal(10)).astype(np.float32)
    return _graph(_adam_step, params, zeros, zeros, x, y)


@needs_nvcc
def test_elementwise_fusion_runs_for_cuda_and_compiles() -> None:
    from shapegrad.backends.base import CompileOptions
    from shapegrad.backends.cuda.options import CudaOptions

    unfused = CompileOptions(backend_options=CudaOptions(target=UNFUSED))
    gelu, gelu_before = generate(_gelu_grad_graph())[0], generate(_gelu_grad_graph(), unfused)[0]
    adam, adam_before = generate(_adam_graph())[0], generate(_adam_graph(), unfused)[0]
    assert len(gelu.kernels) == 1 < len(gelu_before.kernels)  # GELU backward: one pass
    assert len(adam.kernels) < len(adam_before.kernels)
    merged = [k for k in adam.kernels if " + " in k.root]  # roots joined by the merge
    assert merged
    source = render_source(adam)
    for k in merged:  # a merged nest maps onto the grid whole: one launch, no loop inside
        start = source.index(f"/* {k.name}: {k.root};")
        function = source[start : source.index("\n}\n", start)]
        assert function.count("__global__") == 1 and "for (" not in function
        assert function.count("] = ") == sum(isinstance(s, L.Store) for s in L.walk(k.body))
    _compile_together([gelu, adam])


def _bias_then_flat(x: sg.Tensor, b: sg.Tensor) -> Any:
    """A broadcast (2-axis nest) whose output flat elementwise kernels read back."""
    h = x + b
    return h, sg.tanh(h) * 2.0 + h, sg.exp(h)


@needs_nvcc
def test_fused_nest_over_two_axes_maps_onto_the_grid() -> None:
    """Flat kernels merged into a 2-axis nest (their index flattened to ``32*i + j``): one
    launch whose thread index decomposes into both axes."""
    rng = np.random.default_rng(6)
    x, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32)
    program = _program(_bias_then_flat, x, b.astype(np.float32))
    (kernel,) = program.kernels
    outer = kernel.body[0]
    assert isinstance(outer, L.Loop) and isinstance(outer.body[0], L.Loop)
    assert sum(isinstance(s, L.Store) for s in L.walk(kernel.body)) == 3
    source = render_source(program)
    assert source.count("<<<") == 1 and "if (sg_gid >= 2048) return;" in source
    assert "(sg_gid / 1) % 32;" in source and "(sg_gid / 32) % 64;" in source
    compile_check(source)


@needs_nvcc
def test_threshold_benchmark_variants_are_what_they_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/cuda_thresholds.py (run on a GPU) builds each case both ways; here its
    variants are lowered, checked to differ as labelled, and compiled."""
    import importlib.util

    path = Path(__file__).parent.parent / "benchmarks" / "cuda_thresholds.py"
    spec = importlib.util.spec_from_file_location("cuda_thresholds", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cuda_thresholds", bench)  # dataclasses look it up
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "PRODUCTS", [(16, 16, 16), (128, 128, 128)])
    monkeypatch.setattr(bench, "REDUCTIONS", [(1, 4096), (4096, 64)])
    variants = bench.variants()  # asserts each variant's schedule (cuBLAS or not, tree or not)
    assert [(v.size, v.label) for v in variants][:2] == [
        ((16, 16, 16), "loops"),
        ((16, 16, 16), "cublas"),
    ]
    trees = {
        (v.size, v.label): "sg_block_reduce<" in v.source.split("SG_NSLOTS")[1]
        for v in variants
        if v.kind == "reduction"
    }
    assert trees == {
        ((1, 4096), "tree"): True,
        ((1, 4096), "thread"): False,
        ((4096, 64), "tree"): True,
        ((4096, 64), "thread"): False,
    }
    bench.check(variants)
