"""ScalarTrainer's step strategies: one chosen at construction, every call delegated to it.

Updates are checked against the closed-form gradient of a quadratic (NumPy),
whatever strategy runs them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import Tensor
from shapegrad.train import ScalarTrainer, optim, schedules
from shapegrad.train.live import LiveStep
from shapegrad.train.strategies import (
    BoundStrategy,
    CompiledStrategy,
    EagerStrategy,
    StepStrategy,
    strategy_kind,
)
from test_optim import BACKENDS, MODES

HAS_C = "c" in BACKENDS
HAS_COREMLTOOLS = importlib.util.find_spec("coremltools") is not None


def quadratic(params: Any, a: Tensor, b: Tensor) -> Tensor:
    w, c = params
    return (0.5 * a * w * w + b * w).sum() + (c * c * c).sum() / 3.0


def quad_grads(ws: list[np.ndarray], a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    return [a * ws[0] + b, ws[1] ** 2]


def _data(seed: int = 0, n: int = 4) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ws = [rng.normal(size=(n, 3)), rng.uniform(0.5, 1.0, size=3)]
    a, b = rng.uniform(0.5, 2.0, size=(n, 3)), rng.normal(size=(n, 3))
    return ws, a, b


def _trainer(mode: str, ws: list[np.ndarray], **kw: Any) -> ScalarTrainer:
    settings: dict[str, Any] = (
        {"mode": "eager"} if mode == "eager" else {"mode": "compiled", "backend": mode[9:]}
    )
    return ScalarTrainer(quadratic, [sg.tensor(w) for w in ws], **settings, **kw)


# --- selection ------------------------------------------------------------------------------


SELECTION = [
    ("eager", "numpy", "eager", EagerStrategy),
    ("eager", "c", "eager", EagerStrategy),
    ("compiled", "numpy", "compiled", CompiledStrategy),
    pytest.param(
        "compiled", "c", "bound", BoundStrategy,
        marks=pytest.mark.skipif(not HAS_C, reason="the C backend (a C compiler) is not available"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(("mode", "backend", "kind", "cls"), SELECTION)
def test_each_mode_and_backend_picks_its_strategy(
    mode: str, backend: str, kind: str, cls: type[StepStrategy]
) -> None:
    assert strategy_kind(mode, backend) == kind
    ws, _, _ = _data()
    trainer = ScalarTrainer(quadratic, [sg.tensor(w) for w in ws], mode=mode, backend=backend)  # type: ignore[arg-type]
    assert type(trainer.strategy) is cls and trainer.strategy.kind == kind


@pytest.mark.skipif(not HAS_COREMLTOOLS, reason="the ane backend needs coremltools")
def test_the_ane_backend_picks_the_host_update_strategy() -> None:
    from shapegrad.train.ane import AneStrategy

    assert strategy_kind("compiled", "ane") == "ane"
    ws, _, _ = _data()
    params = [sg.tensor(w.astype(np.float32)) for w in ws]
    trainer = ScalarTrainer(quadratic, params, mode="compiled", backend="ane")
    assert type(trainer.strategy) is AneStrategy and trainer.strategy.kind == "ane"


def test_ane_only_settings_are_rejected_elsewhere() -> None:
    ws, a, b = _data()
    with pytest.raises(TypeError, match="backend='ane'"):
        _trainer("eager", ws, example_inputs=(a, b))


@pytest.mark.parametrize("mode", MODES)
def test_every_call_goes_to_the_one_strategy(mode: str, tmp_path: Path) -> None:
    """No call switches strategy: step, step_many, the side optimizers, state changes,
    schedules and checkpoints all keep (and use) the object chosen at construction."""
    ws, a, b = _data()
    trainer = _trainer(mode, ws, optimizer=optim.SGD(0.05))
    strategy = trainer.strategy
    calls: list[str] = []
    for name in ("step", "step_many", "forward", "backward"):
        method = getattr(strategy, name)

        def record(*args: Any, _name: str = name, _method: Any = method) -> Any:
            calls.append(_name)
            return _method(*args)

        setattr(strategy, name, record)
    trainer.step(a, b)
    trainer.adam_step(a, b, lr=0.01)
    trainer.adamw_step(a, b, lr=0.01)
    trainer.step_many(np.stack([a, a]), np.stack([b, b]))
    trainer.forward(a, b)
    trainer.backward(a, b)
    trainer.set_params(trainer.get_params())
    trainer.schedule = schedules.constant(0.02)
    trainer.step(a, b)
    trainer.reset_optimizer_state()
    path = trainer.save_checkpoint(tmp_path / "ckpt.npz")
    trainer.load_checkpoint(path)
    trainer.step(a, b)
    assert trainer.strategy is strategy
    # step_many: one call (bound: one native run), else exactly K calls of step
    inner = [] if strategy.kind == "bound" else ["step", "step"]
    assert calls == ["step"] * 3 + ["step_many", *inner, "forward", "backward", "step", "step"]
    assert trainer.global_step == 7 == strategy.global_step


# --- what the strategies compute ---------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tensor_list_and_array_inputs_share_one_state(mode: str) -> None:
    """Mixed input kinds (which once took different paths in the C trainer) update one state."""
    ws, a, b = _data()
    trainer = _trainer(mode, ws, optimizer=optim.SGD(0.05))
    kinds = [
        lambda x: x,
        sg.tensor,
        lambda x: x.tolist(),
        np.asfortranarray,  # not C-contiguous: converted, not rejected
    ]
    for k in range(8):
        convert = kinds[k % len(kinds)]
        trainer.step(convert(a), convert(b))
        ws = [w - 0.05 * g for w, g in zip(ws, quad_grads(ws, a, b), strict=True)]
    for got, want in zip(trainer.get_params(), ws, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert int(trainer.optimizer_state()["step"]) == 8


def batch_quadratic(params: Any, a: Tensor, b: Tensor) -> Tensor:
    w, c = params  # w: [3], a and b: [n, 3] (any batch size n)
    return (0.5 * a * w * w + b * w).sum() + (c * c * c).sum() / 3.0


@pytest.mark.parametrize("mode", MODES)
def test_a_new_batch_size_rebinds_and_keeps_the_state(mode: str) -> None:
    ws, a, b = _data(n=4)
    ws = [ws[0][0], ws[1]]
    settings: dict[str, Any] = (
        {"mode": "eager"} if mode == "eager" else {"mode": "compiled", "backend": mode[9:]}
    )
    trainer = ScalarTrainer(
        batch_quadratic, [sg.tensor(w) for w in ws], optimizer=optim.SGD(0.1, momentum=0.9),
        **settings,
    )  # fmt: skip
    velocity = [np.zeros_like(w) for w in ws]
    for k in range(6):
        x, y = (a[:2], b[:2]) if k % 2 else (a, b)  # batch sizes 4, 2, 4, 2, ...
        trainer.step(x, y)
        grads = [ws[0] * x.sum(0) + y.sum(0), ws[1] ** 2]
        velocity = [0.9 * v + g for v, g in zip(velocity, grads, strict=True)]
        ws = [w - 0.1 * v for w, v in zip(ws, velocity, strict=True)]
    for got, want in zip(trainer.get_params(), ws, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


@pytest.mark.skipif(not HAS_C, reason="the C backend (a C compiler) is not available")
def test_bound_step_many_is_one_native_call(monkeypatch: pytest.MonkeyPatch) -> None:
    ws, a, b = _data()
    trainer = _trainer("compiled-c", ws, optimizer=optim.SGD(0.05))

    def no_single_steps(*args: Any) -> float:
        raise AssertionError("step_many must not run single steps")

    monkeypatch.setattr(LiveStep, "step", no_single_steps)
    losses = trainer.step_many(np.stack([a] * 5), np.stack([b] * 5))
    want_losses = []
    for _ in range(5):
        w, c = ws
        want_losses.append((0.5 * a * w * w + b * w).sum() + (c**3).sum() / 3.0)
        ws = [w - 0.05 * g for w, g in zip(ws, quad_grads(ws, a, b), strict=True)]
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    for got, want in zip(trainer.get_params(), ws, strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    assert trainer.global_step == 5 and trainer.last_lr == pytest.approx(0.05)


@pytest.mark.skipif(not HAS_C, reason="the C backend (a C compiler) is not available")
def test_bound_state_is_read_back_only_when_asked() -> None:
    ws, a, b = _data()
    trainer = _trainer("compiled-c", ws, optimizer=optim.Adam(0.01))
    strategy = trainer.strategy
    assert isinstance(strategy, BoundStrategy)
    trainer.step(a, b)
    live = strategy.live
    assert live is not None and live.dirty  # the executable holds the newest state
    trainer.step(a, b)
    assert strategy.live is live  # same binding: only the batch and the lr were passed
    assert int(trainer.optimizer_state()["step"]) == 2  # reading syncs ...
    assert not live.dirty and strategy.live is live  # ... without unbinding
    trainer.set_params(trainer.get_params())  # replacing state unbinds
    assert strategy.live is None
    trainer.step(a, b)
    assert strategy.live is not None and int(trainer.optimizer_state()["step"]) == 3


def embedding_regression(params: Any, ids: Tensor, targets: Tensor) -> Tensor:
    (table,) = params
    return ((sg.embedding(table, ids) - targets) ** 2).mean()


@pytest.mark.skipif(not HAS_C, reason="the C backend (a C compiler) is not available")
def test_a_failing_step_in_step_many_keeps_the_steps_before_it() -> None:
    """A bad id at step 2 of 4: IndexError naming the step; the trainer's state is that
    of the two completed steps (read back from the executable), as in an eager run of two."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(4, 3)).astype(np.float32)
    ids = rng.integers(0, 4, size=(4, 5)).astype(np.int32)
    targets = rng.normal(size=(4, 5, 3)).astype(np.float32)
    ids[2, 1] = 7  # out of range for 4 rows
    trainer = ScalarTrainer(
        embedding_regression, [sg.tensor(table)], mode="compiled", backend="c",
        optimizer=optim.SGD(0.1),
    )  # fmt: skip
    with pytest.raises(IndexError, match="step 2"):
        trainer.step_many(ids, targets)
    reference = ScalarTrainer(embedding_regression, [sg.tensor(table)], optimizer=optim.SGD(0.1))
    for t in range(2):
        reference.step(ids[t], targets[t])
    for got, want in zip(trainer.get_params(), reference.get_params(), strict=True):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert int(trainer.optimizer_state()["step"]) == 2
