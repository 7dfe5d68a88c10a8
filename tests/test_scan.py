"""Layer loops (``sg.scan``): equal to the unrolled Python loop, both VJP policies, every mode;
one copy of the body in the generated C whatever the depth; ``step_many`` over a scanned model."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad.backends.c import generate
from shapegrad.compiler import loops as L
from shapegrad.nn.transformer import BlockStack, block_init, transformer_stack

POLICIES = ["recompute", "residuals"]


def _mode(name: str) -> Any:
    runner = MODES[name]
    reason = runner.unavailable()
    if reason:
        pytest.skip(reason)
    return runner


def _mlp_layer(h: sg.Tensor, wb: tuple[sg.Tensor, sg.Tensor]) -> tuple[sg.Tensor, sg.Tensor]:
    w, b = wb
    out = sg.tanh(h @ w.T + b)
    return out, (out * out).mean()


def _mlp_arrays(layers: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(layers, 6, 6)) * 0.6
    b = rng.normal(size=(layers, 6)) * 0.1
    x = rng.normal(size=(3, 6))
    return [w, b, x]


def _looped(policy: str, reverse: bool = False) -> Any:
    def loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, ys = sg.scan(_mlp_layer, x, (w, b), reverse=reverse, policy=policy)
        weights = sg.arange(1, ys.shape[0] + 1, dtype="float64")
        return (h * h).sum() + (ys * weights).sum()

    return loss


def _unrolled(reverse: bool = False) -> Any:
    def loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, total = x, None
        layers = w.shape[0]
        for i in reversed(range(layers)) if reverse else range(layers):
            h, y = _mlp_layer(h, (w[i], b[i]))
            term = y * float(i + 1)
            total = term if total is None else total + term
        assert total is not None
        return (h * h).sum() + total

    return loss


@pytest.mark.parametrize("mode", ["eager", "numpy", "c"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("reverse", [False, True])
def test_mlp_stack_equals_unrolled(mode: str, policy: str, reverse: bool) -> None:
    runner = _mode(mode)
    arrays = _mlp_arrays(5)
    (value,) = runner.call(_looped(policy, reverse), arrays)
    (expected,) = MODES["eager"].call(_unrolled(reverse), arrays)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-10)
    grads = runner.grad(_looped(policy, reverse), arrays, (0, 1, 2))
    expected_grads = MODES["eager"].grad(_unrolled(reverse), arrays, (0, 1, 2))
    for g, e in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mode", ["eager", "c"])
@pytest.mark.parametrize("policy", POLICIES)
def test_transformer_stack_equals_unrolled(mode: str, policy: str) -> None:
    runner = _mode(mode)
    stack = BlockStack.init(block_init(0.3), seed=1, layers=3, d=8, f=16, dtype="float64")
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 8))
    arrays = [x, *(np.asarray(t.numpy()) for t in stack)]

    def make(loop: bool) -> Any:
        def loss(x: sg.Tensor, *params: sg.Tensor) -> sg.Tensor:
            out = transformer_stack(
                params, x, heads=2, causal=True, loop=loop, remat=policy == "recompute"
            )
            return (out * out).sum()

        return loss

    (value,) = runner.call(make(True), arrays)
    (expected,) = MODES["eager"].call(make(False), arrays)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-10)
    nums = tuple(range(13))
    grads = runner.grad(make(True), arrays, nums)
    expected_grads = MODES["eager"].grad(make(False), arrays, nums)
    for g, e in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)


def test_closure_invariants_get_accumulated_gradients() -> None:
    rng = np.random.default_rng(3)
    w = sg.tensor(rng.normal(size=(4, 5, 5)) * 0.5)
    scale = sg.tensor(rng.normal(size=(5,)))
    x = sg.tensor(rng.normal(size=(2, 5)))

    def looped(w: sg.Tensor, scale: sg.Tensor) -> sg.Tensor:
        h, _ = sg.scan(lambda h, wl: (sg.tanh(h @ wl) * scale, None), x, w)
        return h.sum()

    def unrolled(w: sg.Tensor, scale: sg.Tensor) -> sg.Tensor:
        h = x
        for i in range(4):
            h = sg.tanh(h @ w[i]) * scale
        return h.sum()

    got = sg.grad(looped, argnums=(0, 1))(w, scale)
    compiled = sg.compile(sg.grad(looped, argnums=(0, 1)), backend="c")(w, scale)
    want = sg.grad(unrolled, argnums=(0, 1))(w, scale)
    for a, c, e in zip(got, compiled, want, strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), atol=1e-12)
        np.testing.assert_allclose(c.numpy(), e.numpy(), atol=1e-12)


def test_gradient_of_gradient_through_a_loop() -> None:
    w, b, x = (sg.tensor(a) for a in _mlp_arrays(3, seed=4))

    def outer(loss: Any) -> Any:
        return lambda w, b, x: (sg.grad(loss)(w, b, x) ** 2).sum()

    got = sg.grad(outer(_looped("recompute")), argnums=(0, 2))(w, b, x)
    want = sg.grad(outer(_unrolled()), argnums=(0, 2))(w, b, x)
    for a, e in zip(got, want, strict=True):
        np.testing.assert_allclose(a.numpy(), e.numpy(), atol=1e-10)


def _source(layers: int) -> str:
    arrays = _mlp_arrays(layers)
    fn = sg.compile(sg.value_and_grad(_looped("recompute"), argnums=(0, 1)), backend="numpy")
    graph = fn.graph(*(sg.tensor(a) for a in arrays))
    _, source = generate(graph)
    return source


def test_generated_source_does_not_grow_with_depth() -> None:
    small, deep = _source(2), _source(64)
    # same kernels, only the loop bounds, offsets and buffer sizes (the numbers) differ
    assert re.sub(r"[0-9]+", "N", deep) == re.sub(r"[0-9]+", "N", small)
    definition = "char *restrict arena) {"
    assert small.count(definition) == deep.count(definition) == 3  # sg_body + forward + reverse


def test_layer_loop_statement_in_the_program() -> None:
    arrays = _mlp_arrays(4)
    fn = sg.compile(_looped("recompute"), backend="numpy")
    program, _ = generate(fn.graph(*(sg.tensor(a) for a in arrays)))
    loops = [s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.LayerLoop)]
    assert len(loops) == 1 and loops[0].length == 4
    assert "for layer in 0..4" in program.format()


def test_step_many_over_a_scanned_model_equals_single_steps() -> None:
    rng = np.random.default_rng(5)
    params = [
        (rng.normal(size=(4, 8, 8)) * 0.3).astype(np.float32),
        np.zeros((4, 8), np.float32),
        (rng.normal(size=(2, 8)) * 0.3).astype(np.float32),
    ]
    xs = rng.normal(size=(6, 16, 8)).astype(np.float32)
    ys = rng.integers(0, 2, size=(6, 16)).astype(np.int32)

    def loss(params: Any, x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        w, b, head = params
        h, _ = sg.scan(lambda h, wb: (sg.relu(h @ wb[0].T + wb[1]), None), x, (w, b))
        return sg.cross_entropy(h @ head.T, y)

    def trainer() -> sg.ScalarTrainer:
        return sg.ScalarTrainer(
            loss,
            [sg.tensor(p) for p in params],
            mode="compiled",
            backend="c",
            optimizer=sg.optim.AdamW(lr=1e-2),
        )

    many = trainer()
    losses = many.step_many(xs, ys)
    single = trainer()
    expected = [single.step(xs[k], ys[k]) for k in range(len(xs))]
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)
    for a, b in zip(many.get_params(), single.get_params(), strict=True):
        np.testing.assert_allclose(
            np.asarray(a.numpy()), np.asarray(b.numpy()), rtol=1e-5, atol=1e-6
        )


def test_bad_loops_get_clear_errors() -> None:
    x = sg.tensor(np.ones((2, 3)))
    w = sg.tensor(np.ones((4, 3, 5)))
    with pytest.raises(sg.ShapeError, match="changes a carry"):
        sg.scan(lambda h, wl: (h @ wl, None), x, w)
    with pytest.raises(sg.ShapeError, match="same leading"):
        sg.scan(lambda h, xs: (h, None), x, (w, sg.tensor(np.ones((3, 2)))))
    with pytest.raises(TypeError, match="pair"):
        sg.scan(lambda h, wl: h, x, w)
    with pytest.raises(ValueError, match="policy"):
        sg.scan(lambda h, wl: (h, None), x, w, policy="fast")  # type: ignore[arg-type]


def test_renderers_without_a_layer_loop_rule_say_so() -> None:
    from shapegrad.backends.cstyle import CStyleRenderer

    arrays = _mlp_arrays(2)
    program, _ = generate(
        sg.compile(_looped("recompute"), backend="numpy").graph(*map(sg.tensor, arrays))
    )
    loop = next(s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.LayerLoop))
    with pytest.raises(NotImplementedError, match="layer loops"):
        CStyleRenderer(program).layer_loop(loop, 0)


def test_residuals_policy_does_not_recompute_the_forward() -> None:
    arrays = _mlp_arrays(3)
    fn = sg.compile(sg.value_and_grad(_looped("residuals"), argnums=(0, 1)), backend="numpy")
    graph = fn.graph(*(sg.tensor(a) for a in arrays))
    names = [n.attr["body"].name for n in graph.nodes() if n.prim.value == "scan"]
    assert names == ["_mlp_layer_res", "_mlp_layer_res_vjp"]
    backward = next(
        n.attr["body"]
        for n in graph.nodes()
        if n.prim.value == "scan" and "vjp" in n.attr["body"].name
    )
    # the stored products are read, not recomputed: no contraction of the forward in the body
    forward_products = [
        n for n in backward.graph.nodes() if n.prim.value == "einsum" and n.aval.shape == (3, 6)
    ]
    assert len(forward_products) == 1  # only the input gradient h' = g @ w
