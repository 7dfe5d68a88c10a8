"""ANE training design, checked on Linux with the MIL evaluator standing in for Core ML.

The step program (forward + backward, parameters as inputs, loss scale as an
input) is lowered once; these tests run it through tests/mil_evaluator.py in
fp16 and compare training against eager fp32 training with the same
optimizer, and plant overflows to exercise loss scaling and skipped steps.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from ane_support import evaluator_runner, require_coremltools, run_lowered
from mil_evaluator import run_mil
from shapegrad import tree
from shapegrad.backends.ane import (
    AneExecutionUnavailable,
    IoSignature,
    build_package,
    lower_to_mil,
)
from shapegrad.shapes import ShapeError
from shapegrad.train.ane import AneTrainer, LossScaler, fp32_update_nodes, loss_scale_headroom
from shapegrad.train.optim import SGD, Adam

require_coremltools()


def moons(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved half circles (float32 points, int32 labels)."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    upper = np.arange(n) < n // 2
    x = np.where(
        upper[:, None],
        np.stack([np.cos(t), np.sin(t)], 1),
        np.stack([1 - np.cos(t), 0.5 - np.sin(t)], 1),
    )
    x += rng.normal(0, 0.05, x.shape)
    return x.astype(np.float32), (~upper).astype(np.int32)


def mlp_params(sizes: list[int], seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    params: list[np.ndarray] = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        params.append((rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, np.float32))
    return params


def mlp_loss(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = x
    for k in range(0, len(params) - 2, 2):
        h = sg.tanh(h @ params[k].T + params[k + 1])
    return sg.cross_entropy(h @ params[-2].T + params[-1], y)


def eager_training(
    params: list[np.ndarray], batch: tuple[np.ndarray, ...], optimizer: Any, steps: int
) -> tuple[list[float], list[np.ndarray]]:
    """The same training in eager fp32: the independent reference."""
    ps = [sg.tensor(p) for p in params]
    state = optimizer.init(ps)
    losses = []
    for _ in range(steps):
        loss, grads = sg.value_and_grad(mlp_loss)(ps, *(sg.tensor(b) for b in batch))
        losses.append(loss.item())
        ps, state = optimizer.update(ps, grads, state)
    return losses, [p.numpy() for p in ps]


def ane_trainer(params: list[np.ndarray], batch: Any, optimizer: Any, **kw: Any) -> AneTrainer:
    return AneTrainer(
        mlp_loss, params, batch, optimizer, runner=evaluator_runner, save_package=False, **kw
    )


@pytest.mark.parametrize("device_optimizer", [False, True], ids=["host_opt", "device_opt"])
@pytest.mark.parametrize(
    "optimizer", [SGD(lr=0.3, momentum=0.9), Adam(lr=0.05)], ids=["sgd", "adam"]
)
def test_fp16_training_follows_eager_fp32(optimizer: Any, device_optimizer: bool) -> None:
    batch = moons(64)
    params = mlp_params([2, 16, 2])
    want_losses, want_params = eager_training(params, batch, optimizer, 25)
    trainer = ane_trainer(params, batch, optimizer, device_optimizer=device_optimizer)
    losses = [trainer.step(*batch) for _ in range(25)]
    assert trainer.scaler.skipped == 0
    np.testing.assert_allclose(losses, want_losses, rtol=2e-2, atol=5e-3)
    assert losses[-1] < 0.6 * losses[0]  # it actually trains
    for got, want in zip(trainer.get_params(), want_params, strict=True):
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=5e-2, atol=2e-2)


def test_device_optimizer_updates_master_weights_in_fp32() -> None:
    batch = moons(32)
    trainer = ane_trainer(mlp_params([2, 8, 2]), batch, SGD(lr=1e-3), device_optimizer=True)
    text = trainer.mil_text
    # The new parameters come straight from an fp32 subtraction of the fp32 inputs.
    assert "sub(x=%params_0" in text
    update_lines = [line for line in text.splitlines() if "sub(x=%params_" in line]
    assert update_lines and all("fp32" in line for line in update_lines)
    # A tiny update (lr * g below the fp16 spacing of the weights) must not be rounded away:
    # the applied difference equals -lr * g (g from eager fp32) to fp16-gradient accuracy.
    before = trainer.get_params()
    trainer.step(*batch)
    _, grads = sg.value_and_grad(mlp_loss)(
        [sg.tensor(p) for p in before], *(sg.tensor(b) for b in batch)
    )
    for new, old, g in zip(trainer.get_params(), before, grads, strict=True):
        want = -1e-3 * g.numpy()
        np.testing.assert_allclose(new - old, want, rtol=3e-2, atol=3e-2 * np.abs(want).max())


def test_planted_overflow_skips_steps_and_halves_scale() -> None:
    batch = moons(32)
    params = mlp_params([2, 8, 2])

    def huge_loss(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        return mlp_loss(params, x, y) * 512.0  # scaled by 2**15, gradients exceed fp16

    trainer = AneTrainer(
        huge_loss, params, batch, SGD(lr=1e-4), runner=evaluator_runner, save_package=False
    )
    scales, skipped = [], []
    for _ in range(12):
        before = trainer.get_params()
        scale = trainer.scaler.scale
        trainer.step(*batch)
        scales.append(scale)
        skipped.append(trainer.last_skipped)
        if trainer.last_skipped:
            for a, b in zip(trainer.get_params(), before, strict=True):
                np.testing.assert_array_equal(a, b)  # untouched
            assert trainer.scaler.scale == scale / 2
    assert skipped[0] and not skipped[-1], skipped
    first_ok = skipped.index(False)
    assert all(skipped[:first_ok]) and trainer.scaler.skipped == first_ok
    # The gradient of the huge loss does not fit fp16 even unscaled beyond the accepted scale.
    _, grads = sg.value_and_grad(huge_loss)(
        [sg.tensor(p) for p in params], *(sg.tensor(b) for b in batch)
    )
    max_grad = max(float(np.abs(g.numpy()).max()) for g in grads)
    assert scales[first_ok] <= 2 * loss_scale_headroom(max_grad)
    assert scales[0] > loss_scale_headroom(max_grad)


def test_planted_nan_batch_is_skipped_then_training_resumes() -> None:
    x, y = moons(32)
    trainer = ane_trainer(mlp_params([2, 8, 2]), (x, y), Adam(lr=0.01))
    before, scale = trainer.get_params(), trainer.scaler.scale
    bad = x.copy()
    bad[3, 1] = np.inf
    trainer.step(bad, y)
    assert trainer.last_skipped and trainer.scaler.scale == scale / 2
    for a, b in zip(trainer.get_params(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(trainer.opt_state["step"].item()) == 0  # Adam's step counter did not advance
    trainer.step(x, y)
    assert not trainer.last_skipped and int(trainer.opt_state["step"].item()) == 1


def test_scale_grows_after_a_run_of_finite_steps() -> None:
    batch = moons(16)
    scaler = LossScaler(scale=2.0**10, growth_interval=3)
    trainer = ane_trainer(mlp_params([2, 4, 2]), batch, SGD(lr=0.1), scaler=scaler)
    seen = []
    for _ in range(7):
        trainer.step(*batch)
        seen.append(trainer.scaler.scale)
    assert seen == [2.0**10, 2.0**10, 2.0**11, 2.0**11, 2.0**11, 2.0**12, 2.0**12]


def test_loss_scaler_bounds() -> None:
    scaler = LossScaler(scale=2.0, min_scale=1.0, max_scale=4.0, growth_interval=1)
    for _ in range(3):
        scaler.update(False)
    assert scaler.scale == 1.0 and scaler.skipped == 3
    for _ in range(5):
        scaler.update(True)
    assert scaler.scale == 4.0 and scaler.skipped == 3


def test_cross_entropy_logit_gradient_is_fp16_safe() -> None:
    """At large logits and scale 2**15 the logit gradient is (softmax - onehot) * scale / N."""
    rng = np.random.default_rng(3)
    z = rng.uniform(-300, 300, (8, 5)).astype(np.float32)  # exp(300) overflows even fp32
    y = rng.integers(0, 5, 8).astype(np.int32)
    scale = np.float32(2.0**15)

    def scaled_ce(z: sg.Tensor, y: sg.Tensor, s: sg.Tensor) -> Any:
        return sg.grad(lambda z: sg.cross_entropy(z, y) * s)(z)

    from ane_support import traced_graph

    mil = lower_to_mil(traced_graph(scaled_ce, [z, y, np.array(scale)]))
    (got,) = run_lowered(mil, [z, y, np.array(scale)])
    shifted = np.exp(z.astype(np.float64) - z.max(axis=1, keepdims=True))
    softmax = shifted / shifted.sum(axis=1, keepdims=True)
    want = (softmax - np.eye(5)[y]) * float(scale) / len(y)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * float(scale) / len(y))


def test_step_rejects_a_batch_of_another_shape() -> None:
    x, y = moons(16)
    trainer = ane_trainer(mlp_params([2, 4, 2]), (x, y), SGD(lr=0.1))
    with pytest.raises(ShapeError, match=r"\[8, 2\].*\[16, 2\]"):
        trainer.step(x[:8], y[:8])


def test_moons_training_step_converts_and_saves(tmp_path: Path) -> None:
    batch = moons(64)
    trainer = AneTrainer(
        mlp_loss, mlp_params([2, 16, 2]), batch, Adam(lr=0.01), cache_dir=str(tmp_path)
    )
    assert trainer.executable is not None and trainer.executable.package.exists()
    stats = trainer.executable.stats
    assert stats["mil_ops"] == trainer.mil_ops and stats["convert_seconds"] > 0
    if os.uname().sysname != "Darwin":
        with pytest.raises(AneExecutionUnavailable, match="macOS"):
            trainer.step(*batch)


@pytest.mark.parametrize("device_optimizer", [False, True], ids=["host_opt", "device_opt"])
def test_step_program_after_coremltools_passes_computes_the_same(
    tmp_path: Path, device_optimizer: bool
) -> None:
    """ct.convert rewrites the program in place (fusions, dead casts): what a Mac runs.

    Evaluating the rewritten program checks those rewrites keep our semantics
    and that every output keeps its name.
    """
    batch = moons(32)
    params = mlp_params([2, 8, 2])
    trainer = ane_trainer(params, batch, Adam(lr=1e-2), device_optimizer=device_optimizer)
    fp32 = fp32_update_nodes(trainer.graph, 1 + len(params)) if device_optimizer else frozenset()
    mil = lower_to_mil(trainer.graph, "fp16", fp32)
    state = [np.asarray(t.numpy()) for t in tree.flatten(trainer.opt_state)[0]]
    extra = [np.array(1e-2, np.float32)] if device_optimizer else []
    feeds_list = [
        *params,
        *(state if device_optimizer else []),
        *batch,
        np.float32(2.0**10),
        *extra,
    ]
    signature = IoSignature.of(mil)
    feeds = signature.feeds([np.asarray(a) for a in feeds_list])
    lowered = run_mil(mil.program, feeds)
    ops_before = mil.op_count()
    build_package(mil, "step", tmp_path)
    rewritten = run_mil(mil.program, feeds)
    assert mil.op_count() < ops_before  # the passes did rewrite it (fusions, fewer casts)
    assert set(rewritten) == set(lowered) == set(signature.output_names)
    for name, value in lowered.items():
        scale = max(1.0, float(np.abs(value).max()))
        np.testing.assert_allclose(rewritten[name], value, rtol=1e-2, atol=1e-2 * scale)


@pytest.mark.slow
@pytest.mark.parametrize("device_optimizer", [False, True], ids=["host_opt", "device_opt"])
def test_mlp_training_step_converts_and_saves(tmp_path: Path, device_optimizer: bool) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 784)).astype(np.float32)
    y = rng.integers(0, 10, 128).astype(np.int32)
    trainer = AneTrainer(
        mlp_loss,
        mlp_params([784, 512, 512, 10]),
        (x, y),
        Adam(lr=1e-3),
        device_optimizer=device_optimizer,
        cache_dir=str(tmp_path),
    )
    assert trainer.executable is not None and trainer.executable.package.exists()
