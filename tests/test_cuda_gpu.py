"""The CUDA backend on a GPU: training parity with eager, K-step runs, device-side index
errors, layer loops (``sg.scan``, ``transformer_stack(loop=True)``) and merged elementwise
kernels against eager. Skipped (with the reason) where pycuda, a driver or a GPU is missing; the op table
runs in ``cuda`` mode through tests/test_ops.py (``modes.MODES["cuda"]``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _cuda_unavailable
from shapegrad.compiler import loops as L

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


def _parity(
    loss: Any,
    shapes: list[tuple[int, ...]],
    xs: np.ndarray,
    ys: np.ndarray,
    params: list[np.ndarray] | None = None,
    eager_loss: Any = None,
) -> Any:
    """K SGD steps of ``loss`` compiled for CUDA (bound, one graph replay per step) against
    the same steps of ``eager_loss`` (default ``loss``) in eager mode; returns the
    executable."""
    params = _params(shapes, 0) if params is None else params
    step = _step(loss)
    eager_step = _step(loss if eager_loss is None else eager_loss)
    ps = [sg.tensor(p) for p in params]
    expected = []
    for x, y in zip(xs, ys, strict=True):
        ps, value = eager_step(ps, sg.tensor(x), sg.tensor(y))
        expected.append(float(value.numpy()))
    exe = sg.compile(step, backend="cuda", donate_argnums=0).lower(params, xs[0], ys[0]).executable
    bound = exe.bind(params)
    got = [float(bound.step(x, y)[0]) for x, y in zip(xs, ys, strict=True)]
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-5)
    for a, b in zip(bound.read_state(), ps, strict=True):
        np.testing.assert_allclose(a, b.numpy(), rtol=2e-3, atol=2e-4)
    return exe


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


# --- layer loops (sg.scan, transformer_stack(loop=True)) ------------------------------------


@pytest.mark.parametrize("policy", ["recompute", "residuals"])
@pytest.mark.parametrize("reverse", [False, True])
def test_scan_equals_unrolled_on_cuda(policy: str, reverse: bool) -> None:
    """float64, so the layer loop's slices and carries must be exact (as on C)."""
    from modes import MODES
    from test_scan import _looped, _mlp_arrays, _unrolled

    arrays = _mlp_arrays(5)
    (value,) = MODES["cuda"].call(_looped(policy, reverse), arrays)
    (expected,) = MODES["eager"].call(_unrolled(reverse), arrays)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-10)
    grads = MODES["cuda"].grad(_looped(policy, reverse), arrays, (0, 1, 2))
    expected_grads = MODES["eager"].grad(_unrolled(reverse), arrays, (0, 1, 2))
    for g, e in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)


def _transformer_loss(loop: bool, remat: bool = True) -> Any:
    from shapegrad.nn.transformer import transformer_stack

    def loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
        *stack, head = params
        out = transformer_stack(stack, x, heads=4, causal=True, loop=loop, remat=remat)
        return sg.cross_entropy(out.mean(axis=1) @ head, y)

    return loss


def _transformer_params(layers: int, d: int = 64, f: int = 256) -> list[np.ndarray]:
    from shapegrad.nn.transformer import BlockStack, block_init

    stack = BlockStack.init(block_init(0.1), seed=1, layers=layers, d=d, f=f, dtype="float32")
    head = (np.random.default_rng(7).standard_normal((d, 10)) * 0.1).astype(np.float32)
    return [np.asarray(p.numpy()) for p in stack] + [head]


@pytest.mark.parametrize("remat", [True, False])
def test_transformer_stack_loop_steps_match_eager(remat: bool) -> None:
    """A layer loop whose body's products go to cuBLAS, 6 steps in the captured graph
    against the unrolled stack in eager mode."""
    rng = np.random.default_rng(8)
    xs = rng.standard_normal((6, 8, 16, 64)).astype(np.float32)
    ys = rng.integers(0, 10, (6, 8)).astype(np.int32)
    params = _transformer_params(4)
    loss, unrolled = _transformer_loss(True, remat), _transformer_loss(False, remat)
    exe = _parity(loss, [], xs, ys, params=params, eager_loss=unrolled)
    layer_loops = [
        s for k in exe.program.kernels for s in L.walk(k.body) if isinstance(s, L.LayerLoop)
    ]
    assert layer_loops and all(s.length == 4 for s in layer_loops)


def test_sixteen_block_loop_model_compiles_and_steps() -> None:
    """16 blocks: one copy of the body in the launcher; one step equals eager."""
    import time

    rng = np.random.default_rng(9)
    xs = rng.standard_normal((2, 4, 16, 64)).astype(np.float32)
    ys = rng.integers(0, 10, (2, 4)).astype(np.int32)
    params = _transformer_params(16)
    start = time.perf_counter()
    exe = _parity(_transformer_loss(True), [], xs, ys, params=params)
    print(
        f"16-block transformer step: compiled and 2 steps run in {time.perf_counter() - start:.1f} s"
    )
    assert exe.launches_per_step > 0


def test_step_many_over_a_scanned_model_on_cuda() -> None:
    """K steps in one graph launch through a layer loop equal K single steps."""
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

    def trainer(backend: str) -> sg.ScalarTrainer:
        return sg.ScalarTrainer(
            loss,
            [sg.tensor(p) for p in params],
            mode="compiled" if backend != "eager" else "eager",
            backend=backend if backend != "eager" else "numpy",
            optimizer=sg.optim.AdamW(lr=1e-2),
        )

    many = trainer("cuda")
    losses = many.step_many(xs, ys)
    single = trainer("cuda")
    one_by_one = [single.step(xs[k], ys[k]) for k in range(len(xs))]
    eager = trainer("eager")
    expected = [eager.step(xs[k], ys[k]) for k in range(len(xs))]
    np.testing.assert_allclose(losses, one_by_one, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(losses, expected, rtol=2e-3, atol=2e-5)
    for a, b in zip(many.get_params(), single.get_params(), strict=True):
        np.testing.assert_allclose(
            np.asarray(a.numpy()), np.asarray(b.numpy()), rtol=1e-5, atol=1e-6
        )


# --- elementwise fusion ---------------------------------------------------------------------


def test_fused_gelu_backward_matches_eager_and_unfused() -> None:
    from shapegrad.compiler.target import CUDA_TARGET

    x = np.random.default_rng(10).standard_normal((64, 300)).astype(np.float32) * 3

    def f(x: sg.Tensor) -> sg.Tensor:
        return sg.grad(lambda x: sg.gelu(x).sum())(x)

    fused = sg.compile(f, backend="cuda")
    assert len(fused.lower(x).executable.program.kernels) == 1  # four kernels merged
    unfused_target = CUDA_TARGET.replace(skip_stages=frozenset({"fuse_elementwise_kernels"}))
    unfused = sg.compile(f, backend="cuda", target=unfused_target)
    got = fused(sg.tensor(x)).numpy()
    # merged or not, the same expression per element (rounding may differ: inlined values,
    # FMA contraction, the device's tanhf)
    np.testing.assert_allclose(got, f(sg.tensor(x)).numpy(), rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(got, unfused(sg.tensor(x)).numpy(), rtol=1e-5, atol=2e-6)


def test_fused_adam_steps_match_eager() -> None:
    """Adam's moment and parameter updates merged into one launch per parameter (the new
    moments are stored and read back by the same thread), 20 steps against eager."""
    shapes = [(2, 64), (64,), (64, 64), (64,), (64, 2), (2,)]
    params = _params(shapes, 11)
    moments = [np.zeros_like(p) for p in params]
    rng = np.random.default_rng(12)
    xs = rng.standard_normal((20, 32, 2)).astype(np.float32)
    ys = (xs[..., 0] * xs[..., 1] > 0).astype(np.int32)

    def step(
        p: list[sg.Tensor], m: list[sg.Tensor], v: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor
    ) -> Any:
        value, grads = sg.value_and_grad(_mlp)(p, x, y)
        m2 = [0.9 * a + 0.1 * g for a, g in zip(m, grads, strict=True)]
        v2 = [0.999 * a + 0.001 * (g * g) for a, g in zip(v, grads, strict=True)]
        new = [w - 0.01 * a / (sg.sqrt(b) + 1e-8) for w, a, b in zip(p, m2, v2, strict=True)]
        return new, m2, v2, value

    compiled = sg.compile(step, backend="cuda")
    program = compiled.lower(params, moments, moments, xs[0], ys[0]).executable.program
    assert any(" + " in k.root for k in program.kernels)  # merged elementwise kernels
    state = [[sg.tensor(a) for a in group] for group in (params, moments, moments)]
    eager = [[sg.tensor(a) for a in group] for group in (params, moments, moments)]
    for x, y in zip(xs, ys, strict=True):
        *state, value = compiled(*state, sg.tensor(x), sg.tensor(y))
        *eager, expected = step(*eager, sg.tensor(x), sg.tensor(y))
        np.testing.assert_allclose(float(value.numpy()), float(expected.numpy()), rtol=2e-3)
    for got_group, want_group in zip(state, eager, strict=True):
        for a, b in zip(got_group, want_group, strict=True):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=2e-3, atol=2e-4)


def test_nested_scan_matches_eager() -> None:
    """A layer loop inside a layer body (float64: exact up to rounding)."""
    rng = np.random.default_rng(13)
    w = rng.normal(size=(3, 2, 6, 6)) * 0.5
    x = rng.normal(size=(4, 6))

    def inner(h: sg.Tensor, wl: sg.Tensor) -> tuple[sg.Tensor, None]:
        return sg.tanh(h @ wl), None

    def outer(h: sg.Tensor, ws: sg.Tensor) -> tuple[sg.Tensor, None]:
        return sg.scan(inner, h, ws)[0], None

    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h, _ = sg.scan(outer, x, w)
        return (h * h).sum()

    def unrolled(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        h = x
        for i in range(3):
            for j in range(2):
                h = sg.tanh(h @ w[i, j])
        return (h * h).sum()

    f = sg.value_and_grad(loss, argnums=(0, 1))
    value, (gw, gx) = sg.compile(f, backend="cuda")(sg.tensor(w), sg.tensor(x))
    e_value, (e_gw, e_gx) = sg.value_and_grad(unrolled, argnums=(0, 1))(sg.tensor(w), sg.tensor(x))
    np.testing.assert_allclose(value.numpy(), e_value.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(gw.numpy(), e_gw.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(gx.numpy(), e_gx.numpy(), rtol=0, atol=1e-10)


def test_fused_nest_over_two_axes_matches_numpy() -> None:
    """A broadcast nest with flat kernels merged into it (indices flattened onto 2 axes)."""
    rng = np.random.default_rng(14)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)

    def f(x: sg.Tensor, b: sg.Tensor) -> Any:
        h = x + b
        return h, sg.tanh(h) * 2.0 + h, sg.exp(h)

    compiled = sg.compile(f, backend="cuda")
    assert len(compiled.lower(x, b).executable.program.kernels) == 1
    h, y, e = (t.numpy() for t in compiled(sg.tensor(x), sg.tensor(b)))
    want = x + b
    np.testing.assert_allclose(h, want, rtol=1e-6)
    np.testing.assert_allclose(y, np.tanh(want) * 2 + want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e, np.exp(want), rtol=1e-5)


@pytest.mark.parametrize("policy", ["recompute", "residuals"])
def test_checkpoint_gradients_equal_the_plain_function_on_cuda(policy: str) -> None:
    """sg.checkpoint regions are one-layer loops (float64; the device's exp/tanh may
    differ from NumPy's by an ulp or two)."""
    from modes import MODES
    from test_remat import _arrays, _loss

    checkpointed = _loss(lambda f: sg.checkpoint(f, policy=policy))
    plain = _loss(lambda f: f)
    arrays = _arrays()
    (value,) = MODES["cuda"].call(checkpointed, arrays)
    (expected,) = MODES["eager"].call(plain, arrays)
    np.testing.assert_allclose(value, expected, rtol=0, atol=1e-10)
    grads = MODES["cuda"].grad(checkpointed, arrays, (0, 1, 2))
    for g, e in zip(grads, MODES["eager"].grad(plain, arrays, (0, 1, 2)), strict=True):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-10)
