"""bfloat16: storage, casts, arithmetic computed in float32 and rounded to nearest-even, in
eager, compiled C (and CUDA on a GPU); checkpoints; ScalarTrainer's bfloat16 mixed precision.

References: ``ml_dtypes`` (the rounding JAX uses) for casts, float32 NumPy rounded once for
arithmetic, and the float32 model for training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import shapegrad as sg
from modes import _cuda_unavailable
from shapegrad import optim
from shapegrad.dtypes import as_dtype

BF16 = np.dtype(ml_dtypes.bfloat16)


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, BF16)).view(np.uint16)


def _hard_floats(n: int, seed: int) -> np.ndarray:
    """float32 values that stress rounding: ties, odd/even neighbours, subnormals, inf, NaN."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    ties = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)  # exactly halfway
    near = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x7FFF)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-45, 3.4e38], np.float32)
    return np.concatenate(
        [bits.view(np.float32), ties.view(np.float32), near.view(np.float32), special]
    )


def test_the_dtype_is_known_everywhere_users_name_it() -> None:
    assert as_dtype("bfloat16") is sg.bfloat16
    assert as_dtype(ml_dtypes.bfloat16) == sg.bfloat16
    x = sg.tensor(np.ones(3, BF16))
    assert x.dtype == sg.bfloat16 and x.numpy().dtype == BF16
    assert sg.tensor(np.ones(3, np.float32)).astype("bfloat16").dtype == sg.bfloat16


@pytest.mark.parametrize("backend", ["eager", "numpy", "c"])
def test_casts_round_to_nearest_even_bit_for_bit(backend: str) -> None:
    x = _hard_floats(4096, 0)

    def cast(t: sg.Tensor) -> sg.Tensor:
        return t.astype(sg.bfloat16)

    got = cast(sg.tensor(x)).numpy() if backend == "eager" else sg.compile(cast, backend=backend)(x)
    with np.errstate(invalid="ignore"):  # NaN converts quietly
        want = x.astype(BF16)
    nan = np.isnan(x)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan])
    assert np.isnan(np.asarray(got, np.float32)[nan]).all()
    back = (
        sg.compile(lambda t: t.astype(sg.float32), backend=backend) if backend != "eager" else None
    )
    widened = back(want) if back else sg.tensor(want).astype(sg.float32).numpy()
    np.testing.assert_array_equal(np.asarray(widened), want.astype(np.float32))


def _f(a: sg.Tensor, b: sg.Tensor, c: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
    h = sg.relu(a @ b + c)
    return h.sum(axis=1), (h * 0.5 - 1.0).mean(), sg.softmax(h, axis=-1)


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((16, 300)).astype(np.float32) * 0.2
    b = rng.standard_normal((300, 24)).astype(np.float32) * 0.2
    c = rng.standard_normal(24).astype(np.float32) * 0.2
    return [x.astype(BF16) for x in (a, b, c)]


def test_arithmetic_is_float32_rounded_once() -> None:
    ones = sg.tensor(np.ones(5000, BF16))
    assert ones.dtype == sg.bfloat16
    # float32 sums 5000 exactly; bfloat16 holds 4992 or 5024 there: nearest is 4992. A sum
    # accumulated in bfloat16 would stop at 256 (256 + 1 rounds back to 256).
    assert float(ones.sum().numpy()) == 4992.0
    a, b, c = _inputs(0)
    got = (sg.tensor(a) @ sg.tensor(b)).numpy()
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_compiled_matches_eager(backend: str) -> None:
    a, b, c = _inputs(1)
    eager = [o.numpy() for o in _f(sg.tensor(a), sg.tensor(b), sg.tensor(c))]
    compiled = sg.compile(_f, backend=backend)(a, b, c)
    for e, g in zip(eager, compiled, strict=True):
        assert np.asarray(g).dtype == BF16
        # Same rounding at every op; only the order of float32 sums differs (one bfloat16
        # ulp at most, 2**-8 relative).
        np.testing.assert_allclose(
            np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=2**-7, atol=1e-6
        )


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_gradients_match_float32_within_bfloat16_precision(backend: str) -> None:
    a, b, c = _inputs(2)

    def loss(a: sg.Tensor, b: sg.Tensor, c: sg.Tensor) -> sg.Tensor:
        return _f(a, b, c)[1]

    grad = sg.compile(sg.grad(loss, argnums=(0, 1, 2)), backend=backend)
    got = grad(a, b, c)
    want = sg.grad(loss, argnums=(0, 1, 2))(*(sg.tensor(x.astype(np.float32)) for x in (a, b, c)))
    for g, w in zip(got, want, strict=True):
        g32, w32 = np.asarray(g, np.float32), w.numpy()
        assert np.asarray(g).dtype == BF16
        assert np.abs(g32 - w32).max() <= 0.02 * np.abs(w32).max()


def test_checkpoint_round_trip_keeps_bits(tmp_path: Path) -> None:
    params = [sg.tensor(_hard_floats(64, 3)[:64].astype(BF16)), sg.tensor(np.ones(3, BF16))]
    path = sg.save_checkpoint(tmp_path / "bf.npz", params)
    back = sg.load_checkpoint(path, params).params
    for p, q in zip(params, back, strict=True):
        assert q.dtype == sg.bfloat16
        np.testing.assert_array_equal(_bits(p.numpy()), _bits(q.numpy()))
    as_float = [sg.tensor(np.zeros(64, np.float32)), sg.tensor(np.zeros(3, np.float32))]
    with pytest.raises(sg.io.CheckpointError, match="float32"):
        sg.load_checkpoint(path, as_float)


def _moons() -> tuple[Any, np.ndarray, np.ndarray]:
    x, labels = sg.data.make_moons(256, noise=0.1, seed=0)
    y = (2 * labels - 1).astype(np.float32)
    rng = np.random.default_rng(0)
    shapes = [(2, 16), (16,), (16, 1), (1,)]
    params = [sg.tensor((rng.standard_normal(s) * 0.5).astype(np.float32)) for s in shapes]
    return params, x.astype(np.float32), y


def _hinge(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2 = params
    scores = (sg.relu(x @ w1 + b1) @ w2 + b2).reshape((x.shape[0],))
    return sg.hinge(scores, y)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_trainer_bfloat16_mixed_precision_tracks_float32(mode: str) -> None:
    params, x, y = _moons()
    kw: dict[str, Any] = {"mode": mode, "optimizer": optim.Adam(lr=0.02)}
    if mode == "compiled":
        kw["backend"] = "c"
    mixed = sg.ScalarTrainer(_hinge, params, dtype="bfloat16", **kw)
    full = sg.ScalarTrainer(_hinge, params, **kw)
    assert mixed.dtype == sg.bfloat16 and mixed.loss_scale == 1.0  # no loss scaling
    losses = [(float(mixed.step(x, y)), float(full.step(x, y))) for _ in range(150)]
    assert all(p.dtype == sg.float32 for p in mixed.get_params())  # float32 master weights
    first, last = losses[0], losses[-1]
    assert abs(first[0] - first[1]) < 0.02 * first[1]
    assert last[0] < 0.3 * first[0] and last[0] < last[1] + 0.05
    assert mixed.skipped_steps == 0


def test_cuda_products_of_bfloat16_go_to_tensor_cores() -> None:
    from shapegrad.backends.cuda import generate
    from shapegrad.backends.cuda import toolchain as tc

    rng = np.random.default_rng(4)  # large enough for cuBLAS (CUDA_TARGET.contract_min_macs)
    a = (rng.standard_normal((128, 512)) * 0.1).astype(BF16)
    b = (rng.standard_normal((512, 64)) * 0.1).astype(BF16)
    c = (rng.standard_normal(64) * 0.1).astype(BF16)
    graph = sg.compile(_f, backend="numpy").lower(a, b, c).graph
    _program, source = generate(graph)
    gemm = source.split("cublasGemmStridedBatchedEx(blas, ")[1].split(");")[0]
    args = [s.strip() for s in gemm.split(",")]
    assert args[7] == "14" and args[-2] == "68", args  # CUDA_R_16BF, CUBLAS_COMPUTE_32F
    if tc.nvcc() is not None:
        tc.compile_check(source)


@pytest.mark.skipif(_cuda_unavailable() is not None, reason=_cuda_unavailable() or "")
def test_cuda_bfloat16_matches_eager() -> None:
    a, b, c = _inputs(5)
    eager = [o.numpy() for o in _f(sg.tensor(a), sg.tensor(b), sg.tensor(c))]
    got = sg.compile(_f, backend="cuda")(a, b, c)
    for e, g in zip(eager, got, strict=True):
        np.testing.assert_allclose(
            np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=2**-6, atol=1e-5
        )


def _op_table_cases(every: int) -> list[Any]:
    from op_table import CASES

    return [pytest.param(c, id=c.name) for i, c in enumerate(CASES) if i % every == 0]


def _agree_in_bfloat16(case: Any) -> None:
    """Eager and compiled C round the same ops to bfloat16: outputs agree to a couple of
    bfloat16 ulps (only the order of float32 sums differs)."""
    from harness import _cast_floats

    arrays = _cast_floats(case.arrays(), BF16)
    if not any(a.dtype == BF16 for a in arrays):
        pytest.skip("no float input")
    eager = case.fn(*[sg.tensor(a) for a in arrays]).numpy()
    got = np.asarray(sg.compile(case.fn, backend="c")(*arrays))
    assert got.dtype == eager.dtype
    e32, g32 = np.asarray(eager, np.float64), np.asarray(got, np.float64)
    scale = max(1.0, float(np.nanmax(np.abs(e32)))) if e32.size else 1.0
    np.testing.assert_allclose(g32, e32, rtol=2**-6, atol=2**-6 * scale, equal_nan=True)


@pytest.mark.parametrize("case", _op_table_cases(7))
def test_op_table_sample_compiled_agrees_with_eager(case: Any) -> None:
    _agree_in_bfloat16(case)


@pytest.mark.slow
@pytest.mark.parametrize("case", _op_table_cases(1))
def test_op_table_compiled_agrees_with_eager(case: Any) -> None:
    _agree_in_bfloat16(case)


def test_c_products_of_bfloat16_go_to_blas_widened_and_equal_eager() -> None:
    """OpenBLAS has no bfloat16 product: a large one runs as a float32 sgemm between
    casts (the widen_library_products stage), eager's float32-and-round-once."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((128, 256)).astype(BF16)
    b = rng.standard_normal((256, 64)).astype(BF16)

    def product(x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return x @ y

    lowered = sg.compile(product, backend="c").trace(a, b).lower()
    assert "sgemm" in lowered.source
    got = sg.compile(product, backend="c")(a, b)
    want = (sg.tensor(a) @ sg.tensor(b)).numpy()
    # float32 sums in another order (two BLAS blockings) may cross a rounding boundary:
    # at most one bfloat16 ulp apart, and rarely
    ulps = np.abs(_bits(got).astype(np.int32) - _bits(want).astype(np.int32))
    assert ulps.max() <= 1 and np.count_nonzero(ulps) < 0.01 * ulps.size
    small = sg.compile(product, backend="c").trace(a[:4, :8], b[:8, :4]).lower()
    assert "sgemm" not in small.source  # below contract_min_macs: a loop nest, float32 sums
