"""Numerics that must hold in every mode (issue 24, items 2, 3, 4, 11, 15 and 16).

References: NumPy in float64 (rounded once to the result type), closed forms, and
PyTorch where installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

MODES = ["eager", "numpy", "c"]


def _run(mode: str, fn: Callable[..., Any], *args: Any) -> Any:
    if mode == "eager":
        return fn(*[sg.tensor(a) if isinstance(a, np.ndarray) else a for a in args])
    if mode == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    return sg.compile(fn, backend=mode)(*args)


def _f16(value: Any) -> Any:
    """The float64 reference rounded once to float16 (what a float32 accumulator gives)."""
    return np.asarray(value, np.float64).astype(np.float16)


# --- item 2: float16 sums and products accumulate in float32 ------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_float16_sum_of_ones_is_exact(mode: str) -> None:
    out = _run(mode, lambda x: sg.sum(x), np.ones(5000, np.float16))
    assert out.dtype == sg.float16 and float(out.item()) == 5000.0  # float16 acc: 2048


@pytest.mark.parametrize("mode", MODES)
def test_float16_dot_product_of_ones_is_exact(mode: str) -> None:
    a, b = np.ones((1, 4096), np.float16), np.ones((4096, 1), np.float16)
    out = _run(mode, lambda a, b: a @ b, a, b)
    assert out.dtype == sg.float16 and float(out.numpy()[0, 0]) == 4096.0


@pytest.mark.parametrize("mode", MODES)
def test_float16_mean_and_var_match_float64_rounded_once(mode: str) -> None:
    x = np.full(10000, 0.1, np.float16)
    mean = _run(mode, lambda x: sg.mean(x), x)
    np.testing.assert_allclose(float(mean.item()), x.astype(np.float64).mean(), rtol=1e-3)
    rng = np.random.default_rng(0)
    y = (rng.standard_normal((3, 3000)) * 2 + 1).astype(np.float16)
    var = _run(mode, lambda y: sg.var(y, axis=1), y)
    np.testing.assert_allclose(var.numpy(), y.astype(np.float64).var(axis=1), rtol=3e-3)


@pytest.mark.parametrize("mode", MODES)
def test_float16_logsumexp_matches_float64(mode: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6000)).astype(np.float16)
    out = _run(mode, lambda x: sg.logsumexp(x, axis=-1), x)
    ref = np.log(np.exp(x.astype(np.float64)).sum(axis=-1))
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=2e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(3000, 16), (16, 3000), (5, 700, 9)])
def test_float16_reductions_of_every_layout(mode: str, shape: tuple[int, ...]) -> None:
    """Reductions over the leading axis take the row form (a float32 scratch row)."""
    x = np.random.default_rng(2).uniform(0.5, 1.5, shape).astype(np.float16)
    for axis in range(len(shape)):
        out = _run(mode, lambda x, a=axis: sg.sum(x, axis=a), x)
        np.testing.assert_allclose(
            out.numpy().astype(np.float64), _f16(x.astype(np.float64).sum(axis=axis)), rtol=1e-3
        )


@pytest.mark.parametrize("mode", MODES)
def test_float16_products_accumulate_in_float32(mode: str) -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 1, (8, 2500)).astype(np.float16)
    b = rng.uniform(0, 1, (2500, 24)).astype(np.float16)
    out = _run(mode, lambda a, b: a @ b, a, b)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.numpy().astype(np.float64), ref, rtol=2e-3)
    # A product with an epilogue (the kernel scales the accumulated row).
    scaled = _run(mode, lambda a, b: (a @ b) * 0.5, a, b)
    np.testing.assert_allclose(scaled.numpy().astype(np.float64), ref * 0.5, rtol=2e-3)


def test_float16_accumulators_are_in_the_loop_ir() -> None:
    """The widening is the lowering's (the Target's accumulator type), not a renderer's."""
    from shapegrad.compiler import loops as L
    from shapegrad.compiler.target import C_TARGET, CUDA_TARGET

    assert C_TARGET.accumulator("float16") == "float32" == CUDA_TARGET.accumulator("float16")
    assert C_TARGET.accumulator("float32") == "float32"
    fn = sg.compile(lambda x: sg.sum(x, axis=1), backend="numpy")
    program = _loop_program(fn, np.ones((4, 9000), np.float16))
    reduces = [s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.Reduce)]
    assert reduces and all(r.init.dtype == sg.float32 for r in reduces)


def _loop_program(fn: Any, *args: Any) -> Any:
    from shapegrad.compiler.pipeline import lower_program
    from shapegrad.compiler.target import C_TARGET

    graph = fn.graph(*args)
    program, _ = lower_program(graph, C_TARGET)
    return program


# --- item 3: logsumexp at infinities -------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_logsumexp_of_infinite_rows(mode: str) -> None:
    inf = np.inf
    x = np.array(
        [[1.0, inf, 0.0], [-inf, -inf, -inf], [-inf, 2.0, -inf], [inf, inf, -inf], [3.0, 1.0, 2.0]],
        np.float32,
    )
    out = _run(mode, lambda x: sg.logsumexp(x, axis=-1), x).numpy()
    with np.errstate(divide="ignore"):
        finite_ref = np.log(np.exp(x[4].astype(np.float64)).sum())
    np.testing.assert_array_equal(out[:4], [inf, -inf, 2.0, inf])
    np.testing.assert_allclose(out[4], finite_ref, rtol=1e-6)
    keep = _run(mode, lambda x: sg.logsumexp(x, axis=1, keepdims=True), x).numpy()
    np.testing.assert_array_equal(keep[:4, 0], [inf, -inf, 2.0, inf])


@pytest.mark.parametrize("mode", MODES)
def test_logsumexp_gradient_is_finite_where_torchs_is(mode: str) -> None:
    """Masked rows (some -inf, the attention pattern) keep their softmax gradient; the
    closed form is softmax(x) with 0 at the -inf entries."""
    x = np.array([[-np.inf, 2.0, 0.5, -np.inf], [1e4, -np.inf, 1e4 - 1.0, 0.0]], np.float32)
    grad_fn = sg.grad(lambda x: sg.sum(sg.logsumexp(x, axis=-1)))
    g = _run(mode, grad_fn, x).numpy()
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(g, e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
    torch = pytest.importorskip("torch", reason="PyTorch not installed: closed form checked")
    t = torch.tensor(x64, requires_grad=True)
    torch.logsumexp(t, dim=-1).sum().backward()
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-5, atol=1e-7)


# --- item 15: functional ops accept NumPy arrays like tensors ---------------------------

_A = np.arange(12, dtype=np.float32).reshape(3, 4) / 7.0
_IMG = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4) / 9.0
_ARRAY_OPS: dict[str, Callable[[Any], Any]] = {
    "sum": lambda a: sg.sum(a, axis=1),
    "mean": lambda a: sg.mean(a),
    "max": lambda a: sg.max(a, axis=0),
    "min": lambda a: sg.min(a),
    "var": lambda a: sg.var(a, axis=1),
    "logsumexp": lambda a: sg.logsumexp(a, axis=1),
    "softmax": lambda a: sg.softmax(a),
    "log_softmax": lambda a: sg.log_softmax(a),
    "argmax": lambda a: sg.argmax(a),
    "reshape": lambda a: sg.reshape(a, (4, 3)),
    "take": lambda a: sg.take(a, [2, 0], axis=1),
    "embedding": lambda a: sg.embedding(a, [[1, 2]]),
    "where": lambda a: sg.where(a > 0.5, a, 0.0),
    "maximum": lambda a: sg.maximum(a, _A[::-1].copy()),
    "pow": lambda a: sg.pow(a, 3.0),
    "zeros_like": lambda a: sg.zeros_like(a),
    "ones_like": lambda a: sg.ones_like(a),
    "stop_gradient": lambda a: sg.stop_gradient(a),
    "layer_norm": lambda a: sg.layer_norm(a),
    "conv2d": lambda a: sg.conv2d(_img(a), np.ones((3, 2, 2, 2), np.float32)),
    "max_pool2d": lambda a: sg.max_pool2d(_img(a), 2),
    "avg_pool2d": lambda a: sg.avg_pool2d(_img(a), 2),
}


def _img(like: Any) -> Any:
    """The image input in the same form (array or tensor) as ``like``."""
    return _IMG if isinstance(like, np.ndarray) else sg.tensor(_IMG)


@pytest.mark.parametrize("name", sorted(_ARRAY_OPS))
def test_functional_ops_accept_numpy_arrays(name: str) -> None:
    op = _ARRAY_OPS[name]
    from_array, from_tensor = op(_A), op(sg.tensor(_A))
    assert isinstance(from_array, sg.Tensor)
    assert from_array.dtype == from_tensor.dtype and from_array.shape == from_tensor.shape
    np.testing.assert_array_equal(from_array.numpy(), from_tensor.numpy())


def test_arrays_captured_in_compiled_code_and_bad_operands() -> None:
    fn = sg.compile(lambda x: sg.max(x, axis=1) + sg.mean(_A, axis=1), backend="numpy")
    out = fn(sg.tensor(_A))
    np.testing.assert_allclose(out.numpy(), _A.max(axis=1) + _A.mean(axis=1), rtol=1e-6)
    with pytest.raises(TypeError, match="reduce_max: unsupported operand type _Shaped"):
        sg.max(_Shaped())


class _Shaped:
    """Has ``ndim``/``shape`` but is no array: must be a clear TypeError, not AttributeError."""

    ndim, shape = 1, (3,)


# --- item 4: int32 sums and arange never wrap ------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_int32_sum_overflow_raises_in_every_mode(mode: str) -> None:
    big = np.full(3, 2**30, np.int32)  # 3 * 2**30 wrapped to -1073741824 before
    with pytest.raises(IndexError, match="int32 total is outside"):
        _run(mode, lambda x: sg.sum(x), big).numpy()
    with pytest.raises(IndexError, match="int32 total is outside"):
        _run(mode, lambda x: x.sum(axis=0), -big).numpy()


@pytest.mark.parametrize("mode", MODES)
def test_int32_sums_in_range_are_exact(mode: str) -> None:
    x = np.array([[2**30, 2**30 - 1, -(2**30)], [2**31 - 1 - 2**30, -5, 5]], np.int32)
    out = _run(mode, lambda x: (sg.sum(x, axis=1), sg.sum(x, axis=0, keepdims=True)), x)
    assert out[0].dtype == sg.int32
    np.testing.assert_array_equal(out[0].numpy(), x.astype(np.int64).sum(axis=1))
    np.testing.assert_array_equal(out[1].numpy(), x.astype(np.int64).sum(axis=0, keepdims=True))


def test_int32_sum_overflow_is_an_int32_overflow_error_eagerly() -> None:
    from shapegrad.dtypes import Int32OverflowError

    with pytest.raises(Int32OverflowError):
        sg.sum(sg.tensor(np.full(3, 2**30, np.int32)))


def test_arange_refuses_values_beyond_int32() -> None:
    from shapegrad.dtypes import Int32OverflowError

    with pytest.raises(Int32OverflowError, match="arange: int32 values from 0 to 2147483650"):
        sg.arange(2**31 + 3)
    with pytest.raises(Int32OverflowError, match="arange"):
        sg.arange(-(2**31) - 2, 0)
    assert sg.arange(2**31 - 3, 2**31 - 1).tolist() == [2**31 - 3, 2**31 - 2]


# --- items 8 and 14: settings and shapes checked where they enter -------------------------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: sg.layer_norm(sg.ones((2, 3)), eps=-1),
            "layer_norm: eps must be a finite number >= 0, got -1",
        ),
        (lambda: sg.layer_norm(sg.ones((2, 3)), eps=float("nan")), "layer_norm: eps .* got nan"),
        (
            lambda: sg.batch_norm(sg.ones((2, 3)), None, None, sg.zeros(3), sg.ones(3), True, 2.0),
            r"batch_norm: momentum must be a finite number in \[0, 1\], got 2.0",
        ),
        (
            lambda: sg.batch_norm(
                sg.ones((2, 3)), None, None, sg.zeros(3), sg.ones(3), True, eps=-1e-3
            ),
            "batch_norm: eps",
        ),
        (lambda: sg.group_norm(sg.ones((2, 4)), 2, eps=float("inf")), "group_norm: eps"),
        (
            lambda: sg.one_hot(sg.tensor([1]), -1),
            "one_hot: num_classes must be an integer >= 0, got -1",
        ),
        (lambda: sg.one_hot(sg.tensor([1]), 2.5), "one_hot: num_classes"),
    ],
)
def test_invalid_settings_are_clear_value_errors(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: sg.conv2d(sg.ones((1, 1, 3, 3)), sg.ones((1, 1, 0, 0))),
            "kernel must be at least 1x1, got 0x0",
        ),
        (lambda: sg.conv2d(sg.ones((1, 1, 3, 3)), sg.ones((1, 1, 2, 0))), "got 2x0"),
        (lambda: sg.zeros((2**40, 2**40)), "more than int64 indexes"),
        (lambda: sg.full((2**63,), 1.0), "9223372036854775808 elements"),
        (lambda: sg.eye(2**40), "iota: shape .* more than int64"),
    ],
)
def test_impossible_shapes_are_clear_shape_errors(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(sg.ShapeError, match=message):
        call()


def test_impossible_shapes_fail_at_trace_time_before_native_code() -> None:
    fn = sg.compile(lambda x: x + sg.zeros((2**33, 2**33)), backend="numpy")
    with pytest.raises(sg.ShapeError, match="broadcast: shape"):
        fn(sg.ones(1))


# --- item 16: layer_norm of constant rows -------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_of_constant_rows_is_exactly_zero(mode: str) -> None:
    """PyTorch gives 0; a float32 mean of 768 copies of 3.7 is not 3.7 in every order, and
    dividing its residue by sqrt(eps) gave up to 0.6 (C) and 0.04 (eager) before."""
    rows = np.stack([np.full(768, v, np.float32) for v in (0.1, 3.7, 1000.1, -2.5e4)])
    out = _run(mode, lambda x: sg.layer_norm(x), rows).numpy()
    np.testing.assert_array_equal(out, np.zeros_like(rows))
    grouped = _run(mode, lambda x: sg.group_norm(x, 2), rows.reshape(2, 4, 384)).numpy()
    np.testing.assert_array_equal(grouped, 0.0)


@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_matches_float64_and_its_gradient(mode: str) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 5, 64)) * 0.01 + 100.0).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    out = _run(mode, lambda x, w: sg.layer_norm(x, w), x, w).numpy()
    x64 = x.astype(np.float64)
    centered = x64 - x64.mean(-1, keepdims=True)
    ref = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-3)
    torch = pytest.importorskip("torch", reason="PyTorch not installed: values checked only")
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)  # cubes amplify rounding: O(1) data
    g = _run(mode, sg.grad(lambda x, w: sg.sum(sg.layer_norm(x, w) ** 3)), x, w).numpy()
    t = torch.tensor(x.astype(np.float64), requires_grad=True)
    y = torch.nn.functional.layer_norm(t, (64,), torch.tensor(w.astype(np.float64)), eps=1e-5)
    (y**3).sum().backward()
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-3, atol=1e-3)


# --- item 11: Python scalar arguments of compiled functions are weakly typed ----------------

_WEAK_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "x * s": lambda x, s: x * s,
    "s - x": lambda x, s: s - x,
    "x > s": lambda x, s: x > s,
    "maximum": lambda x, s: sg.maximum(x, s),
    "where": lambda x, s: sg.where(x > 1, x, s),
    "s * s + x": lambda x, s: s * s + x,
}


@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
@pytest.mark.parametrize("name", sorted(_WEAK_OPS))
def test_compiled_python_scalar_arguments_match_eager(backend: str, dtype: str, name: str) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    op = _WEAK_OPS[name]
    x = np.array([0, 1, 2, 3], dtype)
    fn = sg.compile(op, backend=backend)
    for s in (2, True):
        expected = op(sg.tensor(x), s)
        got = fn(sg.tensor(x), s)
        assert got.dtype == expected.dtype, (name, dtype, s)
        np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_compiled_float_scalar_meeting_an_int_tensor_is_the_eager_error() -> None:
    x = sg.tensor(np.arange(3, dtype=np.int32))
    with pytest.raises(sg.DTypeError, match="cannot combine a float value with a int32 tensor"):
        x * 2.5
    with pytest.raises(sg.DTypeError, match="cannot combine a float value with a int32 tensor"):
        sg.compile(lambda x, s: x * s, backend="numpy")(x, 2.5)


# --- found by the +-inf/NaN fuzzer ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_exp_of_nan_is_nan(mode: str) -> None:
    """The C target's denormal-flushing exp multiplied by [0 <= x - T], 0 for NaN, and gcc
    (-fno-signed-zeros) made exp(NaN) * 0 a 0: logsumexp of a NaN gave -inf."""
    x = np.array([np.nan, -np.inf, np.inf, -100.0, -700.0, 0.0, 1.0], np.float64)
    for dtype in (np.float32, np.float64):
        out = _run(mode, lambda x: sg.exp(x), x.astype(dtype)).numpy()
        with np.errstate(over="ignore", under="ignore"):
            want = np.exp(x.astype(dtype))
        # atol: the C target flushes results below the smallest normal to 0
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=float(np.finfo(dtype).tiny))
        lse = _run(mode, lambda x: sg.logsumexp(x, axis=0, keepdims=True), x[None].astype(dtype))
        assert np.isnan(lse.numpy()[0, 0])


@pytest.mark.parametrize("mode", MODES)
def test_log_softmax_of_infinite_rows_is_pytorchs(mode: str) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch not installed")
    x = np.array([[1.0, np.inf, 0.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 2.0, 1.0]])
    out = _run(mode, lambda x: sg.log_softmax(x, axis=-1), x).numpy()
    np.testing.assert_allclose(out, torch.log_softmax(torch.tensor(x), dim=-1).numpy())


@pytest.mark.parametrize("mode", MODES)
def test_logsumexp_gradient_at_infinite_rows_is_pytorchs(mode: str) -> None:
    """Where PyTorch's gradient is not finite (a +inf entry: NaN; an all -inf row: NaN),
    ours is the same, and the finite entries of a +inf row get 0 as there."""
    torch = pytest.importorskip("torch", reason="PyTorch not installed")
    x = np.array([[1.0, np.inf, 0.0], [-np.inf, -np.inf, -np.inf]])
    g = _run(mode, sg.grad(lambda x: sg.sum(sg.logsumexp(x, axis=-1))), x).numpy()
    t = torch.tensor(x, requires_grad=True)
    torch.logsumexp(t, dim=-1).sum().backward()
    np.testing.assert_array_equal(g, t.grad.numpy())  # NaN where PyTorch has NaN


@pytest.mark.parametrize("mode", MODES)
def test_float16_scatter_add_accumulates_in_float32(mode: str) -> None:
    """The gradient of an embedding lookup sums the rows of repeated ids: 5,000 ones into
    one row is 5,000 (a float16 accumulator stops at 2048)."""
    table = np.zeros((3, 2), np.float16)
    ids = np.zeros(5000, np.int32)
    ids[::7] = 2
    g = _run(mode, sg.grad(lambda t: sg.sum(sg.embedding(t, ids))), table).numpy()
    counts = np.bincount(ids, minlength=3).astype(np.float64)
    np.testing.assert_array_equal(g.astype(np.float64), _f16(np.repeat(counts[:, None], 2, 1)))
