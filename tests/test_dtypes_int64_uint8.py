"""int64 and uint8 tensors, bool masks and PyTorch's cast methods (issue 25).

Values are checked against NumPy (and PyTorch where installed) in eager mode, the compiled
NumPy reference and compiled C; the op table (tests/op_table.py, ``dtype_cases``) runs
the per-op rows in every mode. Here: creation and promotion rules, the overflow policy,
indices and labels in int64, checkpoints, the clear errors, and the CUDA source compiled
by nvcc.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad import io
from shapegrad.dtypes import DTypeError, Int32OverflowError, IntegerOverflowError
from shapegrad.io import CheckpointError

BACKENDS = ["numpy", "c"]


def _unavailable(backend: str) -> str | None:
    return MODES[backend].unavailable() if backend in MODES else None


def _both(fn: Any, *args: Any, backend: str) -> tuple[Any, Any]:
    """``fn`` eagerly and compiled for ``backend`` on the same tensors (NumPy arrays take
    their default dtype), each output as a NumPy array."""
    reason = _unavailable(backend)
    if reason:
        pytest.skip(reason)
    tensors = [a if isinstance(a, sg.Tensor) else sg.tensor(a) for a in args]
    eager = fn(*tensors)
    compiled = sg.compile(fn, backend=backend)(*tensors)
    return _arrays(eager), _arrays(compiled)


def _arrays(out: Any) -> Any:
    if isinstance(out, tuple):
        return tuple(np.asarray(o.numpy()) for o in out)
    return np.asarray(out.numpy())


# --- creation and promotion -------------------------------------------------------------


def test_dtypes_exist_and_normalise() -> None:
    from shapegrad.dtypes import as_dtype

    assert as_dtype("int64") == sg.int64 and as_dtype(np.int64) == sg.int64
    assert as_dtype("uint8") == sg.uint8 and as_dtype(np.dtype(np.uint8)) == sg.uint8
    assert repr(sg.int64) == "sg.int64" and str(sg.uint8) == "uint8"


def test_numpy_arrays_keep_uint8_and_int64_still_defaults_to_int32() -> None:
    assert sg.tensor(np.zeros(3, np.uint8)).dtype == sg.uint8
    assert sg.tensor(np.arange(3)).dtype == sg.int32  # unchanged: ints default to int32
    assert sg.tensor([1, 2]).dtype == sg.int32
    big = np.array([2**40, -(2**62), 3])
    t = sg.tensor(big, dtype=sg.int64)
    assert t.dtype == sg.int64 and t.numpy().tolist() == big.tolist()
    with pytest.raises(Int32OverflowError, match=r"use sg\.int64"):
        sg.tensor(big)  # int32 by default: refused, never wrapped


def test_int32_and_int64_never_mix_silently() -> None:
    a, b = sg.tensor([1, 2]), sg.tensor([1, 2], dtype=sg.int64)
    with pytest.raises(
        DTypeError, match=r"add: operands must share one dtype.*int32.*int64.*astype"
    ):
        _ = a + b
    with pytest.raises(DTypeError, match="share one dtype"):
        _ = sg.tensor(np.ones(2, np.uint8)) + a
    assert (a.long() + b).numpy().tolist() == [2, 4]  # explicit: fine


def test_weak_scalars_must_fit_the_integer_dtype() -> None:
    img = sg.tensor(np.array([0, 200], np.uint8))
    assert (img + 100).dtype == sg.uint8
    with pytest.raises(IntegerOverflowError, match="300 does not fit in uint8"):
        _ = img + 300
    with pytest.raises(IntegerOverflowError, match="-1 does not fit in uint8"):
        _ = img * -1
    wide = sg.tensor([1], dtype=sg.int64) + 2**40
    assert wide.dtype == sg.int64 and wide.item() == 2**40 + 1
    with pytest.raises(IntegerOverflowError, match="does not fit in int64"):
        _ = sg.tensor([1], dtype=sg.int64) + 2**64
    with pytest.raises(Int32OverflowError):  # int32 keeps refusing what does not fit it
        _ = sg.tensor([1]) + 2**40


# --- overflow policy -----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_sum_is_exact_where_int32_refuses(backend: str) -> None:
    x = np.array([[2**30, 2**30, 2**30], [7, -8, 9]], np.int32)
    with pytest.raises(Int32OverflowError):
        sg.sum(sg.tensor(x), axis=1)
    eager, compiled = _both(lambda t: sg.sum(t.long() * 2**31, axis=1), x, backend=backend)
    want = [sum(int(v) * 2**31 for v in row) for row in x.tolist()]  # Python ints: exact
    assert eager.dtype == compiled.dtype == np.int64
    assert eager.tolist() == compiled.tolist() == want


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_sum_wraps_at_2_64_like_numpy(backend: str) -> None:
    """The documented choice: int64 sums are not overflow-checked (NumPy and PyTorch wrap)."""
    x = np.array([2**62, 2**62, 5], np.int64)
    eager, compiled = _both(sg.sum, sg.tensor(x, dtype=sg.int64), backend=backend)
    assert eager.tolist() == compiled.tolist() == int(np.sum(x)) == -(2**63) + 5


def test_uint8_sums_are_refused_with_the_fix() -> None:
    img = sg.tensor(np.full((2, 3), 200, np.uint8))
    with pytest.raises(
        DTypeError, match=r"sum: a uint8 total would wrap at 256.*astype\(sg.int32\)"
    ):
        img.sum()
    with pytest.raises(DTypeError, match="cumsum: uint8"):
        sg.cumsum(img, axis=1)
    assert img.int().sum().item() == 1200


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_arithmetic_wraps_like_torch(backend: str) -> None:
    torch = pytest.importorskip("torch")
    a = np.arange(0, 256, 17, dtype=np.uint8)
    b = a[::-1].copy()

    def f(x: sg.Tensor, y: sg.Tensor) -> tuple[sg.Tensor, ...]:
        return x + y, x - y, x * y, -x, sg.maximum(x, y), sg.min(x), x > y

    eager, compiled = _both(f, a, b, backend=backend)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    want = (ta + tb, ta - tb, ta * tb, -ta, torch.maximum(ta, tb), ta.min(), ta > tb)
    for e, c, w in zip(eager, compiled, want, strict=True):
        assert e.dtype == c.dtype == w.numpy().dtype
        np.testing.assert_array_equal(e, w.numpy())
        np.testing.assert_array_equal(c, w.numpy())


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_images_to_float_and_masks(backend: str) -> None:
    torch = pytest.importorskip("torch")
    img = np.random.default_rng(0).integers(0, 256, (2, 3, 4, 4)).astype(np.uint8)

    def f(x: sg.Tensor) -> tuple[sg.Tensor, ...]:
        scaled = x.float() / 255.0
        bright = x > 128
        return scaled, sg.where(bright, x, 0), bright.any(), sg.all(x < 255, axis=(2, 3))

    eager, compiled = _both(f, img, backend=backend)
    t = torch.from_numpy(img)
    want = (
        (t.float() / 255.0).numpy(),
        torch.where(t > 128, t, torch.zeros_like(t)).numpy(),
        np.asarray((t > 128).any().item()),
        torch.all(torch.all(t < 255, dim=3), dim=2).numpy(),
    )
    for e, c, w in zip(eager, compiled, want, strict=True):
        assert e.dtype == c.dtype == w.dtype
        np.testing.assert_allclose(e, w, rtol=1e-7)
        np.testing.assert_allclose(c, w, rtol=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_float_to_uint8_wraps_like_numpy(backend: str) -> None:
    x = np.array([0.0, 3.7, 255.9, 300.0, -1.0, -0.5], np.float32)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.uint8)  # x86 NumPy: through an integer, modulo 256
    eager, compiled = _both(lambda t: t.byte(), x, backend=backend)
    assert eager.tolist() == compiled.tolist() == want.tolist()


# --- indices ----------------------------------------------------------------------------


def test_int64_index_values_are_never_wrapped_to_int32() -> None:
    table = sg.tensor(np.arange(12.0).reshape(4, 3))
    beyond = sg.tensor([2**32 + 1], dtype=sg.int64)  # int32 would read row 1
    with pytest.raises(IndexError, match="out of range"):
        sg.take(table, beyond, axis=0)
    with pytest.raises(IndexError, match="out of range"):
        _ = table[beyond]
    np.testing.assert_array_equal(
        table[sg.tensor([3, -1], dtype=sg.int64)].numpy(), np.arange(12.0).reshape(4, 3)[[3, -1]]
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_int64_indices_are_checked(backend: str) -> None:
    if _unavailable(backend):
        pytest.skip(str(_unavailable(backend)))
    table = np.arange(12.0, dtype=np.float32).reshape(4, 3)
    fn = sg.compile(lambda t, i: sg.take(t, i, axis=0), backend=backend)
    idx = sg.tensor([2, -4], dtype=sg.int64)
    np.testing.assert_array_equal(fn(table, idx).numpy(), table[[2, -4]])
    with pytest.raises(IndexError):
        fn(table, sg.tensor([2**32 + 1, 0], dtype=sg.int64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_argmax_arange_and_labels(backend: str) -> None:
    x = np.array([[0.5, 3.0, -1.0], [2.0, 1.0, 9.0]], np.float32)
    labels = np.array([1, 2], np.int32)

    def f(t: sg.Tensor, y: sg.Tensor) -> tuple[sg.Tensor, ...]:
        start = sg.arange(2**40, 2**40 + 6, 2, dtype=sg.int64)
        return (
            t.argmax(axis=1, dtype=sg.int64),
            sg.argmin(t, axis=0, dtype="int64"),
            start + sg.argmax(t, axis=1, dtype=sg.int64)[0],
            sg.cross_entropy(t, y.long()),
        )

    eager, compiled = _both(f, x, labels, backend=backend)
    want_ce = sg.cross_entropy(sg.tensor(x), sg.tensor(labels)).item()
    for out in (eager, compiled):
        assert out[0].dtype == np.int64 and out[0].tolist() == [1, 2]
        assert out[1].tolist() == [0, 1, 0]
        assert out[2].tolist() == [2**40 + 1, 2**40 + 3, 2**40 + 5]
        assert out[3] == pytest.approx(want_ce, rel=1e-6)
    with pytest.raises(DTypeError, match="argmax: indices are int32 or int64, got dtype=float32"):
        sg.argmax(sg.tensor(x), dtype=sg.float32)
    with pytest.raises(Int32OverflowError, match=r"use dtype=sg\.int64"):
        sg.arange(2**40, 2**40 + 3)


# --- PyTorch's cast methods ------------------------------------------------------------------

CASTS = {
    "float": sg.float32,
    "double": sg.float64,
    "half": sg.float16,
    "bfloat16": sg.bfloat16,
    "int": sg.int32,
    "long": sg.int64,
    "bool": sg.bool_,
    "byte": sg.uint8,
}


@pytest.mark.parametrize("method", CASTS)
def test_cast_method_is_astype(method: str) -> None:
    x = sg.tensor([[0.0, 1.75, 3.5], [7.25, 0.5, 120.0]])
    got = getattr(x, method)()
    want = x.astype(CASTS[method])
    assert got.dtype == CASTS[method] and got.shape == x.shape
    np.testing.assert_array_equal(
        np.asarray(got.numpy(), np.float64), np.asarray(want.numpy(), np.float64)
    )


def test_cast_methods_match_torch() -> None:
    torch = pytest.importorskip("torch")
    x = np.array([[-2.5, 0.0, 1.75], [3.5, 0.5, 200.25]], np.float32)
    t, s = torch.from_numpy(x), sg.tensor(x)
    for method in ("float", "double", "half", "int", "long", "bool", "byte"):
        if method == "byte":  # torch's negative float -> uint8 is platform-defined; skip -2.5
            got, want = s[:, 1:].byte().numpy(), t[:, 1:].byte().numpy()
        else:
            got, want = getattr(s, method)().numpy(), getattr(t, method)().numpy()
        assert got.dtype == want.dtype, method
        np.testing.assert_array_equal(got, want, err_msg=method)
    bf = s.bfloat16().float().numpy()
    np.testing.assert_array_equal(bf, t.bfloat16().float().numpy())


@pytest.mark.parametrize("method", ["float", "double", "half", "bfloat16"])
def test_float_cast_methods_are_differentiable(method: str) -> None:
    x = sg.tensor([1.5, -2.0, 0.25], dtype=sg.float64)
    g = sg.grad(lambda t: (getattr(t, method)() * 3.0).astype(sg.float64).sum())(x)
    assert g.dtype == sg.float64
    np.testing.assert_array_equal(g.numpy(), [3.0, 3.0, 3.0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_cast_methods_compile(backend: str) -> None:
    x = np.array([[-2.5, 0.0, 1.75], [3.5, 0.5, 200.25]], np.float32)

    def f(t: sg.Tensor) -> tuple[sg.Tensor, ...]:
        return t.double(), t.half(), t.bfloat16(), t.int(), t.long(), t.bool(), t.abs().byte()

    eager, compiled = _both(f, x, backend=backend)
    for e, c in zip(eager, compiled, strict=True):
        assert e.dtype == c.dtype
        np.testing.assert_array_equal(np.asarray(e, np.float64), np.asarray(c, np.float64))


def test_trainer_takes_uint8_images_eager_and_compiled() -> None:
    """uint8 pixels go into the step as they are and are scaled inside the loss; the
    compiled C step (uint8 input buffers) follows the eager one."""
    if _unavailable("c"):
        pytest.skip(str(_unavailable("c")))
    from shapegrad import models

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (8, 64)).astype(np.uint8)
    y = rng.integers(0, 10, 8).astype(np.int32)

    def loss(params: Any, xb: sg.Tensor, yb: sg.Tensor) -> sg.Tensor:
        assert xb.dtype == sg.uint8
        return models.digits_loss(params, xb.float() / 255.0, yb)

    runs = []
    for mode, backend in [("eager", "numpy"), ("compiled", "c")]:
        params = models.DigitsMLP.init(sg.nn.init.kaiming, seed=0, h=8)
        trainer = sg.ScalarTrainer(loss, params, mode=mode, backend=backend)
        runs.append([float(trainer.step(x, y)) for _ in range(3)])
    assert runs[0][2] < runs[0][0]  # it learns
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-5)


# --- checkpoints ----------------------------------------------------------------------------


def test_checkpoint_round_trip_keeps_int64_uint8_and_bool(tmp_path: Path) -> None:
    params = {
        "counts": sg.tensor([2**40, -(2**62), 7], dtype=sg.int64),
        "image": sg.tensor(np.arange(0, 256, 51, dtype=np.uint8).reshape(2, 3)),
        "mask": sg.tensor([True, False, True]),
        "w": sg.tensor([1.5, -2.0]).bfloat16(),
    }
    path = io.save_checkpoint(tmp_path / "dtypes.npz", params, step=3)
    loaded = io.load_checkpoint(path, params).params
    for name, want in params.items():
        got = loaded[name]
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(
            np.asarray(got.numpy()), np.asarray(want.numpy()), err_msg=name
        )


def test_checkpoint_dtype_mismatch_is_named(tmp_path: Path) -> None:
    path = io.save_checkpoint(tmp_path / "c.npz", {"ids": sg.tensor([1, 2], dtype=sg.int64)})
    with pytest.raises(CheckpointError, match=r"int64\[2\].*int32\[2\] is expected"):
        io.load_checkpoint(path, {"ids": sg.tensor([1, 2])})


# --- backends that cannot -------------------------------------------------------------------


def test_ane_refuses_int64_and_uint8_by_name() -> None:
    pytest.importorskip("coremltools")
    from shapegrad.backends.ane import AneLoweringError

    with pytest.raises(AneLoweringError, match=r"dtype int64, which Core ML does not.*x\.int\(\)"):
        sg.compile(lambda x: x.long() + 1, backend="ane")(np.ones(3, np.int32))
    with pytest.raises(AneLoweringError, match=r"input 'x'.*uint8.*x\.float\(\)"):
        sg.compile(lambda x: x.float(), backend="ane")(np.ones(3, np.uint8))


def test_compiled_collectives_refuse_int64() -> None:
    """Native MPI reductions exist for float32/float64/int32: an int64 one is a clear error
    when the program is lowered, before any native code (two processes, as the lowering
    sees them; a one-process communicator would make it a copy)."""
    if _unavailable("c"):
        pytest.skip(str(_unavailable("c")))
    from shapegrad import distributed as D

    class TwoProcesses(D.LocalCommunicator):
        size = 2
        key = "two"

        def gather_objects(self, obj: Any) -> list[Any]:
            return [obj, obj]  # what the other process would send: the same program

    comm = TwoProcesses()
    fn = sg.compile(lambda t: D.all_reduce(t.long(), "sum", comm), backend="c")
    with pytest.raises(DTypeError, match=r"all_reduce: compiled collectives .* not int64.*astype"):
        _ = fn.trace(np.ones(3, np.int32)).lower().source  # the loop IR is built lazily


# --- CUDA source (compiled by nvcc; running it needs a GPU) ------------------------------------

from test_cuda_build import cublas_wheel  # noqa: E402, F401  (a fixture: real cuBLAS or a stub)


@pytest.mark.usefixtures("cublas_wheel")
def test_cuda_source_with_int64_and_uint8_compiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shapegrad.backends.cuda import toolchain as tc

    if tc.nvcc() is None:
        pytest.skip("no nvcc (CUDA toolkit)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def f(x: sg.Tensor, img: sg.Tensor, i: sg.Tensor) -> tuple[sg.Tensor, ...]:
        y = x.long() * 3 + 2**40
        return (
            y.sum(),
            -y,
            y.max(),
            y / 7,
            sg.where(img > 100, img, 0),
            img.float() / 255.0,
            x.float().byte(),
            sg.take(x, i.long(), axis=0),
            sg.argmax(x.float(), dtype=sg.int64),
            img**2 + img.min(),
            y.half(),
            img.half(),
            img.bfloat16(),
            img.half().long() + y.bfloat16().byte().long(),
            sg.einsum("i,i->", y, y),
            sg.grad(lambda t: sg.take(t, i.long(), axis=0).sum())(x.float()),
        )

    args = (
        np.arange(6, dtype=np.int32),
        np.arange(6, dtype=np.uint8) * 40,
        np.array([1, -2], np.int32),
    )
    lowered = sg.compile(f, backend="cuda", arch="sm_90").trace(*args).lower()
    assert "int64_t" in lowered.source and "uint8_t" in lowered.source
    path = lowered.build()
    assert os.path.exists(path)
