"""The CUDA backend on a GPU: training parity with eager, K-step runs, device-side index
errors. Skipped (with the reason) where pycuda, a driver or a GPU is missing; the op table
runs in ``cuda`` mode through tests/test_ops.py (``modes.MODES["cuda"]``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _cuda_unavailable

REASON = _cuda_unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
LR = 0.05


def _step(loss: Any) -> Any:
    def step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> Any:
        value, grads = sg.value_and_grad(loss)(params, x, y)
        return [p - LR * g for p, g in zip(params, grads, strict=True)], value

    return step


def _mlp(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = x
    for i in range(0, len(params) - 2, 2):
        h = sg.relu(h @ params[i] + params[i + 1])
    return sg.cross_entropy(h @ params[-2] + params[-1], y)


def _cnn(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(sg.conv2d(x, w1, padding=1) + b1.reshape((1, -1, 1, 1)))
    h = sg.relu(sg.conv2d(h, w2, padding=1) + b2.reshape((1, -1, 1, 1)))
    return sg.cross_entropy(h.mean(axis=(2, 3)) @ w3 + b3, y)


def _params(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal(s) * (0.1 if len(s) > 1 else 0.01)).astype(np.float32) for s in shapes
    ]


def _parity(loss: Any, shapes: list[tuple[int, ...]], xs: np.ndarray, ys: np.ndarray) -> None:
    params = _params(shapes, 0)
    step = _step(loss)
    ps = [sg.tensor(p) for p in params]
    expected = []
    for x, y in zip(xs, ys, strict=True):
        ps, value = step(ps, sg.tensor(x), sg.tensor(y))
        expected.append(float(value.numpy()))
    exe = sg.compile(step, backend="cuda", donate_argnums=0).lower(params, xs[0], ys[0]).executable
    bound = exe.bind(params)
    got = [float(bound.step(x, y)[0]) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-5)
    for a, b in zip(bound.read_state(), ps, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=2e-3, atol=2e-4)


def test_moons_mlp_100_steps_match_eager() -> None:
    rng = np.random.default_rng(1)
    xs = rng.standard_normal((100, 16, 2)).astype(np.float32)
    ys = (xs[..., 0] * xs[..., 1] > 0).astype(np.int32)
    _parity(_mlp, [(2, 16), (16,), (16, 16), (16,), (16, 2), (2,)], xs, ys)


def test_mlp_784_512_512_10_100_steps_match_eager() -> None:
    rng = np.random.default_rng(2)
    xs = rng.random((100, 128, 784), dtype=np.float32)
    ys = rng.integers(0, 10, (100, 128)).astype(np.int32)
    _parity(_mlp, [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)], xs, ys)


def test_cnn_100_steps_match_eager() -> None:
    rng = np.random.default_rng(3)
    xs = rng.random((100, 8, 1, 12, 12), dtype=np.float32)
    ys = rng.integers(0, 10, (100, 8)).astype(np.int32)
    _parity(_cnn, [(8, 1, 3, 3), (8,), (16, 8, 3, 3), (16,), (16, 10), (10,)], xs, ys)


def test_step_many_equals_k_single_steps() -> None:
    shapes = [(2, 16), (16,), (16, 2), (2,)]
    params = _params(shapes, 4)
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((25, 10, 2)).astype(np.float32)
    ys = rng.integers(0, 2, (25, 10)).astype(np.int32)
    exe = (
        sg.compile(_step(_mlp), backend="cuda", donate_argnums=0)
        .lower(params, xs[0], ys[0])
        .executable
    )
    single = exe.bind(params)
    one_by_one = np.array([single.step(x, y)[0].copy() for x, y in zip(xs, ys, strict=True)])
    multi = exe.bind(params)
    (stacked,) = multi.run_steps(xs, ys)
    np.testing.assert_array_equal(stacked.reshape(-1), one_by_one.reshape(-1))
    for a, b in zip(multi.read_state(), single.read_state(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_out_of_range_gather_raises_index_error() -> None:
    table = np.random.default_rng(6).standard_normal((5, 3)).astype(np.float32)
    fn = sg.compile(lambda t, i: sg.take(t, i, axis=0).sum(), backend="cuda")
    assert float(
        fn(sg.tensor(table), sg.tensor(np.array([4, -5], np.int32))).numpy()
    ) == pytest.approx(table[4].sum() + table[0].sum(), rel=1e-5)
    with pytest.raises(IndexError, match=r"gather index out of range \[-5, 5\)"):
        fn(sg.tensor(table), sg.tensor(np.array([1, 5], np.int32)))


def test_trainer_on_cuda_trains_moons() -> None:
    from shapegrad.models import MoonsMLP

    x, labels = sg.data.make_moons(256, noise=0.1, seed=0)
    y = (2 * labels - 1).astype(np.float32)
    params = MoonsMLP.init(sg.nn.init.kaiming, seed=0, h=16)

    def loss(p: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return sg.hinge(sg.nn.mlp(p, x).reshape((x.shape[0],)), y)

    trainer = sg.ScalarTrainer(
        loss, params, mode="compiled", backend="cuda", optimizer=sg.optim.Adam(lr=0.02)
    )
    first = trainer.step(x, y)
    for _ in range(200):
        last = trainer.step(x, y)
    assert last < 0.5 * first
