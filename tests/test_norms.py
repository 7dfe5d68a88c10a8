"""Norm layers (issue 14) against PyTorch: BatchNorm (train values, gradients, running stats over
10 steps, eval values), GroupNorm and LayerNorm, eagerly and compiled with the C backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _c_unavailable
from shapegrad.nn import BatchNorm, GroupNorm, LayerNorm
from shapegrad.train.optim import trainable_flags

torch = pytest.importorskip("torch", reason="PyTorch is the reference for the norm layers")

C_SKIP = _c_unavailable()
MODES = [
    pytest.param("eager", id="eager"),
    pytest.param("c", id="c", marks=pytest.mark.skipif(C_SKIP is not None, reason=C_SKIP or "")),
]


def _maybe_compiled(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return fn if mode == "eager" else sg.compile(fn, backend="c")


def _bn_step(bn: BatchNorm, x: sg.Tensor, ct: sg.Tensor) -> Any:
    """Training forward + gradients of sum(y * ct) w.r.t. the module and the input."""

    def objective(module: BatchNorm, inputs: sg.Tensor) -> Any:
        y, updated = module(inputs, training=True)
        return (y * ct).sum(), (y, updated)

    (_, (y, updated)), (g_module, g_x) = sg.value_and_grad(objective, argnums=(0, 1), has_aux=True)(bn, x)
    return y, g_module.weight, g_module.bias, g_x, updated


@pytest.mark.parametrize("mode", MODES)
def test_batch_norm_matches_torch_batchnorm2d_over_ten_steps(mode: str) -> None:
    rng = np.random.default_rng(0)
    channels, lr = 3, 0.1
    ref = torch.nn.BatchNorm2d(channels, momentum=0.1, eps=1e-5).double()
    weight, bias = rng.normal(size=channels), rng.normal(size=channels)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(weight))
        ref.bias.copy_(torch.from_numpy(bias))
    bn = BatchNorm.init(c=channels, dtype="float64").replace(weight=weight, bias=bias)
    step = _maybe_compiled(_bn_step, mode)
    for _ in range(10):
        x = rng.normal(2.0, 3.0, size=(4, channels, 5, 5))
        ct = rng.normal(size=x.shape)
        tx = torch.from_numpy(x).requires_grad_(True)
        ty = ref(tx)
        (ty * torch.from_numpy(ct)).sum().backward()
        y, gw, gb, gx, bn = step(bn, sg.tensor(x), sg.tensor(ct))
        np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gw.numpy(), ref.weight.grad.numpy(), rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(gb.numpy(), ref.bias.grad.numpy(), rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(gx.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
        with torch.no_grad():  # the same SGD update on both sides
            ref.weight -= lr * ref.weight.grad
            ref.bias -= lr * ref.bias.grad
            ref.weight.grad = ref.bias.grad = None
        bn = bn.replace(weight=bn.weight - lr * gw, bias=bn.bias - lr * gb)
    np.testing.assert_allclose(bn.running_mean.numpy(), ref.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(bn.running_var.numpy(), ref.running_var.numpy(), rtol=1e-12)
    ref.eval()
    x = rng.normal(size=(2, channels, 4, 4))
    evaluate = _maybe_compiled(lambda m, v: m(v, training=False)[0], mode)
    np.testing.assert_allclose(
        evaluate(bn, sg.tensor(x)).numpy(), ref(torch.from_numpy(x)).detach().numpy(), rtol=1e-10, atol=1e-12
    )


def test_batch_norm_running_stats_are_state_not_parameters() -> None:
    class Net(sg.nn.Module):
        lin: sg.nn.Linear = sg.nn.field(dims={"d_in": "c", "d_out": "c"})
        bn: BatchNorm

    net = Net.init(c=2)
    assert trainable_flags(net) == (True, True, True, True, False, False)
    grads = sg.grad(lambda m: (m.lin.w.sum() + m.bn.running_mean.sum() + m.bn.weight.sum()))(net)
    opt = sg.optim.AdamW(lr=0.5, weight_decay=0.5)
    moved, _ = opt.update(net, grads, opt.init(net))
    np.testing.assert_array_equal(moved.bn.running_var.numpy(), net.bn.running_var.numpy())
    assert not np.array_equal(moved.bn.weight.numpy(), net.bn.weight.numpy())
    assert "(state)" in net.summary() and net.summary().endswith("non-trainable (state)")


def test_batch_norm_eval_returns_the_module_unchanged_and_checks_shapes() -> None:
    bn = BatchNorm.init(c=3)
    _, same = bn(sg.ones((2, 3, 4)), training=False)
    assert same is bn
    with pytest.raises(sg.ShapeError, match=r"weight must be \[4\] for input \[2, 4\]"):
        bn(sg.ones((2, 4)), training=True)


@pytest.mark.parametrize("mode", MODES)
def test_group_norm_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(1)
    x, w, b, ct = rng.normal(size=(2, 6, 3, 2)), rng.normal(size=6), rng.normal(size=6), rng.normal(size=(2, 6, 3, 2))
    gn = GroupNorm.init(c=6, dtype="float64").replace(weight=w, bias=b, groups=3)

    def objective(m: GroupNorm, v: sg.Tensor) -> sg.Tensor:
        return (m(v) * ct).sum()

    run = _maybe_compiled(sg.value_and_grad(objective, argnums=(0, 1)), mode)
    value, (g_m, g_x) = run(gn, sg.tensor(x))
    tx, tw, tb = (torch.from_numpy(a).requires_grad_(True) for a in (x, w, b))
    ref = (torch.nn.functional.group_norm(tx, 3, tw, tb, eps=1e-5) * torch.from_numpy(ct)).sum()
    ref.backward()
    assert value.item() == pytest.approx(ref.item(), rel=1e-12)
    np.testing.assert_allclose(g_x.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(g_m.weight.numpy(), tw.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(g_m.bias.numpy(), tb.grad.numpy(), rtol=1e-10)
    with pytest.raises(sg.ShapeError, match="do not split into 4 groups"):
        gn.replace(groups=4)(sg.tensor(x))


@pytest.mark.parametrize("mode", MODES)
def test_layer_norm_module_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(2)
    x, w, b = rng.normal(size=(3, 5)), rng.normal(size=5), rng.normal(size=5)
    ln = LayerNorm.init(c=5, dtype="float64").replace(weight=w, bias=b)
    out = _maybe_compiled(lambda m, v: m(v), mode)(ln, sg.tensor(x))
    ref = torch.nn.functional.layer_norm(torch.from_numpy(x), (5,), torch.from_numpy(w), torch.from_numpy(b))
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12)
