"""The ANE backend's lowering to Core ML MIL, checked on Linux.

Every case of the op table (tests/test_ops.py) is traced, lowered to a MIL
program and executed by the NumPy MIL evaluator (tests/mil_evaluator.py):
forward in fp32 compute against the NumPy reference at fp32 tolerances
(which pins down operand order, transpose flags and axes), forward in fp16
compute at fp16 tolerances, and gradients through the lowered backward
graphs against the eager gradients. A few programs are converted and saved
with coremltools; converting the whole table is marked slow.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from ane_support import mil_call, mil_grad, require_coremltools, run_lowered, traced_graph
from harness import Case, _cast_floats
from modes import MODES
from op_table import CASES
from shapegrad.backends.ane import (
    AneExecutionUnavailable,
    AneLoweringError,
    build_package,
    lower_to_mil,
)
from shapegrad.backends.ane.lowering import _RULES
from shapegrad.ops.protocol import COLLECTIVES, Prim

require_coremltools()

GRAD_CASES = [c for c in CASES if c.grad]

FP32_TOL = 1e-3
FP16_TOL = 2e-2


def _has_zero_size(case: Case) -> bool:
    return any(a.size == 0 for a in case.arrays()) or "empty" in case.name


def _reference(case: Case, arrays: list[np.ndarray]) -> np.ndarray:
    return np.asarray(case.ref(*_cast_floats(arrays, np.float64)))


def _assert_close(got: np.ndarray, want: np.ndarray, tol: float, name: str) -> None:
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=name)


def _forward(case: Case, precision: str, tol: float) -> None:
    arrays = _cast_floats(case.arrays(), np.float32)
    if case.ane_error is not None:  # a dtype Core ML lacks: a clear error, never a wrong value
        with pytest.raises(AneLoweringError, match=case.ane_error):
            mil_call(case.fn, arrays, precision)
        return
    if _has_zero_size(case):
        # Core ML tensors cannot be empty: the lowering must say so and point to the C backend.
        try:
            (got,) = mil_call(case.fn, arrays, precision)
        except AneLoweringError as exc:
            assert "zero-size" in str(exc) and "backend='c'" in str(exc)
            return
        _assert_close(got, _reference(case, arrays), tol, case.name)
        return
    (got,) = mil_call(case.fn, arrays, precision)
    _assert_close(got, _reference(case, arrays), tol, case.name)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_table_forward_fp32(case: Case) -> None:
    _forward(case, "fp32", FP32_TOL)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_op_table_forward_fp16(case: Case) -> None:
    _forward(case, "fp16", FP16_TOL)


def _grad_inputs(case: Case) -> tuple[list[np.ndarray], tuple[int, ...], Any]:
    arrays = _cast_floats(case.arrays(), np.float32)
    argnums = case.diff_positions(arrays)
    cot = np.random.default_rng(1).standard_normal(np.shape(_reference(case, arrays)))

    def scalar(*args: sg.Tensor) -> sg.Tensor:
        *xs, c = args
        return sg.sum(case.fn(*xs) * c)

    return [*arrays, cot.astype(np.float32)], argnums, scalar


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(
    "case", [c for c in GRAD_CASES if not _has_zero_size(c)], ids=lambda c: c.name
)
def test_op_table_gradients(case: Case, precision: str) -> None:
    arrays, argnums, scalar = _grad_inputs(case)
    if case.ane_error is not None:
        with pytest.raises(AneLoweringError, match=case.ane_error):
            mil_grad(scalar, arrays, argnums, precision)
        return
    want = MODES["eager"].grad(scalar, _cast_floats(arrays, np.float64), argnums)
    got = mil_grad(scalar, arrays, argnums, precision)
    tol = FP32_TOL if precision == "fp32" else 3 * FP16_TOL
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, tol, f"{case.name} grad ({precision})")


# --- structure of the lowering ----------------------------------------------------------------


def test_every_primitive_has_a_rule() -> None:
    # collectives get a clear AneLoweringError (tests/test_distributed.py); layer loops
    # (sg.scan / sg.checkpoint) are not lowered to MIL yet: a clear error (below)
    assert set(_RULES) == set(Prim) - {Prim.INPUT, Prim.SCAN} - COLLECTIVES


def test_layer_loops_are_a_clear_error() -> None:
    w = np.ones((3, 2, 2), np.float32)
    x = np.ones((1, 2), np.float32)
    with pytest.raises(NotImplementedError, match=r"cannot lower scan.*backend='c'"):
        _lowered(lambda x, w: sg.scan(lambda h, wl: (h @ wl, None), x, w)[0], x, w)


def _lowered(fn: Any, *arrays: np.ndarray, precision: str = "fp16") -> Any:
    return lower_to_mil(traced_graph(fn, list(arrays)), precision)


def test_plain_matmul_is_one_matmul_with_transpose_flags() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4), np.float32), rng.standard_normal((5, 4), np.float32)
    mil = _lowered(lambda x, y: sg.einsum("ij,kj->ik", x, y), a, b)
    ops = mil.op_histogram()
    assert ops["matmul"] == 1 and ops["transpose"] == 0 and ops["reshape"] == 0
    (matmul,) = [op for op in mil.operations() if op.op_type == "matmul"]
    assert matmul.transpose_y.val and not matmul.transpose_x.val
    assert mil.lowering["einsum"] == "native"
    np.testing.assert_allclose(run_lowered(mil, [a, b])[0], a @ b.T, rtol=5e-3, atol=5e-3)


def test_bias_broadcast_stays_implicit() -> None:
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 3), (4, 3), (4,)))
    mil = _lowered(lambda x, w, b: sg.relu(x @ w.T + b), x, w, b)
    assert mil.op_histogram()["tile"] == 0  # MIL's add broadcasts the [1, 4] bias itself
    want = np.maximum(x @ w.T + b, 0)
    np.testing.assert_allclose(run_lowered(mil, [x, w, b])[0], want, rtol=1e-2, atol=1e-2)


def test_fp16_program_casts_only_at_the_boundary() -> None:
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    mil = _lowered(lambda x: sg.exp(x).sum(axis=1), x)
    casts = [op for op in mil.operations() if op.op_type == "cast"]
    assert [c.dtype.val for c in casts] == ["fp16", "fp32"]
    (got,) = run_lowered(mil, [x])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.exp(x).sum(axis=1), rtol=2e-3)


def test_returned_input_keeps_fp32_precision() -> None:
    x = np.array([1.0 + 2.0**-20, 3.1415927], np.float32)  # not representable in fp16
    mil = _lowered(lambda x: (x, x * 2.0), x)
    same, doubled = run_lowered(mil, [x])
    np.testing.assert_array_equal(same, x)
    np.testing.assert_allclose(doubled, 2 * x, rtol=1e-3)
    assert not np.array_equal(doubled, 2 * x)  # that one went through fp16


def test_random_is_folded_to_a_constant() -> None:
    # Built by hand: sg.compile's own passes would fold the RANDOM node before lowering.
    from shapegrad.ops import prims as P
    from shapegrad.ops.graph import GraphOps
    from shapegrad.ops.protocol import AVal

    ops = GraphOps()
    x = ops.add_input("x", AVal((2, 3), sg.float32))
    graph = ops.to_graph([x + P.random_uniform((2, 3), 4, sg.float32, like=x)])
    assert any(n.prim is Prim.RANDOM for n in graph.nodes())
    mil = lower_to_mil(graph, "fp32")
    assert mil.lowering.get("random_uniform") == "folded"
    ones = np.ones((2, 3), np.float32)
    eager = (sg.tensor(ones) + P.random_uniform((2, 3), 4, sg.float32)).numpy()
    np.testing.assert_allclose(run_lowered(mil, [ones])[0], eager, rtol=1e-6)


def test_unsupported_construct_names_op_and_suggests_c() -> None:
    updates = np.ones((3,), np.bool_)
    idx = np.array([0, 1, 1], np.int32)
    from shapegrad.ops import prims as P

    with pytest.raises(AneLoweringError, match=r"scatter_add.*backend='c'"):
        _lowered(lambda u, i: P.scatter_add(u, i, 0, 2), updates, idx)


def test_fp16_constants_clip_instead_of_overflowing() -> None:
    x = np.array([1.0, 2.0, 3.0], np.float32)
    mil = _lowered(lambda x: sg.exp(sg.maximum(x, -1e30) - 1e30 + 1e30), x)
    (got,) = run_lowered(mil, [x])
    assert np.all(np.isfinite(got))  # -1e30 became -65504, never -inf - (-inf) = nan


def test_int_division_truncates_and_bools_cross_the_boundary() -> None:
    from shapegrad.ops import prims as P

    x = np.array([[1.5, -2.5, 0.5, 3.0]], np.float32)
    d = np.array([[2, 2, 0, -2]], np.int32)

    def fn(x: sg.Tensor, d: sg.Tensor) -> Any:
        return P.binary(Prim.DIV, (x * 2.0).astype("int32"), d), x > 0

    mil = _lowered(fn, x, d)
    assert mil.lowering["div"] == "decomposed"
    got_int, got_bool = run_lowered(mil, [x, d])
    eager = [t.numpy() for t in fn(sg.tensor(x), sg.tensor(d))]  # C semantics, x / 0 = x
    np.testing.assert_array_equal(got_int, eager[0])
    np.testing.assert_array_equal(got_bool, eager[1])
    assert got_bool.dtype == np.bool_


# --- conversion with coremltools, the backend, the cache --------------------------------------


def test_converts_and_saves_a_program_with_many_ops(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((4, 6), np.float32), rng.standard_normal((6, 3), np.float32)
    idx = np.array([2, 0, 1, 2], np.int32)

    def fn(x: sg.Tensor, w: sg.Tensor, i: sg.Tensor) -> Any:
        h = sg.tanh(x @ w)
        z = sg.concat([h, sg.pad(h[:, 1:], ((0, 0), (0, 1)))], axis=1)
        return sg.log_softmax(z) + sg.take(h, i, axis=1).sum(), sg.argmax(z, axis=1)

    mil = lower_to_mil(traced_graph(fn, [x, w, idx]))
    want = run_lowered(mil, [x, w, idx])
    names = (mil.input_names, mil.output_names)
    package = build_package(mil, "many_ops", tmp_path)
    assert package.path.is_dir() and (package.path / "Manifest.json").exists()
    # The saved model's interface is what IoSignature feeds and fetches on a Mac.
    from shapegrad.backends.ane._mil import coremltools

    spec = coremltools().models.MLModel(str(package.path), skip_model_load=True).get_spec()
    assert [i.name for i in spec.description.input] == names[0]
    assert [o.name for o in spec.description.output] == names[1]
    kinds = [i.type.multiArrayType.dataType for i in spec.description.input]
    array_type = coremltools().proto.FeatureTypes_pb2.ArrayFeatureType
    assert kinds == [array_type.FLOAT32, array_type.FLOAT32, array_type.INT32]
    assert not package.cached and package.convert_seconds > 0
    again = build_package(lower_to_mil(traced_graph(fn, [x, w, idx])), "many_ops", tmp_path)
    assert again.cached and again.path == package.path
    eager = [t.numpy() for t in fn(sg.tensor(x), sg.tensor(w), sg.tensor(idx))]
    np.testing.assert_allclose(want[0], eager[0], rtol=2e-2, atol=2e-2)
    np.testing.assert_array_equal(want[1], eager[1])


def test_sg_compile_ane_saves_package_and_refuses_to_run_off_macos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path / "debug"))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    fast = sg.compile(lambda x: (x @ x.T).sum(), backend="ane")
    lowered = fast.lower(sg.tensor(x))
    exe: Any = lowered.executable
    assert exe.package.exists() and exe.package.suffix == ".mlpackage"
    dumps = list((tmp_path / "debug").rglob("*.mil.txt"))
    assert dumps and "matmul" in dumps[0].read_text()
    if os.uname().sysname == "Darwin":
        pytest.skip("macOS executes the program; covered by test_ane_macos.py")
    with pytest.raises(AneExecutionUnavailable, match="macOS"):
        fast(sg.tensor(x))
    # The same program, executed by the MIL evaluator instead of Core ML.
    from ane_support import evaluator_runner

    runner = evaluator_runner(lower_to_mil(exe.graph))
    (value,) = exe.with_runner(runner)([x])
    assert np.isclose(value, (x @ x.T).sum(), rtol=1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if not _has_zero_size(c)], ids=lambda c: c.name)
def test_op_table_converts_and_saves(case: Case, tmp_path: Path) -> None:
    arrays = _cast_floats(case.arrays(), np.float32)
    if case.ane_error is not None:  # a dtype Core ML lacks: refused before any package
        with pytest.raises(AneLoweringError, match=case.ane_error):
            lower_to_mil(traced_graph(case.fn, arrays))
        return
    mil = lower_to_mil(traced_graph(case.fn, arrays))
    (before,) = run_lowered(mil, arrays)
    try:
        package = build_package(mil, "case", tmp_path)
    except AneLoweringError as exc:  # winograd's tiles, tile, conv_transpose2d
        assert "rank <= 5" in str(exc), exc
        pytest.skip(f"a rank-6 tensor: Core ML takes rank <= 5 (a clear error: {exc})")
    assert (package.path / "Manifest.json").exists()
    # ct.convert rewrote mil.program in place: evaluate what a Mac would run.
    (after,) = run_lowered(mil, arrays)
    _assert_close(after, before, FP16_TOL, f"{case.name} after coremltools passes")
