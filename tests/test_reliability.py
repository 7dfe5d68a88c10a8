"""No silent wrong answers at the edges (issue 17, items 2, 4, 7, 9 and 11).

References: NumPy, closed forms, and PyTorch where installed.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.dtypes import DTypeError, Int32OverflowError
from shapegrad.train.losses import softmax_cross_entropy

MODES = ["eager", "numpy", "c"]
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


def _run(mode: str, fn: Callable[..., Any], *args: Any) -> Any:
    if mode == "eager":
        return fn(*[sg.tensor(a) if isinstance(a, np.ndarray) else a for a in args])
    if mode == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    return sg.compile(fn, backend=mode)(*args)


# --- item 2: user strings never reach generated source unescaped -------------------------


@needs_cc
def test_function_name_cannot_inject_code_into_the_c_source(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(tmp_path / "dump"))
    evil = "f */ int injected_symbol = 1; /*"
    fn = sg.compile(lambda x: x * 3.0, backend="c", name=evil)
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(fn(x).numpy(), 3 * x)
    (source,) = (tmp_path / "dump").rglob("*.c")
    text = source.read_text()
    assert "injected_symbol" in text  # the name is still there, readable ...
    assert "*/ int injected_symbol" not in text  # ... but it cannot close the comment
    with open(fn.lower(x).executable.source_path, "rb") as handle:
        assert b"injected_symbol" not in handle.read()  # no such symbol was compiled


def test_safe_name() -> None:
    from shapegrad._names import safe_name

    assert "*/" not in safe_name("f */ int x; /*")
    assert "/" not in safe_name("../../etc/passwd") and ".." not in safe_name("../../etc/passwd")
    assert safe_name("<lambda>") == "<lambda>" and safe_name("Model.loss") == "Model.loss"
    assert safe_name("") == "fn" and len(safe_name("x" * 1000)) == 80


@needs_cc
def test_debug_dump_names_stay_inside_the_dump_directory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "a" / "b" / "dump"
    monkeypatch.setenv("SHAPEGRAD_DEBUG", str(dump))
    fn = sg.compile(lambda x: x + 1.0, backend="c", name="../../../escaped")
    fn(np.ones(2, np.float32))
    outside = [p for p in tmp_path.rglob("*") if not p.resolve().is_relative_to(dump.resolve())]
    assert all(p in (tmp_path / "a", tmp_path / "a" / "b", dump) for p in outside), outside


# --- item 4: integers that do not fit int32 are refused, never wrapped --------------------

TABLE = np.arange(12, dtype=np.float32).reshape(4, 3)
BIG = np.array([2**32 + 1])  # wraps to 1 in int32


@pytest.mark.parametrize("mode", MODES)
def test_take_refuses_int64_indices_outside_int32(mode: str) -> None:
    with pytest.raises(Int32OverflowError, match="4294967297"):
        _run(mode, lambda t, i: sg.take(t, i, axis=0), TABLE, BIG)
    with pytest.raises(IndexError):  # also an IndexError, as an out-of-range index is
        _run(mode, lambda t, i: sg.embedding(t, i), TABLE, BIG)


def test_take_with_host_int64_indices_refuses_them_eagerly() -> None:
    with pytest.raises(Int32OverflowError, match="take: indices value 4294967297"):
        sg.take(sg.tensor(TABLE), BIG, axis=0)
    with pytest.raises(Int32OverflowError, match="embedding: indices value -4294967295"):
        sg.embedding(sg.tensor(TABLE), -BIG + 2)


@pytest.mark.parametrize("bad", [np.array([1.7]), np.array([True, False])])
def test_float_and_bool_index_arrays_are_rejected_not_truncated(bad: np.ndarray[Any, Any]) -> None:
    with pytest.raises(DTypeError, match="indices must be integers"):
        sg.take(sg.tensor(TABLE), bad, axis=0)
    with pytest.raises(DTypeError, match="indices must be integers"):
        sg.embedding(sg.tensor(TABLE), bad)


def test_in_range_int64_indices_still_work() -> None:
    got = sg.take(sg.tensor(TABLE), np.array([3, 0], np.int64), axis=0).numpy()
    np.testing.assert_array_equal(got, TABLE[[3, 0]])


@pytest.mark.parametrize("mode", MODES)
def test_cross_entropy_refuses_labels_outside_int32(mode: str) -> None:
    labels = np.array([0, 1, 2, 2**32 + 1])
    with pytest.raises(Int32OverflowError, match="4294967297"):
        _run(mode, sg.cross_entropy, TABLE, labels)


def test_tensor_creation_refuses_to_wrap() -> None:
    with pytest.raises(Int32OverflowError, match="1099511627776"):
        sg.tensor(np.array([2**40]))
    with pytest.raises(OverflowError):
        sg.tensor([1, -(2**31) - 1])
    assert sg.tensor(np.array([2**31 - 1, -(2**31)])).tolist() == [2**31 - 1, -(2**31)]


@pytest.mark.parametrize(
    ("mode", "backend"), [("eager", "numpy"), ("compiled", "numpy"), ("compiled", "c")]
)
def test_trainer_refuses_int64_labels_outside_int32(mode: str, backend: str) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    from shapegrad import models

    params = models.DigitsMLP.init(sg.nn.init.kaiming, seed=0, h=8)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    trainer = sg.ScalarTrainer(models.digits_loss, params, mode=mode, backend=backend)
    bad = np.array([0, 1, 2, 2**32 + 1])  # int64; wraps to 1 in int32
    with pytest.raises(Int32OverflowError):
        trainer.step(x, bad)
    trainer.step(x, np.array([0, 1, 2, 1]))  # int64 in range: fine (binds the fast path)
    trainer.step(x, np.array([0, 1, 2, 1]))
    with pytest.raises(Int32OverflowError):
        trainer.step(x, bad)
    with pytest.raises(Int32OverflowError):
        trainer.step_many(np.stack([x, x]), np.stack([bad, bad]))


# --- item 7: cross-entropy with masked (-inf) logits is finite, like PyTorch --------------

INF = np.inf
MASKED = np.array([[0.0, -INF, 1.0], [2.0, 0.0, -INF], [-INF, -INF, 3.0]], np.float32)
LABELS = np.array([0, 1, 2], np.int32)


def _masked_reference() -> tuple[float, np.ndarray[Any, Any]]:
    """Closed form in float64: loss = mean(lse - x[label]); grad = (softmax - onehot) / n."""
    x = MASKED.astype(np.float64)
    shift = x.max(axis=1, keepdims=True)
    e = np.exp(x - shift)
    lse = np.log(e.sum(axis=1)) + shift[:, 0]
    loss = float(np.mean(lse - x[np.arange(3), LABELS]))
    grad = (e / e.sum(axis=1, keepdims=True) - np.eye(3)[LABELS]) / 3
    return loss, grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss", [sg.cross_entropy, softmax_cross_entropy], ids=["sg", "train"])
def test_cross_entropy_with_masked_logits_is_finite(mode: str, loss: Any) -> None:
    value, grad = _run(mode, sg.value_and_grad(loss), MASKED, LABELS)
    want_value, want_grad = _masked_reference()
    assert np.isfinite(value.item())
    np.testing.assert_allclose(value.item(), want_value, rtol=1e-6)
    np.testing.assert_allclose(grad.numpy(), want_grad, rtol=1e-5, atol=1e-7)
    onehot = np.eye(3, dtype=np.float32)[LABELS]
    soft_value = _run(mode, loss, MASKED, onehot)
    np.testing.assert_allclose(soft_value.item(), want_value, rtol=1e-6)


def test_cross_entropy_with_masked_logits_matches_pytorch() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is the reference here")
    x = torch.tensor(MASKED.astype(np.float64), requires_grad=True)
    want = torch.nn.functional.cross_entropy(x, torch.tensor(LABELS, dtype=torch.long))
    want.backward()
    value, grad = sg.value_and_grad(sg.cross_entropy)(sg.tensor(MASKED.astype(np.float64)), LABELS)
    np.testing.assert_allclose(value.item(), want.item(), rtol=1e-12)
    assert x.grad is not None
    np.testing.assert_allclose(grad.numpy(), x.grad.numpy(), rtol=1e-12, atol=1e-15)


@needs_cc
def test_compiled_masked_cross_entropy_is_the_same_for_every_batch() -> None:
    fn = sg.compile(sg.cross_entropy, backend="c")
    rng = np.random.default_rng(3)
    for _ in range(5):
        logits = rng.standard_normal((8, 5)).astype(np.float32)
        labels = rng.integers(0, 5, 8).astype(np.int32)
        logits[np.arange(8), (labels + 1) % 5] = -INF
        want = sg.cross_entropy(sg.tensor(logits), labels).item()
        assert np.isfinite(want)
        np.testing.assert_allclose(fn(logits, labels).item(), want, rtol=1e-6)


# --- items 9 and 11: reductions over zero-length axes --------------------------------------

EMPTY = np.zeros((3, 0), np.float32)


@pytest.mark.parametrize("mode", MODES)
def test_mean_over_an_empty_axis_is_nan(mode: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy: "Mean of empty slice"
        want = EMPTY.mean(axis=1)
    got = _run(mode, lambda x: sg.mean(x, axis=1), EMPTY).numpy()
    assert got.shape == (3,) and np.isnan(got).all() and np.isnan(want).all()
    assert np.isnan(_run(mode, lambda x: sg.mean(x), EMPTY).item())


@pytest.mark.parametrize("mode", MODES)
def test_logsumexp_and_softmax_over_an_empty_axis(mode: str) -> None:
    lse = _run(mode, lambda x: sg.logsumexp(x, axis=1), EMPTY).numpy()
    np.testing.assert_array_equal(lse, np.full(3, -np.inf, np.float32))
    kept = _run(mode, lambda x: sg.logsumexp(x, axis=1, keepdims=True), EMPTY)
    assert kept.shape == (3, 1)
    assert _run(mode, lambda x: sg.softmax(x, axis=1), EMPTY).shape == (3, 0)
    assert _run(mode, lambda x: sg.log_softmax(x, axis=1), EMPTY).shape == (3, 0)
    grad = _run(mode, sg.grad(lambda x: sg.softmax(x, axis=1).sum()), EMPTY)
    assert grad.shape == (3, 0)


def test_empty_axis_reductions_match_pytorch() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is the reference here")
    z = torch.zeros(3, 0)
    np.testing.assert_array_equal(
        sg.logsumexp(sg.tensor(EMPTY), axis=1).numpy(), torch.logsumexp(z, 1).numpy()
    )
    np.testing.assert_array_equal(sg.mean(sg.tensor(EMPTY), axis=1).numpy(), z.mean(1).numpy())
    assert sg.softmax(sg.tensor(EMPTY), axis=1).shape == tuple(torch.softmax(z, 1).shape)


# --- item 5: a compiled out-of-range label raises the eager IndexError ----------------------


@pytest.mark.parametrize(
    ("mode", "backend"), [("eager", "c"), ("compiled", "numpy"), ("compiled", "c")]
)
def test_trainer_out_of_range_label_raises_and_training_stops(mode: str, backend: str) -> None:
    if backend == "c" and mode == "compiled" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    from shapegrad import models

    params = models.DigitsMLP.init(sg.nn.init.kaiming, seed=0, h=8)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    good, bad = np.array([0, 1, 2, 9], np.int32), np.array([0, 1, 2, 10], np.int32)
    trainer = sg.ScalarTrainer(models.digits_loss, params, mode=mode, backend=backend)
    trainer.step(x, good)
    before = [p.numpy().copy() for p in trainer.get_params()]
    with pytest.raises(IndexError, match=r"cross_entropy: labels must lie in \[0, 10\)"):
        trainer.step(x, bad)
    with pytest.raises(IndexError, match=r"labels must lie in \[0, 10\)"):
        trainer.step_many(np.stack([x, x]), np.stack([bad, good]))
    for got, want in zip(trainer.get_params(), before, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)  # the failing steps changed nothing
    assert np.isfinite(trainer.step(x, good))


# --- item 6: a bound step fed its own output -------------------------------------------------


@needs_cc
def test_bound_step_fed_its_own_output_reads_a_private_copy() -> None:
    def f(a: sg.Tensor) -> tuple[sg.Tensor]:
        return (sg.tanh(a @ a.T) * 2.0 + a.T,)

    def reference(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return np.tanh(a.astype(np.float64) @ a.T.astype(np.float64)) * 2.0 + a.T

    a = np.random.default_rng(0).standard_normal((96, 96)).astype(np.float32)
    step = sg.compile(f, backend="c").lower(a).executable.bind(None)
    (y,) = step(a)
    fed = y.copy()
    (z,) = step(y)  # the program writes y while it would read it
    np.testing.assert_allclose(z, reference(fed), rtol=1e-4, atol=1e-4)
    (w,) = step(z[:])  # a view of the output: the same memory
    np.testing.assert_allclose(
        w, reference(reference(fed).astype(np.float32)), rtol=1e-3, atol=1e-3
    )
    ys = step.run_steps(np.stack([a, a]))[0]
    fed_stack = ys.copy()
    zs = step.run_steps(ys)[0]
    for got, v in zip(zs, fed_stack, strict=True):
        np.testing.assert_allclose(got, reference(v), rtol=1e-4, atol=1e-4)


# --- item 8: long float32 sums in compiled C are accumulated in blocks -----------------------


@needs_cc
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.sum(),
        lambda x: (x * 2.0 + 1.0).sum(),
        lambda x: x.reshape((1 << 16, 64)).mean(),
        lambda x: x.reshape((1 << 21, 2)).sum(axis=0),
    ],
    ids=["sum", "fused", "mean", "axis0"],
)
def test_long_float32_sums_are_as_accurate_as_numpy(fn: Callable[..., Any]) -> None:
    x = np.random.default_rng(0).random(1 << 22, dtype=np.float32)
    got = sg.compile(fn, backend="c")(x).numpy().astype(np.float64)
    want = fn(sg.tensor(x.astype(np.float64))).numpy()  # float64 reference
    numpy_err = (
        np.abs(fn(sg.tensor(x)).numpy().astype(np.float64) - want).max() / np.abs(want).max()
    )
    err = np.abs(got - want).max() / np.abs(want).max()
    # one float32 accumulator (per vector lane) was off by ~3e-6 here; NumPy's pairwise ~3e-8
    assert err <= max(4 * numpy_err, 2e-7), (err, numpy_err)


@needs_cc
def test_fused_sum_of_2_pow_28_ones_does_not_saturate() -> None:
    # The case without a 1 GB input: an outer product of ones, fused into the sum.
    # One float32 accumulator per vector lane stalls at 2**24 per lane (2**28 -> 2**27).
    x = np.ones(1 << 14, np.float32)
    total = sg.compile(lambda x: (x[None, :] * x[:, None]).sum(), backend="c")(x).item()
    assert total == float(1 << 28)


# --- item 11 (codegen): negative constants under negation, empty constants -------------------


@pytest.mark.parametrize("mode", MODES)
def test_negated_pad_with_a_negative_constant(mode: str) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = _run(mode, lambda x: -sg.pad(x, 1, constant_values=-2.0), x).numpy()
    np.testing.assert_array_equal(got, -np.pad(x, 1, constant_values=-2.0))
    got = _run(mode, lambda x: -(x * 0.0 - 2.0) - (-3.5), x).numpy()
    np.testing.assert_array_equal(got, np.full_like(x, 5.5))


@needs_cc
def test_negated_negative_constant_never_renders_as_decrement() -> None:
    from shapegrad.backends.c import generate

    x = np.ones((2, 3), np.float32)
    graph = sg.compile(lambda x: -sg.pad(x, 1, constant_values=-2.0), backend="numpy").graph(x)
    _, source = generate(graph)
    assert "--2" not in source


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", [(0,), (2, 0), (1,)])
def test_programs_with_empty_constants(mode: str, shape: tuple[int, ...]) -> None:
    x = np.ones(shape, np.float32)
    got = _run(mode, lambda x: x + sg.zeros((0,)), x)
    assert got.shape == np.broadcast_shapes(shape, (0,))
    got = _run(mode, lambda x: sg.concat([x.reshape((-1,)), sg.full((0,), 3.0)]) * 2.0, x)
    np.testing.assert_array_equal(got.numpy(), np.full(x.size, 2.0, np.float32))
    assert _run(mode, lambda x: (x + sg.zeros((0,))).sum() + x.sum(), x).item() == x.sum()


# --- item 12: clear errors at the trainer / bound-step / compiled-call boundaries ------------


def _digits_trainer(mode: str, backend: str) -> Any:
    from shapegrad import models

    params = models.DigitsMLP.init(sg.nn.init.kaiming, seed=0, h=8)
    return sg.ScalarTrainer(models.digits_loss, params, mode=mode, backend=backend)


X4 = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
Y4 = np.array([0, 1, 2, 1], np.int32)


@pytest.mark.parametrize(("mode", "backend"), [("eager", "numpy"), ("compiled", "c")])
def test_trainer_step_with_none_names_the_input(mode: str, backend: str) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    trainer = _digits_trainer(mode, backend)
    for _ in range(2):  # before and after the fast path is bound
        with pytest.raises(TypeError, match=r"input 0 of the loss .* is NoneType"):
            trainer.step(None, Y4)
        trainer.step(X4, Y4)


@pytest.mark.parametrize(("mode", "backend"), [("eager", "numpy"), ("compiled", "c")])
def test_step_many_with_zero_steps_and_mismatched_k(mode: str, backend: str) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    trainer = _digits_trainer(mode, backend)
    trainer.step(X4, Y4)
    before = [p.numpy().copy() for p in trainer.get_params()]
    step = trainer.global_step
    losses = trainer.step_many(np.zeros((0, 4, 64), np.float32), np.zeros((0, 4), np.int32))
    assert losses.shape == (0,) and trainer.global_step == step
    for got, want in zip(trainer.get_params(), before, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    with pytest.raises(ValueError, match=r"different step counts K: \[2, 3\]"):
        trainer.step_many(np.stack([X4, X4]), np.stack([Y4, Y4, Y4]))


@needs_cc
def test_bound_step_with_a_wrong_number_of_inputs_names_them() -> None:
    a = np.ones(2, np.float32)
    step = sg.compile(lambda a, b: (a * b,), backend="c").lower(a, a).executable.bind(None)
    with pytest.raises(TypeError, match=r"compiled step: expected 2 inputs \['a', 'b'\], got 1"):
        step(a)
    with pytest.raises(TypeError, match=r"expected 2 inputs .* got 3"):
        step(a, a, a)
    np.testing.assert_array_equal(step(a, a)[0], a)


@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_lists_passed_to_a_compiled_function(backend: str) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    fn = sg.compile(lambda a, b: (a * b).sum(), backend=backend)
    assert fn([1.0, 2.0], [3.0, 4.0]).item() == 11.0  # a list of numbers is array data
    with pytest.raises(TypeError) as info:  # a tuple is a container: say so
        fn((1.0, 2.0), (3.0, 4.0))
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "argument 0 is a tuple of 2 numbers" in notes and "np.asarray" in notes
    with pytest.raises(TypeError, match=r"a list of tensors is not a tensor.*sg.stack"):
        fn([np.ones(2)], np.ones(2))
    assert fn(np.asarray([1.0, 2.0]), np.asarray([3.0, 4.0])).item() == 11.0
