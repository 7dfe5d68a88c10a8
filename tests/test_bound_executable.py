"""The bound, stateful executable protocol (backends/base.py) and its C implementation.

A linear least-squares step ``w <- w - lr * grad`` has a closed-form gradient,
so every value the bound executable produces is checked against float64
NumPy written here, not against another shapegrad path.
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import BoundExecutable, Executable, StateLayout, get_backend

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
LR = 0.05


def sgd_step(w: sg.Tensor, x: sg.Tensor, y: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor]:
    """Returns ``(loss, new_w)``: the loss is a free output, ``new_w`` updates the state."""
    loss, g = sg.value_and_grad(lambda w: ((x @ w - y) ** 2).mean())(w)
    return loss, w - LR * g


def ref_step(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """The same step in float64 NumPy: loss = mean(r^2), grad = 2 x^T r / r.size."""
    w, x, y = (a.astype(np.float64) for a in (w, x, y))
    r = x @ w - y
    return float((r**2).mean()), w - LR * 2.0 * x.T @ r / r.size


def _f(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _executable(backend: str, w: np.ndarray, x: np.ndarray, y: np.ndarray) -> Executable:
    fn = sg.compile(sgd_step, backend=backend, donate_argnums=0)
    exe: Executable = fn.lower(w, x, y).executable
    return exe


def _bound(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[Executable, BoundExecutable]:
    exe = _executable("c", w, x, y)
    bound = exe.bind([w])
    assert bound is not None
    return exe, bound


def test_layout_follows_the_graph_aliases() -> None:
    w, x, y = _f(3, 2), _f(5, 3, seed=1), _f(5, 2, seed=2)
    graph = sg.compile(sgd_step, donate_argnums=0).graph(w, x, y)
    layout = StateLayout.of(graph)
    # inputs (w, x, y), outputs (loss, new_w): w is state, new_w updates it, loss comes back
    assert layout == StateLayout((0,), (1, 2), ((1, 0),), (0,))


@pytest.mark.parametrize(("backend", "binds"), [("numpy", False), ("c", True)])
def test_backends_declare_whether_they_bind(backend: str, binds: bool) -> None:
    if backend == "c" and shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH")
    assert get_backend(backend).binds_state is binds
    w, x, y = _f(3, 2), _f(5, 3, seed=1), _f(5, 2, seed=2)
    exe = _executable(backend, w, x, y)
    bound = exe.bind([w])
    assert (bound is not None) is binds
    # every executable has the validated fast path sg.compile uses
    loss, new_w = exe.run_validated([w, x, y])
    want_loss, want_w = ref_step(w, x, y)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(new_w, want_w, rtol=1e-5, atol=1e-6)


def test_ane_backend_does_not_bind() -> None:
    pytest.importorskip("coremltools", reason="the ane backend needs coremltools")
    assert get_backend("ane").binds_state is False


@needs_cc
def test_bound_step_updates_state_and_returns_the_free_outputs() -> None:
    w, xs, ys = _f(3, 2), _f(4, 5, 3, seed=1), _f(4, 5, 2, seed=2)
    exe, bound = _bound(w, xs[0], ys[0])
    assert bound.layout == StateLayout.of(exe.graph)
    want_w = w
    for t in range(4):
        (loss,) = bound.step(xs[t], ys[t])
        want_loss, want_w = ref_step(want_w, xs[t], ys[t])
        np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
        np.testing.assert_allclose(bound.state[0], want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(w, _f(3, 2))  # the caller's initial state is untouched


@needs_cc
def test_k_steps_equal_k_single_steps() -> None:
    k = 9
    w, xs, ys = _f(3, 2), _f(k, 5, 3, seed=1), _f(k, 5, 2, seed=2)
    _, single = _bound(w, xs[0], ys[0])
    losses = [float(single.step(xs[t], ys[t])[0]) for t in range(k)]
    w_single = single.read_state()[0]
    _, multi = _bound(w, xs[0], ys[0])
    (stacked,) = multi.run_steps(xs, ys)
    assert stacked.shape == (k,)
    np.testing.assert_array_equal(stacked, np.array(losses, np.float32))
    np.testing.assert_array_equal(multi.state[0], w_single)
    want_w = w
    for t in range(k):
        _, want_w = ref_step(want_w, xs[t], ys[t])
    np.testing.assert_allclose(w_single, want_w, rtol=1e-5, atol=1e-6)


@needs_cc
def test_outputs_are_borrowed_until_the_next_call() -> None:
    w, xs, ys = _f(3, 2), _f(3, 5, 3, seed=1), _f(3, 5, 2, seed=2)
    _, bound = _bound(w, xs[0], ys[0])
    (first,) = bound.step(xs[0], ys[0])
    kept = first.copy()
    (second,) = bound.step(xs[1], ys[1])
    # The same array, overwritten by the second call: copy what you keep.
    assert second is first
    _, w1 = ref_step(w, xs[0], ys[0])
    want_second, _ = ref_step(w1, xs[1], ys[1])
    np.testing.assert_allclose(float(first), want_second, rtol=1e-5)
    assert float(kept) != float(first)
    stacked = bound.run_steps(xs[:2], ys[:2])[0]
    again = bound.run_steps(xs[:2], ys[:2])[0]
    assert again is stacked  # K-step outputs are reused too


@needs_cc
def test_state_reads_are_copies_and_writes_are_validated() -> None:
    w, x, y = _f(3, 2), _f(5, 3, seed=1), _f(5, 2, seed=2)
    _, bound = _bound(w, x, y)
    copy = bound.read_state()[0]
    copy[:] = 100.0  # a copy: the live state does not change
    np.testing.assert_array_equal(bound.state[0], w)
    other = _f(3, 2, seed=7)
    bound.write_state([other])
    (loss,) = bound.step(x, y)
    want_loss, want_w = ref_step(other, x, y)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    np.testing.assert_allclose(bound.read_state()[0], want_w, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="expected 1 state arrays, got 2"):
        bound.write_state([other, other])
    with pytest.raises(sg.ShapeError, match=r"\[2, 3\].*\[3, 2\]"):
        bound.write_state([other.T.copy()])
    with pytest.raises(sg.DTypeError, match="complex"):
        bound.write_state([other.astype(np.complex64)])
    np.testing.assert_allclose(bound.state[0], want_w, rtol=1e-5, atol=1e-6)  # nothing written


@needs_cc
@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (_f(4, 3), sg.ShapeError, r"input 'x'.*\[4, 3\].*\[5, 3\]"),
        (_f(5, 3).astype(np.float64), sg.DTypeError, "input 'x' has dtype float64"),
        (_f(3, 5).T, ValueError, "input 'x' must be C-contiguous"),
        ([[0.0] * 3] * 5, TypeError, "input 'x' must be a NumPy array"),
    ],
    ids=["shape", "dtype", "layout", "list"],
)
def test_step_validates_the_batch_before_native_code(bad: Any, error: type, match: str) -> None:
    w, x, y = _f(3, 2), _f(5, 3, seed=1), _f(5, 2, seed=2)
    _, bound = _bound(w, x, y)
    with pytest.raises(error, match=match):
        bound.step(bad, y)
    np.testing.assert_array_equal(bound.state[0], w)  # nothing ran
    with pytest.raises(error, match=match.split(".*")[0]):  # K-step inputs: the same checks
        bound.run_steps(bad[None] if isinstance(bad, np.ndarray) else bad, y[None])


@needs_cc
def test_calling_the_executable_between_steps_keeps_the_binding_working() -> None:
    w, xs, ys = _f(3, 2), _f(3, 5, 3, seed=1), _f(3, 5, 2, seed=2)
    exe, bound = _bound(w, xs[0], ys[0])
    bound.step(xs[0], ys[0])
    state = bound.read_state()[0]
    # A plain call copies its own state in: the binding's state is the shared buffer.
    plain_loss, plain_w = exe([w, xs[1], ys[1]])
    want_loss, want_w = ref_step(w, xs[1], ys[1])
    np.testing.assert_allclose(float(plain_loss), want_loss, rtol=1e-5)
    np.testing.assert_allclose(plain_w, want_w, rtol=1e-5, atol=1e-6)
    bound.write_state([state])
    (loss,) = bound.step(xs[2], ys[2])
    np.testing.assert_allclose(float(loss), ref_step(state, xs[2], ys[2])[0], rtol=1e-5)
