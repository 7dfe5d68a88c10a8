"""sg.compile's per-call fast path: the exact-structure key is the validation.

A call whose argument structure, shapes, dtypes and contiguity match an earlier
call skips re-flattening and re-validation; these tests check that anything
different still retraces or gets the clear error, never reaching native code
with a wrong buffer, and that results equal eager execution.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import get_backend
from shapegrad.dtypes import DTypeError
from shapegrad.shapes import ShapeError


def c_available() -> bool:
    try:
        get_backend("c")
    except (ImportError, RuntimeError):
        return False
    return True


BACKENDS = ["numpy", pytest.param("c", marks=pytest.mark.skipif(not c_available(), reason="no C"))]


def loss_fn(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2 = params
    z = sg.reshape(sg.tanh(x @ w1 + b1) @ w2 + b2, (-1,))
    return sg.mean((z - y) * (z - y))


def step(params: Any, x: sg.Tensor, y: sg.Tensor, lr: float) -> Any:
    loss, grads = sg.value_and_grad(loss_fn)(params, x, y)
    return loss, tuple(p - lr * g for p, g in zip(params, grads, strict=True))


def make(seed: int = 0, batch: int = 6) -> tuple[Any, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(3, 5), (5,), (5, 1), (1,)]
    params = tuple(sg.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes)
    x = rng.standard_normal((batch, 3)).astype(np.float32)
    y = rng.standard_normal(batch).astype(np.float32)
    return params, x, y


def check_against_eager(got: Any, params: Any, x: np.ndarray, y: np.ndarray, lr: float) -> None:
    want = step(params, sg.tensor(x), sg.tensor(y), lr)
    np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-5, atol=1e-6)
    for g, w in zip(got[1], want[1], strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_repeat_calls_hit_without_retrace_and_match_eager(backend: str) -> None:
    fast = sg.compile(step, backend=backend)
    params, x, y = make()
    for k in range(3):
        x_k = x + np.float32(k)  # new array objects each call, same structure
        check_against_eager(fast(params, x_k, y, 0.1), params, x_k, y, 0.1)
    x[0, 0] = 5.0  # the same object refilled in place: the new values are used
    check_against_eager(fast(params, x, y, 0.1), params, x, y, 0.1)
    check_against_eager(fast(params, x, y, 0.1), params, x, y, 0.1)
    assert fast.trace_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_signature_retraces(backend: str) -> None:
    fast = sg.compile(step, backend=backend)
    params, x, y = make()
    fast(params, x, y, 0.1)
    params8, x8, y8 = make(1, batch=8)
    check_against_eager(fast(params8, x8, y8, 0.2), params8, x8, y8, 0.2)
    assert fast.trace_count == 2
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    p64 = tuple(sg.tensor(p.numpy().astype(np.float64)) for p in params)
    got = fast(p64, x64, y64, 0.1)
    assert fast.trace_count == 3 and got[0].dtype == sg.float64
    check_against_eager(got, p64, x64, y64, 0.1)
    fast(list(params), x, y, 0.1)  # a list, not a tuple: a different structure
    assert fast.trace_count == 4
    fast(params, x, y, 0.1)  # back to the first signature: cached
    assert fast.trace_count == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_shape_and_dtype_after_warm_up_get_the_clear_error(backend: str) -> None:
    fast = sg.compile(step, backend=backend)
    params, x, y = make()
    fast(params, x, y, 0.1)
    with pytest.raises(ShapeError, match="3"):
        fast(params, np.ones((6, 4), np.float32), y, 0.1)  # x @ w1: 4 vs 3
    with pytest.raises(DTypeError):
        fast(params, x.astype(np.int32), y, 0.1)  # int32 @ float32
    check_against_eager(fast(params, x, y, 0.1), params, x, y, 0.1)  # still fine after


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_inputs_are_copied_not_passed_through(backend: str) -> None:
    fast = sg.compile(step, backend=backend)
    params, x, y = make()
    fast(params, x, y, 0.1)
    wide = np.asfortranarray(x)  # same shape and dtype, not C-contiguous
    assert not wide.flags.c_contiguous
    for _ in range(2):  # the second call takes the fast path with this layout
        check_against_eager(fast(params, wide, y, 0.1), params, x, y, 0.1)
    strided = np.repeat(y, 2)[::2]
    check_against_eager(fast(params, x, strided, 0.1), params, x, y, 0.1)
    transposed = tuple(sg.tensor(p.numpy().T.copy().T) for p in params)
    check_against_eager(fast(transposed, x, y, 0.1), params, x, y, 0.1)


@pytest.mark.skipif(not c_available(), reason="no C compiler / C backend")
def test_c_executable_still_validates_direct_calls() -> None:
    fast = sg.compile(step, backend="c")
    params, x, y = make()
    lowered = fast.lower(params, x, y, 0.1)
    exe = lowered.executable
    good = [p.numpy() for p in params] + [x, y, np.float32(0.1).reshape(())]
    good = [np.asarray(a) for a in good]
    assert exe(good)[0].shape == ()
    bad_shape = [*good[:4], np.ones((6, 4), np.float32), *good[5:]]
    with pytest.raises(ShapeError, match=r"\[6, 4\]|6, 4"):
        exe(bad_shape)
    with pytest.raises(DTypeError, match="float64"):
        exe([*good[:4], x.astype(np.float64), *good[5:]])
    with pytest.raises(ValueError, match="C-contiguous"):
        exe([*good[:4], np.asfortranarray(x), *good[5:]])
    with pytest.raises(TypeError, match="NumPy array"):
        exe([*good[:4], x.tolist(), *good[5:]])


def test_static_and_keyword_arguments_keep_working() -> None:
    def scaled(x: sg.Tensor, mode: str, factor: float = 1.0) -> sg.Tensor:
        return x * factor if mode == "mul" else x + factor

    fast = sg.compile(scaled, backend="numpy", static_argnums=(1,))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(fast(x, "mul", factor=3.0).numpy(), x * 3)
    np.testing.assert_allclose(fast(x, "add", factor=3.0).numpy(), x + 3)
    np.testing.assert_allclose(fast(x, "mul", factor=2.0).numpy(), x * 2)
    assert fast.trace_count == 2
    plain = sg.compile(lambda d: d["a"] * d["b"], backend="numpy")
    a, b = np.ones(3, np.float32), np.full(3, 2.0, np.float32)
    for _ in range(2):
        np.testing.assert_allclose(plain({"a": a, "b": b}).numpy(), a * b)
    np.testing.assert_allclose(plain({"b": b, "a": a + 1}).numpy(), (a + 1) * b)


class Affine(sg.nn.Module):
    w: sg.Float[sg.Tensor, "3 2"]
    b: sg.Float[sg.Tensor, " 2"]  # the space keeps a one-dim spec a string (not a forward ref)


@dataclasses.dataclass
class Pair:
    a: sg.Tensor
    b: sg.Tensor


def test_modules_and_dataclasses_take_the_fast_path() -> None:
    m = Affine.init(0)
    x = np.ones((4, 3), np.float32)
    f = sg.compile(lambda m, p, x: (x @ m.w + m.b) * p.a + p.b, backend="numpy")
    pair = Pair(sg.tensor(np.float32(2.0)), sg.tensor(np.zeros(2, np.float32)))
    first = f(m, pair, x).numpy()
    second = f(m, pair, x).numpy()
    assert len(f._fast) == 1  # the second call was served by the exact-structure key
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, 2 * (x @ m.w.numpy() + m.b.numpy()), rtol=1e-6)
    other = Affine.init(1)
    np.testing.assert_allclose(
        f(other, pair, x).numpy(), 2 * (x @ other.w.numpy() + other.b.numpy()), rtol=1e-6
    )
    assert f.trace_count == 1
