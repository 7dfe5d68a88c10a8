"""float16 training: float32 masters, dynamic loss scale, non-finite steps skipped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.train import ScalarTrainer, losses, optim
from test_optim import BACKENDS
from test_trainer import MLP, hinge_loss, mlp_params, mlp_scores, moons

MODES = [{"mode": "eager"}, *({"mode": "compiled", "backend": b} for b in BACKENDS)]
IDS = ["eager", *(f"compiled-{b}" for b in BACKENDS)]


def _flat(trainer: ScalarTrainer) -> list[np.ndarray]:
    state = trainer.optimizer_state()
    leaves = [t.numpy().copy() for t in trainer.get_params()]
    for slot in ("m", "v"):
        leaves += [t.numpy().copy() for t in state[slot]]
    return [*leaves, np.asarray(state["step"]).copy()]


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_float16_training_on_moons_converges(kw: dict[str, Any]) -> None:
    x, y = moons(256, seed=1)
    trainer = ScalarTrainer(
        hinge_loss, mlp_params(), dtype="float16", optimizer=optim.Adam(0.02), **kw
    )
    curve = [trainer.step(x, y) for _ in range(150)]
    assert all(t.dtype == sg.float32 for t in trainer.get_params())
    assert trainer.dtype == sg.float16
    assert np.mean(curve[-10:]) < 0.15 < np.mean(curve[:10])
    scores = mlp_scores(trainer.get_params(), sg.tensor(x))
    assert float(losses.accuracy(scores, sg.tensor(y))) >= 0.95
    assert trainer.skipped_steps == 0


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_planted_overflow_is_skipped_not_applied(kw: dict[str, Any]) -> None:
    x, y = moons(64)
    trainer = ScalarTrainer(
        hinge_loss, mlp_params(), dtype="float16", optimizer=optim.Adam(0.01), **kw
    )
    for _ in range(3):
        trainer.step(x, y)
    before, scale = _flat(trainer), trainer.loss_scale
    # 1e5 * x overflows float16 (max 65504) in the first layer: the loss and gradients are Inf.
    with np.errstate(over="ignore"):  # the cast of the input to float16 overflows on purpose
        loss = trainer.step(x * 1e5, y)
    assert not np.isfinite(loss)
    after = _flat(trainer)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)
    assert trainer.skipped_steps == 1
    assert trainer.loss_scale == scale / 2
    trainer.step(x, y)  # a normal step afterwards is applied again
    assert int(trainer.optimizer_state()["step"]) == 4
    assert not np.array_equal(trainer.get_params()[0].numpy(), after[0])


@pytest.mark.parametrize("kw", MODES, ids=IDS)
def test_too_large_scale_backs_off_until_gradients_fit(kw: dict[str, Any]) -> None:
    # A scale of 2**24 overflows the float16 cotangent itself (65504 is the largest half);
    # each overflow halves it, so exactly 24 - 15 = 9 steps are skipped before 2**15 works.
    x, y = moons(64)
    trainer = ScalarTrainer(hinge_loss, mlp_params(), dtype="float16", loss_scale=2.0**24, **kw)
    start = trainer.get_params()[0].numpy().copy()
    for k in range(9):
        trainer.step(x, y)
        assert trainer.skipped_steps == k + 1
        np.testing.assert_array_equal(trainer.get_params()[0].numpy(), start)
    assert trainer.loss_scale == 2.0**15
    trainer.step(x, y)
    assert trainer.skipped_steps == 9 and trainer.loss_scale == 2.0**15
    assert not np.array_equal(trainer.get_params()[0].numpy(), start)


def test_scale_grows_after_a_window_of_finite_steps() -> None:
    x, y = moons(64)
    trainer = ScalarTrainer(
        hinge_loss, mlp_params(), dtype="float16", loss_scale=4.0, loss_scale_window=3
    )
    scales = []
    for _ in range(7):
        trainer.step(x, y)
        scales.append(trainer.loss_scale)
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_float16_gradients_match_float32() -> None:
    x, y = moons(64)
    params = mlp_params(seed=4)
    g16 = ScalarTrainer(hinge_loss, params, dtype="float16").backward(x, y)
    g32 = ScalarTrainer(hinge_loss, params).backward(x, y)
    for a, b in zip(g16, g32, strict=True):
        assert a.dtype == sg.float32
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-2, atol=2e-3)


def test_dtype_mismatch_is_explained() -> None:
    with pytest.raises(TypeError, match="float16"):
        ScalarTrainer(
            hinge_loss, MLP.init(sg.nn.init.kaiming, dtype="float64", h=4), dtype="float32"
        )
