"""Ahead-of-time CUDA builds without a GPU: the launcher of a training step whose products go
to cuBLAS is generated, compiled by nvcc and cached on a machine with nvcc but no driver or
pycuda (CI's), and the library it needs is found in NVIDIA's wheel layouts and the toolkit.

Where the real cuBLAS is absent, the test links against a stub ``libcublas.so.13`` made here
with the real soname: the launcher must record that soname (it is a shared library whose
undefined cuBLAS symbols resolve at load time on the GPU machine). Skipped without nvcc.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import BackendUnavailable, CompileOptions
from shapegrad.backends.c.toolchain import CompileError, compiler
from shapegrad.backends.cuda import CudaBackend, build_program
from shapegrad.backends.cuda import toolchain as tc
from shapegrad.backends.cuda.render import CUBLAS_DECL

pytestmark = pytest.mark.skipif(tc.nvcc() is None, reason="no nvcc (CUDA toolkit)")

SONAME = "libcublas.so.13"


def _stub_cublas(folder: Path) -> Path:
    """A shared library named and sonamed like cuBLAS 13 that exports the functions the
    generated launcher declares (bodies that do nothing: it is only linked, never run)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "stub.c"
    names = re.findall(r'extern "C" int (\w+)\(', CUBLAS_DECL)
    assert names, "the launcher declares no cuBLAS function"
    src.write_text("".join(f"int {n}(void) {{ return 0; }}\n" for n in names))
    lib = folder / SONAME
    subprocess.run(
        [compiler(), "-shared", "-fPIC", f"-Wl,-soname,{SONAME}", str(src), "-o", str(lib)],
        check=True,
        capture_output=True,
    )
    src.unlink()
    return lib


def _mlp_step() -> tuple[Any, tuple[Any, ...]]:
    def loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        w1, b1, w2, b2, w3, b3 = params
        h = sg.relu(x @ w1 + b1)
        h = sg.relu(h @ w2 + b2)
        return sg.cross_entropy(h @ w3 + b3, y)

    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return [p - 0.1 * g for p, g in zip(params, grads, strict=True)], value

    rng = np.random.default_rng(0)
    shapes = [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    x = rng.random((128, 784), dtype=np.float32)
    y = rng.integers(0, 10, 128).astype(np.int32)
    return step, (params, x, y)


def _mlp_step_graph() -> Any:
    step, args = _mlp_step()
    return sg.compile(step, backend="numpy").lower(*args).graph


def _needed(path: str) -> list[str]:
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("no readelf (binutils)")
    out = subprocess.run([readelf, "-d", path], check=True, capture_output=True, text=True)
    return [line.split("[")[1].rstrip("]") for line in out.stdout.splitlines() if "NEEDED" in line]


@pytest.fixture
def cublas_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real cuBLAS where installed, else a stub in a fake ``nvidia/cu13/lib`` tree."""
    real = tc.cublas_library()
    if real is not None:
        return Path(real)
    root = tmp_path / "site" / "nvidia"
    lib = _stub_cublas(root / "cu13" / "lib")
    monkeypatch.setattr(tc, "wheel_roots", lambda: [str(root)])
    return lib


def test_mlp_training_step_launcher_builds_without_a_gpu(
    cublas_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    graph = _mlp_step_graph()
    start = time.perf_counter()
    built = build_program(graph, CompileOptions(name="mlp_step"), default_arch="sm_90")
    seconds = time.perf_counter() - start
    assert seconds < 60, f"the launcher took {seconds:.1f} s to build"
    assert built.path.startswith(str(tmp_path / "cache"))
    assert "cublasGemmStridedBatchedEx(blas" in built.spec.source  # products go to cuBLAS
    needed = _needed(built.path)
    assert any(n.startswith("libcublas.so") for n in needed), needed
    # The backend's public hook: a second build is the verified cached library.
    again = CudaBackend().build(graph, CompileOptions(name="mlp_step"))
    assert os.path.samefile(again, built.path)


def test_public_staged_build_prebuilds_the_launcher(
    cublas_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sg.compile(f, backend="cuda").trace(*args).lower().build()``: generated, compiled
    and cached on a machine with nvcc but no GPU or pycuda; the source is there to read."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    step, args = _mlp_step()
    lowered = sg.compile(step, backend="cuda", arch="sm_90").trace(*args).lower()
    assert "__global__" in lowered.source and "cublasGemmStridedBatchedEx" in lowered.source
    path = lowered.build()
    assert path.startswith(str(tmp_path / "cache")) and os.path.exists(path)
    assert any(n.startswith("libcublas.so") for n in _needed(path))


def test_link_line_never_feeds_the_library_to_nvcc_as_source(cublas_wheel: Path) -> None:
    link = tc.cublas_link(str(cublas_wheel))
    assert str(cublas_wheel) not in link  # after `-x cu` a path is compiled as CUDA source
    assert f"-l:{cublas_wheel.name}" in link
    assert f"-L{cublas_wheel.parent}" in link


@pytest.mark.parametrize("layout", ["cu13/lib", "cu12/lib", "cublas/lib"])
def test_cublas_found_in_each_wheel_layout(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "nvidia"
    lib = _stub_cublas(root / layout)
    (root / layout / "libcublasLt.so.13").write_bytes(b"")  # never mistaken for cuBLAS
    assert tc.cublas_library(roots=[str(root)], homes=[]) == str(lib)


def test_cublas_found_in_the_toolkit_when_no_wheel(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    lib = _stub_cublas(home / "targets" / "x86_64-linux" / "lib")
    assert tc.cublas_library(roots=[str(tmp_path / "empty")], homes=[str(home)]) == str(lib)
    assert tc.cublas_library(roots=[], homes=[str(tmp_path / "nothing")]) is None


def test_missing_cublas_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tc, "cublas_library", lambda *a, **k: None)
    with pytest.raises(BackendUnavailable, match="cuBLAS"):
        build_program(_mlp_step_graph(), CompileOptions(name="m"), default_arch="sm_90")


def test_a_build_past_its_time_limit_names_the_kept_source_and_command(
    cublas_wheel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SHAPEGRAD_COMPILE_TIMEOUT", "0.01")
    with pytest.raises(CompileError, match=r"longer than 0\.01 s") as info:
        build_program(_mlp_step_graph(), CompileOptions(name="slow"), default_arch="sm_90")
    message = str(info.value)
    kept = message.split("source kept at ")[1].split(";")[0]
    assert kept.endswith(".failed.cu") and os.path.exists(kept)
    assert "nvcc" in message and kept in message.split("command: ")[1]


def test_compile_timeout_setting_is_validated(
    cublas_wheel: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAPEGRAD_COMPILE_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="SHAPEGRAD_COMPILE_TIMEOUT"):
        build_program(_mlp_step_graph(), CompileOptions(name="m"), default_arch="sm_90")


def test_data_parallel_step_exchanges_gradients_through_host_copies() -> None:
    """A data-parallel step on CUDA: each all-reduce waits for the stream, copies the
    gradient to the host, calls MPI (the C backend's exchange) and copies the mean back;
    the launcher exports ``sg_mpi_bind`` and compiles."""
    pytest.importorskip("mpi4py", reason="no mpi4py (pip install -e '.[mpi]')")
    from shapegrad import distributed
    from shapegrad.backends.cuda import generate
    from shapegrad.distributed._mpi import MPICommunicator

    comm = MPICommunicator()
    comm.size = 2  # traced as one rank of two (the exchange is rendered, never run here)

    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        def loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
            w, b = params
            return sg.mse((x @ w).reshape(-1) + b, y)

        value, grads = sg.value_and_grad(loss)(params, x, y)
        grads = [distributed.all_reduce(g, "mean", comm=comm) for g in grads]
        return [p - 0.1 * g for p, g in zip(params, grads, strict=True)], value

    rng = np.random.default_rng(0)
    params = [np.zeros((64, 1), np.float32), np.zeros(1, np.float32)]
    x, y = rng.random((32, 64), dtype=np.float32), rng.random(32, dtype=np.float32)
    graph = sg.compile(step, backend="numpy").lower(params, x, y).graph
    program, source = generate(graph)
    assert program.communicators == [comm]
    assert source.count("over MPI (") == 2  # the weight's and the bias's gradients
    assert source.count("cudaStreamSynchronize(stream)") == 2
    assert 'extern "C" int sg_mpi_bind(' in source
    for n in (64, 1):
        assert f"sg_mpi_allreduce(src, dst, {n}, sg_mpi_handle[SG_MPI_FLOAT32]" in source
    tc.compile_check(source)
