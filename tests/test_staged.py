"""Staged compilation, as in JAX: ``sg.compile(f).trace(*args)`` -> Traced, ``.lower()`` ->
Lowered (optimized graph, loop program, source), ``.compile()`` -> the executable, and
``Lowered.build()`` -> the native artifact in the cache, not loaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.backends.c as cbackend
from shapegrad.backends import native
from shapegrad.backends.c import executable as cexecutable
from shapegrad.compiler import loops as L
from shapegrad.jit import Lowered, Traced

ROOT = Path(__file__).resolve().parents[1]
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def loss(params: dict[str, sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = sg.tanh(x @ params["w"] + params["b"])
    return ((h - y) ** 2).mean()


def _args(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = {
        "w": rng.standard_normal((3, 2)).astype(np.float32),
        "b": rng.standard_normal(2).astype(np.float32),
    }
    return params, rng.standard_normal((5, 3)).astype(np.float32), np.ones((5, 2), np.float32)


def _reference(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[Any, ...]:
    """Value and gradients in float64 NumPy, by hand."""
    w, b = params["w"].astype(np.float64), params["b"].astype(np.float64)
    h = np.tanh(x @ w + b)
    value = ((h - y) ** 2).mean()
    dh = 2 * (h - y) / h.size
    dz = dh * (1 - h**2)
    return value, x.T @ dz, dz.sum(axis=0)


def _flat(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    return [params["w"], params["b"], x, y]  # dict leaves in insertion order, then x, y


def _check(outputs: list[np.ndarray], params: dict[str, np.ndarray], x: Any, y: Any) -> None:
    value, dw, db = _reference(params, x, y)
    np.testing.assert_allclose(outputs[0], value, rtol=1e-5)
    np.testing.assert_allclose(outputs[1], dw, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(outputs[2], db, rtol=1e-4, atol=1e-6)


def test_the_three_stages_on_the_numpy_backend() -> None:
    fast = sg.compile(sg.value_and_grad(loss), backend="numpy")
    args = _args()
    traced = fast.trace(*args)
    assert isinstance(traced, Traced) and fast.trace_count == 1
    assert [n.attr["name"] for n in traced.graph.inputs] == ["params['w']", "params['b']", "x", "y"]
    assert traced.in_tree.num_leaves == 4 and traced.out_tree.num_leaves == 3
    lowered = traced.lower()
    assert isinstance(lowered, Lowered) and lowered.traced is traced.graph
    assert lowered.graph is not traced.graph and lowered.stats  # the passes ran
    assert lowered.program is None and lowered.source is None  # NumPy generates nothing
    exe = lowered.compile()
    assert lowered.compile() is exe and lowered.executable is exe  # compiled once
    _check(exe(_flat(*args)), *args)
    with pytest.raises(TypeError, match="builds no native artifact"):
        lowered.build()
    # trace() neither runs nor fills the call cache: the first call traces again
    value, grads = fast(*args)
    _check([value.numpy(), grads["w"].numpy(), grads["b"].numpy()], *args)
    assert fast.trace_count == 2


@needs_cc
def test_c_source_then_compile_lowers_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SHAPEGRAD_CACHE_DIR", raising=False)
    args = _args(1)
    lowered = sg.compile(sg.value_and_grad(loss), backend="c").trace(*args).lower()
    assert isinstance(lowered.program, L.Program) and lowered.program.kernels
    source = lowered.source
    assert source is not None and "int sg_run(" in source

    def fail(*_: Any, **__: Any) -> Any:
        raise AssertionError("compile() must build what generate() made, not lower again")

    monkeypatch.setattr(cbackend, "lower_program", fail)
    monkeypatch.setattr(cbackend, "render_c_units", fail)
    exe = lowered.compile()
    _check(exe(_flat(*args)), *args)
    assert exe.program is lowered.program  # type: ignore[attr-defined]
    assert {"lower", "render", "cc", "load"} <= set(exe.phase_seconds)  # type: ignore[attr-defined]


@needs_cc
def test_c_build_compiles_into_the_cache_without_loading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("SHAPEGRAD_CACHE_DIR", raising=False)
    args = _args(2)

    def step(params: Any, x: Any, y: Any) -> Any:  # a program no other test compiled
        return sg.value_and_grad(loss)(params, x * 0.8125, y)

    fast = sg.compile(step, backend="c", unit_lines=40, split_min_lines=0)  # several units
    compiles = native.compile_count + native.object_compile_count
    path = fast.trace(*args).lower().build()
    assert Path(path).parent == tmp_path / "shapegrad" and path.endswith(".so")
    assert native.compile_count + native.object_compile_count > compiles
    key = Path(path).stem
    assert key not in cexecutable._LIBS  # built, not loaded
    assert native.cached_library_by_key(key) is not None  # checksummed, complete, ours
    # compiling the same function now finds the library: no compiler runs
    compiles = native.compile_count + native.object_compile_count
    exe = fast.trace(*args).lower().compile()
    assert native.compile_count + native.object_compile_count == compiles
    assert key in cexecutable._LIBS
    scaled = (args[0], args[1] * np.float32(0.8125), args[2])
    _check(exe(_flat(*args)), *scaled)


BUILD_THEN_LOAD = """
import sys
import numpy as np
import shapegrad as sg
from shapegrad.backends import native
from shapegrad.backends.c import toolchain
x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
fast = sg.compile(lambda x: (sg.sin(x) * 0.6875).sum(axis=1), backend="c")
if sys.argv[1] == "build":
    print("path", fast.trace(x).lower().build())
else:
    got = fast(x).numpy()
    assert np.allclose(got, (np.sin(x) * 0.6875).sum(axis=1), rtol=1e-5), got
    print("compiles", native.compile_count, "from_cache", fast.lower(x).from_cache)
"""


@needs_cc
def test_a_library_built_in_one_process_is_loaded_by_the_next(tmp_path: Path) -> None:
    env = dict(os.environ, SHAPEGRAD_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT / "src"))
    out = []
    for stage in ("build", "run"):
        proc = subprocess.run(
            [sys.executable, "-c", BUILD_THEN_LOAD, stage],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        out.append(proc.stdout.split())
    assert out[0][0] == "path" and Path(out[0][1]).is_file()
    assert Path(out[0][1]).parent == tmp_path
    # the second process ran no compiler, and found the manifest: no lowering either
    assert out[1] == ["compiles", "0", "from_cache", "True"]


def test_ane_build_saves_the_package(tmp_path: Path) -> None:
    pytest.importorskip("coremltools", reason="the ane backend converts with coremltools")
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    lowered = (
        sg.compile(lambda x: sg.tanh(x) * 2.0, backend="ane", cache_dir=str(tmp_path))
        .trace(x)
        .lower()
    )
    assert lowered.source is not None and "tanh" in lowered.source  # the MIL text
    path = Path(lowered.build())
    assert path.suffix == ".mlpackage" and path.is_dir() and path.parent == tmp_path
    exe = lowered.compile()  # converts the MIL program it showed: the package is the built one
    assert exe.package == path and exe.stats["cached"]  # type: ignore[attr-defined]


def test_compiled_lower_still_returns_a_ready_executable() -> None:
    args = _args(3)
    fast = sg.compile(sg.value_and_grad(loss))
    lowered = fast.lower(*args)
    assert lowered._executable is not None  # compiled by lower(*args), as before
    _check(lowered.executable(_flat(*args)), *args)
    assert fast.lower(*args) is lowered and fast.trace_count == 1
