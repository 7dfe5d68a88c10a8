"""The C backend's cache keyed before lowering (manifests) and its multi-unit libraries.

* A manifest hit runs no graph pass, no loop stage and no renderer, and the executable it
  rebuilds behaves like the fully compiled one (values, stats, errors, bind, run_steps).
* A damaged, truncated, foreign-owned or mismatching manifest is ignored and rewritten.
* A changed graph (shape, op, constant) never reaches an old entry.
* Splitting a program into translation units gives the single unit's results, and an
  edited unit is the only one compiled again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.backends.c as cbackend
import shapegrad.jit as jit
from shapegrad.backends import native
from shapegrad.backends.c import toolchain, units
from shapegrad.compiler.graphkey import graph_text

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "shapegrad"


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def step(w: sg.Tensor, x: sg.Tensor, idx: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    """An SGD step with a gather (error path), constants and a donated state."""

    def loss(w: sg.Tensor) -> sg.Tensor:
        rows = sg.take(sg.tanh(x @ w) * 1.5 + 0.25, idx, axis=0)
        return (rows**2).mean()

    value, g = sg.value_and_grad(loss)(w)
    return w - 0.1 * g, value


W, X, IDX = _f32(4, 3), _f32(5, 4, seed=1), np.array([0, 4, 2], np.int32)


def _lower(fn: Callable[..., Any], *args: Any, **options: Any) -> jit.Lowered:
    """A fresh sg.compile (empty in-memory cache, as in a new process) lowered for args."""
    return sg.compile(fn, backend="c", donate_argnums=0, **options).lower(*args)


def _manifests(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.manifest"))


def _forbid_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the keyed cache hit must not optimize, lower or render")

    monkeypatch.setattr(jit.stages, "optimize", fail)
    monkeypatch.setattr(cbackend, "lower_program", fail)
    monkeypatch.setattr(cbackend, "render_c_units", fail)


def test_manifest_hit_skips_optimize_lowering_and_rendering(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _lower(step, W, X, IDX)
    assert not full.from_cache and len(_manifests(cache)) == 1
    compiles = native.compile_count
    with monkeypatch.context() as m:
        _forbid_lowering(m)
        hit = _lower(step, W, X, IDX)
        assert hit.from_cache and hit.optimize_seconds == 0.0
        assert native.compile_count == compiles
        got = hit.executable([W, X, IDX])
    want = full.executable([W, X, IDX])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    # numpy reference of the same step
    h = np.tanh(X @ W) * 1.5 + 0.25
    np.testing.assert_allclose(got[1], (h[IDX] ** 2).mean(), rtol=1e-5)
    # the lazily optimized graph and the introspection program agree with the full path
    assert graph_text(hit.graph) == graph_text(full.graph)
    assert hit.executable.program.format() == full.executable.program.format()


def test_rebuilt_executable_behaves_identically(cache: Path) -> None:
    fast_full = sg.compile(step, backend="c", donate_argnums=0)
    fast_hit = sg.compile(step, backend="c", donate_argnums=0)
    full, hit = fast_full.lower(W, X, IDX), fast_hit.lower(W, X, IDX)
    assert hit.from_cache and not full.from_cache
    s_full, s_hit = fast_full.stats(W, X, IDX), fast_hit.stats(W, X, IDX)
    assert (s_full.arena_bytes, s_full.kernels, s_full.layer_loops) == (
        s_hit.arena_bytes,
        s_hit.kernels,
        s_hit.layer_loops,
    )
    assert [(p.name, p.nodes_after) for p in s_full] == [(p.name, p.nodes_after) for p in s_hit]
    # errors: same exception and message, from the manifest's error table
    messages = []
    for lowered in (full, hit):
        with pytest.raises(IndexError, match="out of range") as info:
            lowered.executable([W, X, np.array([0, 9, 1], np.int32)])
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    # bind + step + run_steps (K steps, stacked), with an error at step 2 of 3
    stacked_x = np.stack([X, X * 0.5, X * 2.0])
    stacked_i = np.stack([IDX, IDX[::-1].copy(), np.array([1, 1, 7], np.int32)])
    results = []
    for lowered in (full, hit):
        bound = lowered.executable.bind([W])
        (loss,) = bound.step(X, IDX)
        first = float(loss)
        with pytest.raises(IndexError, match=r"at step 2 of 3"):
            bound.run_steps(stacked_x, stacked_i)
        results.append((first, bound.read_state()[0]))
    assert results[0][0] == results[1][0]
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_calls_through_sg_compile_match_after_a_hit(cache: Path) -> None:
    def f(x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return sg.softmax(x @ y.T + 2.0, axis=-1).sum(axis=0)

    x, y = _f32(6, 3), _f32(4, 3, seed=2)
    want = sg.compile(f, backend="c")(x, y).numpy()
    again = sg.compile(f, backend="c")
    got = again(x, y).numpy()
    assert again.lower(x, y).from_cache
    np.testing.assert_array_equal(got, want)
    z = x @ y.T + 2.0
    ref = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (ref / ref.sum(-1, keepdims=True)).sum(0), rtol=1e-5)


@pytest.mark.parametrize("damage", ["flip", "truncate", "checksum", "json", "foreign", "mode"])
def test_a_bad_manifest_is_ignored_and_rewritten(cache: Path, damage: str) -> None:
    _lower(step, W, X, IDX)
    (path,) = _manifests(cache)
    data = path.read_bytes()
    if damage == "flip":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    elif damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "checksum":  # intact body, wrong checksum line
        path.write_bytes(b"0" * 64 + data[64:])
    elif damage == "json":  # a valid checksum over a body that is not a manifest
        import hashlib

        body = b'{"format": 1, "key": "x"}'
        path.write_bytes(hashlib.sha256(body).hexdigest().encode() + b"\n" + body)
    elif damage == "foreign":
        if os.geteuid() != 0:
            pytest.skip("needs root to give the file to another user")
        os.chown(path, 4242, -1)
    elif damage == "mode":
        os.chmod(path, 0o666)  # writable by others: not ours alone
    lowered = _lower(step, W, X, IDX)
    assert not lowered.from_cache  # fell back to the full path silently
    h = np.tanh(X @ W) * 1.5 + 0.25
    np.testing.assert_allclose(lowered.executable([W, X, IDX])[1], (h[IDX] ** 2).mean(), rtol=1e-5)
    assert _lower(step, W, X, IDX).from_cache  # and wrote a good one again


def test_a_missing_library_falls_back_to_the_full_path(cache: Path) -> None:
    _lower(step, W, X, IDX)
    for lib in cache.glob("*.so"):
        lib.unlink()
    lowered = _lower(step, W, X, IDX)
    assert not lowered.from_cache
    assert lowered.executable([W, X, IDX])[1].shape == ()


def test_a_changed_graph_never_hits_the_old_entry(cache: Path) -> None:
    def scaled(c: float) -> Callable[..., Any]:
        def f(w: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
            return w * 0.5, (sg.tanh(x @ w) * c).sum()

        return f

    def other_op(w: sg.Tensor, x: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
        return w * 0.5, (sg.sigmoid(x @ w) * 3.0).sum()

    x = X
    base = _lower(scaled(3.0), W, x)
    assert not base.from_cache
    cases = {
        "constant": (scaled(4.0), (W, x), lambda w, x: (np.tanh(x @ w) * 4.0).sum()),
        "op": (other_op, (W, x), lambda w, x: (3.0 / (1 + np.exp(-(x @ w)))).sum()),
        "shape": (scaled(3.0), (W, x[:2]), lambda w, x: (np.tanh(x @ w) * 3.0).sum()),
    }
    for name, (fn, args, ref) in cases.items():
        lowered = _lower(fn, *args)
        assert not lowered.from_cache, name
        got = lowered.executable(list(args))[1]
        np.testing.assert_allclose(got, ref(*args), rtol=1e-5, err_msg=name)
    assert _lower(scaled(3.0), W, x).from_cache  # the original entry is still there
    assert len(_manifests(cache)) == 4


def test_debug_runs_take_the_full_path_and_dump_every_stage(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _lower(step, W, X, IDX)
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path / "dump"))
    lowered = _lower(step, W, X, IDX)
    assert not lowered.from_cache
    (folder,) = (tmp_path / "dump").iterdir()
    names = {p.name for p in folder.iterdir()}
    assert any(n.endswith(".c") for n in names) and any("loop00_" in n for n in names)


def test_a_warm_cache_in_a_fresh_process_skips_lowering(tmp_path: Path) -> None:
    child = """
import numpy as np, shapegrad as sg
import shapegrad.backends.c as cb
from shapegrad.backends import native
from shapegrad.backends.c import toolchain
def f(x):
    return sg.tanh(x @ x.T + 1.0).sum(axis=0)
x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
fast = sg.compile(f, backend="c")
got = fast(x).numpy()
want = np.tanh(x @ x.T + 1.0).sum(axis=0)
assert np.allclose(got, want, rtol=1e-5), (got, want)
print("hit", fast.lower(x).from_cache, "compiles", native.compile_count)
"""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), PYTHONPATH=str(ROOT / "src"))
    outs = [
        subprocess.run(
            [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300
        )
        for _ in range(2)
    ]
    for out in outs:
        assert out.returncode == 0, out.stderr[-2000:]
    assert outs[0].stdout.split() == ["hit", "False", "compiles", "1"]
    assert outs[1].stdout.split() == ["hit", "True", "compiles", "0"]


# --- several translation units ----------------------------------------------------------------


def mlp_loss(params: tuple[sg.Tensor, sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w, b = params
    h = x
    for i in range(w.shape[0]):
        h = sg.tanh(h @ w[i].T + b[i])
    return sg.mse(h, y)


def test_multi_unit_build_matches_the_single_unit(cache: Path) -> None:
    rng = np.random.default_rng(3)
    w = (rng.normal(size=(6, 16, 16)) / 4).astype(np.float32)
    b = (rng.normal(size=(6, 16)) / 4).astype(np.float32)
    x, y = _f32(8, 16, seed=4), _f32(8, 16, seed=5)
    objects = native.object_compile_count
    one = sg.compile(sg.value_and_grad(mlp_loss), backend="c", split_min_lines=10**9)
    many = sg.compile(sg.value_and_grad(mlp_loss), backend="c", unit_lines=40, split_min_lines=0)
    v1, g1 = one((w, b), x, y)
    assert native.object_compile_count == objects  # one unit: no object files
    v2, g2 = many((w, b), x, y)
    made = native.object_compile_count - objects
    assert made >= 4  # the step unit and several kernel units
    assert float(v1) == float(v2)
    for a, c in zip(g1, g2, strict=True):
        np.testing.assert_array_equal(a.numpy(), c.numpy())
    # against NumPy (float64 forward)
    h = x.astype(np.float64)
    for i in range(6):
        h = np.tanh(h @ w[i].T.astype(np.float64) + b[i])
    np.testing.assert_allclose(float(v2), ((h - y) ** 2).mean(), rtol=1e-5)
    # a second process would load it from its manifest: same values again
    hit = sg.compile(sg.value_and_grad(mlp_loss), backend="c", unit_lines=40, split_min_lines=0)
    v3, _ = hit((w, b), x, y)
    assert hit.lower((w, b), x, y).from_cache and float(v3) == float(v2)


def _unit(name: str, body: str) -> units.UnitSpec:
    return units.UnitSpec(name, body, ("-O2", "-fPIC"))


def test_an_edited_unit_is_the_only_one_compiled_again(cache: Path) -> None:
    def spec(c: int) -> units.LinkSpec:
        parts = (
            _unit(
                "step",
                "int sg_a(void); int sg_b(void);\nint total(void) { return sg_a() + sg_b(); }\n",
            ),
            _unit("a", "int sg_a(void) { return 40; }\n"),
            _unit("b", f"int sg_b(void) {{ return {c}; }}\n"),
        )
        return units.LinkSpec(parts, toolchain.compiler(), ())

    def total(path: str) -> int:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef("int total(void); extern const char sg_key[];")
        lib = ffi.dlopen(path)
        return int(lib.total())

    runs, objects = native.compile_count, native.object_compile_count
    path, cached = units.library_for(spec(2))
    assert not cached and total(path) == 42
    assert native.object_compile_count - objects == 3
    assert native.compile_count - runs == 4  # three units and the link
    runs, objects = native.compile_count, native.object_compile_count
    path, cached = units.library_for(spec(5))  # unit "b" edited
    assert not cached and total(path) == 45
    assert native.object_compile_count - objects == 1  # only "b"
    assert native.compile_count - runs == 2  # "b" and the link
    runs = native.compile_count
    assert units.library_for(spec(5))[1] and native.compile_count == runs  # a library hit


def test_a_unit_that_fails_to_compile_names_the_unit(cache: Path) -> None:
    bad = units.LinkSpec(
        (
            _unit("step", "int f(void) { return 1; }\n"),
            _unit("kernels0", "int g(void) { return }\n"),
        ),
        toolchain.compiler(),
        (),
    )
    with pytest.raises(native.CompileError, match="unit kernels0"):
        units.library_for(bad)


def test_a_damaged_object_is_compiled_again(cache: Path) -> None:
    spec = units.LinkSpec(
        (_unit("step", "int f(void) { return 1; }\n"), _unit("k", "int g(void) { return 2; }\n")),
        toolchain.compiler(),
        (),
    )
    units.library_for(spec)
    (obj,) = [p for p in cache.glob("*.o") if spec.object_key(spec.units[1]) in p.name]
    obj.write_bytes(b"garbage")  # checksum no longer matches
    for lib in cache.glob("*.so"):
        lib.unlink()
    objects = native.object_compile_count
    units.library_for(spec)
    assert native.object_compile_count - objects == 1


def test_units_share_state_and_the_profile(cache: Path) -> None:
    rng = np.random.default_rng(6)
    w = (rng.normal(size=(4, 16, 16)) / 4).astype(np.float32)
    b = np.zeros((4, 16), np.float32)
    x, y = _f32(8, 16, seed=7), _f32(8, 16, seed=8)
    fast = sg.compile(
        sg.value_and_grad(mlp_loss), backend="c", unit_lines=40, split_min_lines=0, profile=True
    )
    lowered = fast.lower((w, b), x, y)
    rendered = cbackend.render_c_units(lowered.executable.program, True, False, 40, 0)
    step_unit, *kernel_units = rendered
    assert step_unit.name == "step" and len(kernel_units) >= 3
    assert "SG_HIDDEN int sg_threads = 1;" in step_unit.source  # defined once
    for unit in kernel_units:
        assert "SG_HIDDEN extern int sg_threads;" in unit.source
        assert "extern double sg_profile[" in unit.source
        assert "int sg_threads = 1" not in unit.source
    calls = [f"sg_kernels{g}(io, arena)" for g in range(len(kernel_units))]
    assert all(call in step_unit.source for call in calls)
    fast((w, b), x, y)
    times = lowered.executable.profile()  # sg_profile, written by every unit
    assert len(times) == len(lowered.executable.program.kernels)
    assert all(seconds >= 0.0 for _, _, seconds in times) and sum(t for *_, t in times) > 0.0


def test_graphs_with_communicators_always_take_the_full_path(cache: Path) -> None:
    from shapegrad import distributed

    def f(x: sg.Tensor) -> sg.Tensor:
        return distributed.all_reduce(x * 2.0, comm=distributed.LocalCommunicator())

    x = np.arange(3, dtype=np.float32)
    for _ in range(2):  # a communicator has no canonical text: never keyed, never stored
        fast = sg.compile(f, backend="c")
        assert not fast.lower(x).from_cache
        np.testing.assert_array_equal(fast(x).numpy(), x * 2.0)
    assert _manifests(cache) == []
