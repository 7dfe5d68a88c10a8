"""Updated module state without threading it back: ``Module.with_state`` records the new
copy in ``sg.nn.state_updates()``, which ScalarTrainer opens around the loss, so a loss
that returns only the scalar still keeps BatchNorm's running statistics (PyTorch-like)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import Tensor, tree
from shapegrad.nn import BatchNorm, Linear, Module, field


class Inner(Module):
    lin: Linear = field(dims={"d_in": "i", "d_out": "h"})
    bn: BatchNorm = field(dims={"c": "h"})

    def __call__(self, x: Tensor) -> Tensor:
        y, _ = self.bn(self.lin(x), training=True)  # the returned copy is not threaded back
        return sg.relu(y)


class Net(Module):
    inner: Inner
    head: Linear = field(dims={"d_in": "h", "d_out": "o"})


def implicit_loss(m: Net, x: Tensor, y: Tensor) -> Tensor:
    return sg.cross_entropy(m.head(m.inner(x)), y)


def explicit_loss(m: Net, x: Tensor, y: Tensor) -> Any:
    """The threading by hand that state_updates replaces."""
    hidden, bn = m.inner.bn(m.inner.lin(x), training=True)
    return sg.cross_entropy(m.head(sg.relu(hidden)), y), m.replace(inner=m.inner.replace(bn=bn))


def data(t: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(t)
    return rng.normal(1.0, 2.0, size=(8, 3)).astype(np.float32), rng.integers(0, 2, 8).astype(np.int32)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_trainer_keeps_recorded_running_stats(mode: str) -> None:
    model = Net.init(seed=0, i=3, h=4, o=2)
    x0, _ = data(0)
    h0 = x0 @ model.inner.lin.w.numpy().T + model.inner.lin.b.numpy()
    make = lambda loss: sg.ScalarTrainer(loss, model, mode=mode, optimizer=sg.optim.SGD(lr=0.1))  # noqa: E731
    implicit, explicit = make(implicit_loss), make(explicit_loss)
    implicit.step(*data(0))
    first = implicit.get_params().inner.bn
    np.testing.assert_allclose(first.running_mean.numpy(), 0.1 * h0.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(first.running_var.numpy(), 0.9 + 0.1 * h0.var(axis=0, ddof=1), rtol=1e-5)
    explicit.step(*data(0))
    for t in range(1, 5):
        assert implicit.step(*data(t)) == pytest.approx(explicit.step(*data(t)), rel=1e-6)
    got, want = implicit.get_params(), explicit.get_params()
    for (name, a), b in zip(got.named().items(), tree.flatten(want)[0], strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def test_state_updates_outside_the_trainer() -> None:
    model = Net.init(seed=0, i=3, h=4, o=2)
    x = sg.tensor(data(0)[0])
    with sg.nn.state_updates() as updates:
        model.inner(x)
    assert len(updates) == 1
    updated = updates.apply(model)
    h = model.inner.lin(x).numpy()
    np.testing.assert_allclose(updated.inner.bn.running_mean.numpy(), 0.1 * h.mean(axis=0), rtol=1e-5)
    assert updated.head.w is model.head.w  # everything else is left alone
    assert np.allclose(model.inner.bn.running_mean.numpy(), 0.0)  # the old model is unchanged
    model.inner(x)  # no collector: nothing is recorded, nothing fails


def test_state_of_a_module_outside_the_tree_is_an_error() -> None:
    model = Net.init(seed=0, i=3, h=4, o=2)
    with sg.nn.state_updates() as updates:
        BatchNorm.init(c=4)(sg.ones((2, 4)), training=True)  # built here: not part of `model`
    with pytest.raises(ValueError, match="not leaves of the parameters"):
        updates.apply(model)
