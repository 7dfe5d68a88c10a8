"""Training parity: eager vs compiled C, 100 SGD steps of a moons MLP and of a small CNN.

The compiled step updates parameters in place in executable-owned buffers
(``Graph.aliases``), so these tests also check memory planning (in-place
updates, arena reuse) end to end. The K-step native loop must equal K calls.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.functional as F
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import C_TARGET, Target

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
LR = 0.1


def _mlp_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(x @ w1 + b1)
    h = sg.relu(h @ w2 + b2)
    return F.hinge((h @ w3 + b3).reshape((-1,)), y)


def _conv3x3(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
    _, c, h, wd = x.shape
    o = w.shape[0]
    xp = F.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = F.stack([xp[:, :, i : i + h, j : j + wd] for i in range(3) for j in range(3)], 2)
    return F.einsum("bckhw,ock->bohw", cols, w.reshape((o, c, 9))) + b.reshape((1, o, 1, 1))


def _cnn_loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(_conv3x3(x, w1, b1))
    h = sg.relu(_conv3x3(h, w2, b2))
    return F.cross_entropy(h.mean(axis=(2, 3)) @ w3 + b3, y)


def _step(loss):  # type: ignore[no-untyped-def]
    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor):  # type: ignore[no-untyped-def]
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads, strict=True)], value

    return step


def _params(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(s) * (0.5 if len(s) > 1 else 0.1)).astype(np.float32) for s in shapes
    ]


def _moons(steps: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    t = rng.uniform(0, np.pi, (steps, batch))
    upper = rng.random((steps, batch)) < 0.5
    x = np.stack(
        [np.where(upper, np.cos(t), 1 - np.cos(t)), np.where(upper, np.sin(t), 0.5 - np.sin(t))], -1
    )
    x = (x + rng.normal(0, 0.1, x.shape)).astype(np.float32)
    return x, np.where(upper, 1.0, -1.0).astype(np.float32)


def _eager_losses(loss, params, xs, ys):  # type: ignore[no-untyped-def]
    step = _step(loss)
    ps = [sg.tensor(p) for p in params]
    losses = []
    for x, y in zip(xs, ys, strict=True):
        ps, value = step(ps, sg.tensor(x), sg.tensor(y))
        losses.append(float(value.numpy()))
    return np.array(losses, np.float32), [p.numpy() for p in ps]


def _compiled(loss, params, x, y, target: Target = C_TARGET):  # type: ignore[no-untyped-def]
    fn = sg.compile(_step(loss), backend="c", donate_argnums=0, target=target)
    return fn.lower(params, x, y).executable


# The C target as measured, one with the CPU-specific stages off (a GPU-like schedule:
# no row form, no batch fusion, checks where they are used), and one that batch-fuses
# even this small CNN's patches.
TARGETS = {
    "c": C_TARGET,
    "plain": C_TARGET.replace(
        batch_fusion=False, row_form=False, skip_stages=frozenset({"hoist_bounds_checks"})
    ),
    "fuse-small": C_TARGET.replace(batch_fusion_min_operand=1, contract_min_macs=0),
}


def test_moons_mlp_100_steps_match_eager() -> None:
    params = _params([(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)], seed=0)
    xs, ys = _moons(100, 16)
    expected, final = _eager_losses(_mlp_loss, params, xs, ys)
    bound = _compiled(_mlp_loss, params, xs[0], ys[0]).bind(params)
    got = np.array([float(bound(x, y)[0]) for x, y in zip(xs, ys, strict=True)], np.float32)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-5)
    for a, b in zip(bound.state, final, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert expected[-10:].mean() < expected[:10].mean()  # it actually trained


def test_moons_k_step_call_equals_k_single_calls() -> None:
    params = _params([(2, 16), (16,), (16, 16), (16,), (16, 1), (1,)], seed=3)
    xs, ys = _moons(25, 10)
    exe = _compiled(_mlp_loss, params, xs[0], ys[0])
    single = exe.bind(params)
    one_by_one = np.array([single(x, y)[0].copy() for x, y in zip(xs, ys, strict=True)])
    multi = exe.bind(params)
    (stacked,) = multi.run_steps(xs, ys)
    np.testing.assert_array_equal(stacked.reshape(-1), one_by_one.reshape(-1))
    for a, b in zip(multi.state, single.state, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("target", list(TARGETS))
def test_small_cnn_100_steps_match_eager(target: str) -> None:
    params = _params([(4, 1, 3, 3), (4,), (6, 4, 3, 3), (6,), (6, 3), (3,)], seed=2)
    rng = np.random.default_rng(5)
    xs = rng.random((100, 4, 1, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 3, (100, 4)).astype(np.int32)
    expected, final = _eager_losses(_cnn_loss, params, xs, ys)
    exe = _compiled(_cnn_loss, params, xs[0], ys[0], TARGETS[target])
    fused = any(isinstance(s, L.BatchFused) for k in exe.program.kernels for s in L.walk(k.body))
    assert fused == (target == "fuse-small")
    rows = any(
        isinstance(s, L.Store) and s.commutative and s.accumulate and s.buffer.startswith("row")
        for k in exe.program.kernels
        for s in L.walk(k.body)
    )
    assert not rows or target != "plain"
    bound = exe.bind(params)
    (got,) = bound.run_steps(xs, ys)
    np.testing.assert_allclose(got.reshape(-1), expected, rtol=1e-3, atol=1e-5)
    for a, b in zip(bound.state, final, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_cnn_with_blas_contractions_matches_eager() -> None:
    params = _params([(4, 1, 3, 3), (4,), (6, 4, 3, 3), (6,), (6, 3), (3,)], seed=4)
    rng = np.random.default_rng(6)
    xs = rng.random((10, 4, 1, 8, 8), dtype=np.float32)
    ys = rng.integers(0, 3, (10, 4)).astype(np.int32)
    expected, _ = _eager_losses(_cnn_loss, params, xs, ys)
    fn = sg.compile(_step(_cnn_loss), backend="c", donate_argnums=0, contract_min=0)
    exe = fn.lower(params, xs[0], ys[0]).executable
    assert any(k.body and type(k.body[0]).__name__ == "Contract" for k in exe.program.kernels)
    (got,) = exe.bind(params).run_steps(xs, ys)
    np.testing.assert_allclose(got.reshape(-1), expected, rtol=1e-3, atol=1e-5)
