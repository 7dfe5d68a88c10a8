"""ScalarTrainer(mode="compiled", backend="ane"): the ANE training design behind the trainer API.

On Linux Core ML cannot execute programs, so these tests inject the MIL NumPy
evaluator (tests/mil_evaluator.py) through ``ane_runner=``: the very program the
trainer lowered runs in fp16, and training is compared with eager fp32 training.
"""

from __future__ import annotations

import platform
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from ane_support import evaluator_runner, require_coremltools
from shapegrad.backends.ane import AneExecutionUnavailable
from shapegrad.train.optim import SGD, Adam
from test_ane_training import eager_training, mlp_loss, mlp_params, moons

require_coremltools()


def make(params: list[np.ndarray], optimizer: Any, **kw: Any) -> sg.ScalarTrainer:
    return sg.ScalarTrainer(
        mlp_loss, [sg.tensor(p) for p in params], mode="compiled", backend="ane",
        optimizer=optimizer, ane_runner=evaluator_runner, **kw,
    )  # fmt: skip


@pytest.mark.parametrize("device_optimizer", [False, True], ids=["host_opt", "device_opt"])
def test_moons_training_matches_eager_fp32(device_optimizer: bool) -> None:
    batch = moons(64)
    params = mlp_params([2, 16, 2])
    optimizer = Adam(lr=0.05)
    want_losses, want_params = eager_training(params, batch, optimizer, 20)
    trainer = make(params, optimizer, device_optimizer=device_optimizer)
    first = trainer.forward(*batch)
    np.testing.assert_allclose(first, want_losses[0], rtol=2e-2)
    losses = [trainer.step(*batch) for _ in range(20)]
    assert trainer.skipped_steps == 0 and trainer.loss_scale == 2.0**15
    np.testing.assert_allclose(losses, want_losses, rtol=2e-2, atol=5e-3)
    assert losses[-1] < 0.6 * losses[0]
    for got, want in zip(trainer.get_params(), want_params, strict=True):
        assert got.dtype == sg.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=5e-2, atol=2e-2)
    assert trainer.global_step == 20


def test_fit_and_set_params() -> None:
    x, y = moons(64)
    params = mlp_params([2, 8, 2])
    trainer = make(params, SGD(lr=0.3, momentum=0.9))
    history = trainer.fit([(x[:32], y[:32]), (x[32:], y[32:])], epochs=6, progress=False)
    assert len(history.loss) == 12 and history.lr == [0.3] * 12
    assert history.epoch_loss[-1] < 0.8 * history.epoch_loss[0]
    # set_params really replaces the weights the program is fed.
    trainer.set_params([sg.tensor(p) for p in params])
    expected = mlp_loss([sg.tensor(p) for p in params], sg.tensor(x[:32]), sg.tensor(y[:32]))
    np.testing.assert_allclose(trainer.forward(x[:32], y[:32]), expected.item(), rtol=2e-2)


def test_planted_overflow_is_skipped() -> None:
    x, y = moons(32)
    trainer = make(mlp_params([2, 8, 2]), Adam(lr=0.01))
    before = [p.numpy().copy() for p in trainer.get_params()]
    bad = x.copy()
    bad[0, 0] = np.inf
    trainer.step(bad, y)
    assert trainer.skipped_steps == 1 and trainer.loss_scale == 2.0**14
    for got, want in zip(trainer.get_params(), before, strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    trainer.step(x, y)
    assert trainer.skipped_steps == 1
    assert any(
        not np.array_equal(g.numpy(), w) for g, w in zip(trainer.get_params(), before, strict=True)
    )


@pytest.mark.skipif(platform.system() == "Darwin", reason="checks the non-macOS error")
def test_linux_builds_and_saves_then_step_raises(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SHAPEGRAD_CACHE_DIR", str(tmp_path))
    batch = moons(16)
    trainer = sg.ScalarTrainer(
        mlp_loss, [sg.tensor(p) for p in mlp_params([2, 4, 2])], mode="compiled",
        backend="ane", optimizer=SGD(lr=0.1), example_inputs=batch,
    )  # fmt: skip
    engine = trainer.strategy.engine  # type: ignore[attr-defined]
    assert engine is not None and engine.executable is not None
    assert engine.executable.package.exists()
    with pytest.raises(AneExecutionUnavailable, match="needs macOS"):
        trainer.step(*batch)
    with pytest.raises(AneExecutionUnavailable):
        trainer.forward(*batch)


def test_unsupported_settings_are_rejected() -> None:
    params = [sg.tensor(p) for p in mlp_params([2, 4, 2])]
    with pytest.raises(NotImplementedError, match="clip_norm"):
        sg.ScalarTrainer(mlp_loss, params, mode="compiled", backend="ane", clip_norm=1.0)


def test_checkpoint_resume_and_step_many(tmp_path: Any) -> None:
    """The ANE strategy's state (host weights, optimizer, loss scale) round-trips through a
    checkpoint: save at 3 steps + 3 more == load + 3 more, bit for bit."""
    x, y = moons(32)
    params = mlp_params([2, 8, 2])
    first = make(params, Adam(lr=0.01))
    for _ in range(3):
        first.step(x, y)
    path = first.save_checkpoint(tmp_path / "ane.npz")
    losses = first.step_many(np.stack([x] * 3), np.stack([y] * 3))  # K single steps
    resumed = make(params, Adam(lr=0.01))
    resumed.load_checkpoint(path)
    assert resumed.global_step == 3
    again = [resumed.step(x, y) for _ in range(3)]
    np.testing.assert_array_equal(losses, again)
    for a, b in zip(first.get_params(), resumed.get_params(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(resumed.optimizer_state()["step"]) == 6 and resumed.loss_scale == first.loss_scale
