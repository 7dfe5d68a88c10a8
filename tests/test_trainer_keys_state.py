"""ScalarTrainer with per-step random keys (dropout) and loss-updated state (batch-norm running
statistics), issue 14: fresh masks every step with one trace, the documented key per step,
bit-identical resume from checkpoints, running stats updated by the compiled step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _c_unavailable
from shapegrad import Tensor, tree
from shapegrad.nn import BatchNorm, Linear, Module, field

C_SKIP = _c_unavailable()
needs_c = pytest.mark.skipif(C_SKIP is not None, reason=C_SKIP or "")


class MLP(Module):
    l1: Linear = field(dims={"d_in": "i", "d_out": "h"})
    l2: Linear = field(dims={"d_in": "h", "d_out": "o"})


def dropout_loss(m: MLP, x: Tensor, y: Tensor, *, key: Tensor) -> Tensor:
    hidden = sg.dropout(sg.relu(m.l1(x)), 0.5, key)
    return sg.cross_entropy(m.l2(hidden), y)


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(8, 3)).astype(np.float32), rng.integers(0, 2, size=8).astype(np.int32)


def _mlp() -> MLP:
    return MLP.init(seed=0, i=3, h=32, o=2)


def _traces(trainer: sg.ScalarTrainer) -> list[int]:
    return [c.trace_count for c in trainer.strategy.functions.compiled.values()]  # type: ignore[attr-defined]


@needs_c
def test_dropout_masks_differ_per_step_with_one_trace() -> None:
    trainer = sg.ScalarTrainer(dropout_loss, _mlp(), mode="compiled", backend="c",
                               optimizer=sg.optim.SGD(lr=0.0), seed=3)  # fmt: skip
    x, y = _data()
    losses = [trainer.step(x, y) for _ in range(5)]
    assert len(set(losses)) == 5  # same params, same batch: only the masks changed
    assert _traces(trainer) == [1]
    base = sg.random.key(3)
    for t, loss in enumerate(losses):  # step t used fold_in(key(seed), t)
        expected = dropout_loss(_mlp(), sg.tensor(x), sg.tensor(y), key=sg.random.fold_in(base, t))
        assert loss == pytest.approx(expected.item(), rel=1e-6)


@needs_c
def test_eager_and_compiled_trainers_draw_the_same_masks() -> None:
    x, y = _data(1)

    def run(mode: str) -> list[float]:
        trainer = sg.ScalarTrainer(dropout_loss, _mlp(), mode=mode, backend="c", optimizer=sg.optim.Adam(lr=0.01))
        return [trainer.step(x, y) for _ in range(4)]

    np.testing.assert_allclose(run("eager"), run("compiled"), rtol=1e-5)


@needs_c
@pytest.mark.parametrize("backend", ["c", "numpy"])
def test_dropout_resume_from_checkpoint_is_bit_identical(tmp_path: Path, backend: str) -> None:
    def trainer(seed: int) -> sg.ScalarTrainer:
        return sg.ScalarTrainer(dropout_loss, _mlp(), mode="compiled", backend=backend,
                                optimizer=sg.optim.Adam(lr=0.01), seed=seed)  # fmt: skip

    batches = [_data(t) for t in range(6)]
    straight = trainer(7)
    losses = [straight.step(*b) for b in batches]
    first = trainer(7)
    for b in batches[:3]:
        first.step(*b)
    path = first.save_checkpoint(tmp_path / "run.npz")
    resumed = trainer(99)  # another seed: the checkpoint's key stream wins
    resumed.load_checkpoint(path)
    assert [resumed.step(*b) for b in batches[3:]] == losses[3:]
    for a, b in zip(tree.flatten(straight.get_params())[0], tree.flatten(resumed.get_params())[0], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert all(count == 1 for count in _traces(straight))


# --- batch norm: running statistics as state updated by the step ----------------------------


class BNNet(Module):
    lin: Linear = field(dims={"d_in": "i", "d_out": "h"})
    bn: BatchNorm = field(dims={"c": "h"})
    head: Linear = field(dims={"d_in": "h", "d_out": "o"})


def bn_loss(m: BNNet, x: Tensor, y: Tensor) -> Any:
    hidden, bn = m.bn(m.lin(x), training=True)
    return sg.cross_entropy(m.head(sg.relu(hidden)), y), m.replace(bn=bn)


def _bn_reference(steps: int, lr: float) -> BNNet:
    """Eager: value_and_grad with the updated model as aux, SGD on the trainable leaves."""
    model = BNNet.init(seed=0, i=3, h=4, o=2)
    flags = model.requires_grad
    for t in range(steps):
        (_, updated), grads = sg.value_and_grad(bn_loss, has_aux=True)(model, *map(sg.tensor, _data(t)))
        leaves, td = tree.flatten(model)
        new = [
            x - lr * g if f else u
            for x, g, u, f in zip(leaves, tree.flatten(grads)[0], tree.flatten(updated)[0], flags, strict=True)
        ]
        model = tree.unflatten(td, new)
    return model


@pytest.mark.parametrize("mode", ["eager", pytest.param("compiled", marks=needs_c)])
def test_trainer_updates_batch_norm_running_stats(mode: str) -> None:
    trainer = sg.ScalarTrainer(bn_loss, BNNet.init(seed=0, i=3, h=4, o=2), mode=mode, backend="c",
                               optimizer=sg.optim.SGD(lr=0.1))  # fmt: skip
    for t in range(5):
        trainer.step(*_data(t))
    got, want = trainer.get_params(), _bn_reference(5, 0.1)
    assert not np.allclose(got.bn.running_var.numpy(), 1.0)  # they moved
    for (name, a), b in zip(got.named().items(), tree.flatten(want)[0], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


@needs_c
def test_running_stats_are_checkpointed_and_resume_bit_identically(tmp_path: Path) -> None:
    def trainer() -> sg.ScalarTrainer:
        return sg.ScalarTrainer(bn_loss, BNNet.init(seed=0, i=3, h=4, o=2), mode="compiled",
                                backend="c", optimizer=sg.optim.AdamW(lr=0.01))  # fmt: skip

    straight = trainer()
    for t in range(6):
        straight.step(*_data(t))
    first = trainer()
    for t in range(3):
        first.step(*_data(t))
    path = first.save_checkpoint(tmp_path / "bn.npz")
    assert "params/bn.running_mean" in np.load(path).files
    resumed = trainer()
    resumed.load_checkpoint(path)
    for t in range(3, 6):
        resumed.step(*_data(t))
    np.testing.assert_array_equal(resumed.get_params().bn.running_var.numpy(),
                                  straight.get_params().bn.running_var.numpy())  # fmt: skip
    np.testing.assert_array_equal(resumed.get_params().lin.w.numpy(), straight.get_params().lin.w.numpy())


def test_a_loss_returning_mismatched_state_is_a_clear_error() -> None:
    def bad(m: BNNet, x: Tensor, y: Tensor) -> Any:
        return bn_loss(m, x, y)[0], m.bn

    trainer = sg.ScalarTrainer(bad, BNNet.init(seed=0, i=3, h=4, o=2), mode="eager")
    with pytest.raises(TypeError, match=r"\(loss, new_params\) must return new_params with the structure"):
        trainer.step(*_data())
