"""Typed modules (issue 14): a nested transformer-style model (a list of blocks) through eager
grad, compiled C grad, ScalarTrainer + Adam, checkpoint resume and summary; init roles;
ParamList attribute access and gain initialisation; nested checkpoint names."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _c_unavailable
from shapegrad import Float, Tensor, tree
from shapegrad.nn import LayerNorm, Linear, Module, field

C_SKIP = _c_unavailable()
needs_c = pytest.mark.skipif(C_SKIP is not None, reason=C_SKIP or "")


class Block(Module):
    """Pre-norm single-head attention + ReLU MLP with residuals."""

    ln1: LayerNorm = field(dims={"c": "d"})
    w_qkv: Float[Tensor, "3*d d"]
    ln2: LayerNorm = field(dims={"c": "d"})
    up: Linear = field(dims={"d_in": "d", "d_out": "4*d"})
    down: Linear = field(dims={"d_in": "4*d", "d_out": "d"})

    def __call__(self, x: Tensor) -> Tensor:
        d = x.shape[-1]
        qkv = sg.nn.linear(self.ln1(x), self.w_qkv)
        q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
        scores = sg.einsum("btd,bsd->bts", q, k) / math.sqrt(d)
        x = x + sg.einsum("bts,bsd->btd", sg.softmax(scores, axis=-1), v)
        return x + self.down(sg.relu(self.up(self.ln2(x))))


class TinyGPT(Module):
    embed: Float[Tensor, "v d"]
    blocks: list[Block] = field(length="layers")
    ln_f: LayerNorm = field(dims={"c": "d"})
    head: Linear = field(dims={"d_in": "d", "d_out": "v"})


def gpt_loss(model: TinyGPT, ids: Any, targets: Any) -> Tensor:
    x = sg.embedding(model.embed, ids)
    for block in model.blocks:
        x = block(x)
    logits = model.head(model.ln_f(x))
    vocab = model.embed.shape[0]
    return sg.cross_entropy(logits.reshape((-1, vocab)), targets.reshape((-1,)))


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(seed).integers(0, 7, size=(2, 5)).astype(np.int32)
    return ids, np.roll(ids, -1, axis=1)


def _model(dtype: str = "float32") -> TinyGPT:
    return TinyGPT.init(seed=0, dtype=dtype, v=7, d=4, layers=2)


# --- structure ---------------------------------------------------------------------------------


def test_fields_by_name_and_leaf_names() -> None:
    m = _model()
    assert m.blocks[1].up.w.shape == (16, 4) and m.blocks[1].down.w.shape == (4, 16)
    assert m.blocks[0].w_qkv.shape == (12, 4)
    names = list(m.named())
    assert names[:3] == ["embed", "blocks.0.ln1.weight", "blocks.0.ln1.bias"]
    assert names[-2:] == ["head.w", "head.b"] and len(names) == len(tree.flatten(m)[0]) == 23


def test_summary_lists_the_tree_with_shapes_and_counts() -> None:
    text = _model().summary()
    lines = text.splitlines()
    assert lines[0].split() == ["TinyGPT", "495"]
    assert lines[1].split() == ["├─", "embed", "float32[7,", "4]", "28"]
    assert lines[2].split() == ["├─", "blocks:", "list[Block]", "x2", "424"]
    assert lines[3].split() == ["│", "├─", "0:", "Block", "212"]
    assert lines[4].split() == ["│", "│", "├─", "ln1:", "LayerNorm", "8"]
    assert lines[5].split() == ["│", "│", "│", "├─", "weight", "float32[4]", "4"]
    assert lines[8].split() == ["│", "│", "├─", "w_qkv", "float32[12,", "4]", "48"]
    assert lines[-1] == "495 trainable parameters"
    # embed 28 + 2 blocks * (ln 8 + qkv 48 + ln 8 + up 64+16 + down 64+4) + ln_f 8 + head 28+7
    assert 28 + 2 * (8 + 48 + 8 + 80 + 68) + 8 + 35 == 495


def test_init_roles_weights_fan_in_scaled_biases_zero_gains_one() -> None:
    wide = Linear.init(seed=3, d_in=400, d_out=300)
    assert wide.w.numpy().std() == pytest.approx(1 / math.sqrt(400), rel=0.02)
    assert not wide.b.numpy().any()
    ln = LayerNorm.init(c=5)
    np.testing.assert_array_equal(ln.weight.numpy(), np.ones(5))
    np.testing.assert_array_equal(ln.bias.numpy(), np.zeros(5))
    again = Linear.init(seed=3, d_in=400, d_out=300)
    np.testing.assert_array_equal(wide.w.numpy(), again.w.numpy())
    m = _model()
    assert not np.array_equal(m.blocks[0].w_qkv.numpy(), m.blocks[1].w_qkv.numpy())


def test_per_field_initializer_and_errors() -> None:
    class Emb(Module):
        table: Float[Tensor, "v d"] = field(init=sg.nn.init.normal(std=0.02))

    table = Emb.init(seed=0, v=300, d=200).table.numpy()
    assert table.std() == pytest.approx(0.02, rel=0.02)
    with pytest.raises(ValueError, match="missing dim 'd'"):
        Emb.init(v=3)
    with pytest.raises(ValueError, match="unknown dim 'h'"):
        Emb.init(v=3, d=2, h=4)
    with pytest.raises(ValueError, match="length of list field 'blocks'"):
        TinyGPT.init(v=3, d=4)
    with pytest.raises(sg.ShapeError, match=r"Linear.b.*expected Float\[Tensor, 'd_out'\]"):
        Linear(w=np.ones((2, 3), np.float32), b=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="missing field 'b'"):
        Linear(w=np.ones((2, 3), np.float32))
    with pytest.raises(AttributeError, match="immutable"):
        _model().embed = sg.ones((7, 4))  # type: ignore[misc]


def test_replace_makes_a_validated_copy() -> None:
    lin = Linear.init(d_in=3, d_out=2)
    moved = lin.replace(b=sg.ones(2))
    assert moved.b.numpy().tolist() == [1.0, 1.0] and not lin.b.numpy().any()
    with pytest.raises(sg.ShapeError):
        lin.replace(b=sg.ones(3))


# --- eager and compiled gradients --------------------------------------------------------------


def test_eager_grad_matches_float64_finite_differences() -> None:
    model = _model("float64")
    ids, targets = _batch()
    grads = sg.grad(gpt_loss)(model, ids, targets)
    assert isinstance(grads, TinyGPT)
    rng = np.random.default_rng(5)
    leaves, td = tree.flatten(model)
    direction = [rng.normal(size=t.shape) for t in leaves]
    eps = 1e-6

    def at(sign: float) -> float:
        moved = tree.unflatten(td, [sg.tensor(t.numpy() + sign * eps * d) for t, d in zip(leaves, direction, strict=True)])
        return gpt_loss(moved, ids, targets).item()

    numeric = (at(1.0) - at(-1.0)) / (2 * eps)
    analytic = sum(float((g.numpy() * d).sum()) for g, d in zip(tree.flatten(grads)[0], direction, strict=True))
    assert analytic == pytest.approx(numeric, rel=1e-6)


@needs_c
def test_compiled_c_grad_matches_eager() -> None:
    model = _model("float64")
    ids, targets = _batch(1)
    value, grads = sg.compile(sg.value_and_grad(gpt_loss), backend="c")(model, ids, targets)
    assert isinstance(grads, TinyGPT)
    eager_value, eager_grads = sg.value_and_grad(gpt_loss)(model, ids, targets)
    assert value.item() == pytest.approx(eager_value.item(), rel=1e-12)
    for (name, g), e in zip(grads.named().items(), tree.flatten(eager_grads)[0], strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


# --- training and checkpoints ------------------------------------------------------------------


def _numpy_adam(model: TinyGPT, steps: int, lr: float) -> list[np.ndarray]:
    """Reference: eager sg.grad + Adam written out in NumPy (Kingma & Ba, bias-corrected)."""
    params = [t.numpy().astype(np.float64) for t in tree.flatten(model)[0]]
    td = tree.flatten(model)[1]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for t in range(1, steps + 1):
        ids, targets = _batch(t)
        current = tree.unflatten(td, [sg.tensor(p.astype(np.float32)) for p in params])
        grads = [g.numpy().astype(np.float64) for g in tree.flatten(sg.grad(gpt_loss)(current, ids, targets))[0]]
        for k, g in enumerate(grads):
            m[k] = 0.9 * m[k] + 0.1 * g
            v[k] = 0.999 * v[k] + 0.001 * g * g
            step = (m[k] / (1 - 0.9**t)) / (np.sqrt(v[k] / (1 - 0.999**t)) + 1e-8)
            params[k] = (params[k] - lr * step).astype(np.float32).astype(np.float64)
    return params


@needs_c
def test_scalar_trainer_with_adam_matches_a_numpy_adam() -> None:
    model = _model()
    trainer = sg.ScalarTrainer(gpt_loss, model, mode="compiled", backend="c", optimizer=sg.optim.Adam(lr=0.01))
    for t in range(1, 6):
        trainer.step(*_batch(t))
    trained = trainer.get_params()
    assert isinstance(trained, TinyGPT)
    for got, want in zip(tree.flatten(trained)[0], _numpy_adam(model, 5, 0.01), strict=True):
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-4, atol=2e-5)


@needs_c
def test_checkpoint_resume_is_bit_identical(tmp_path: Path) -> None:
    def trainer() -> sg.ScalarTrainer:
        return sg.ScalarTrainer(gpt_loss, _model(), mode="compiled", backend="c", optimizer=sg.optim.Adam(lr=0.01))

    straight = trainer()
    losses = [straight.step(*_batch(t)) for t in range(6)]
    first = trainer()
    for t in range(3):
        first.step(*_batch(t))
    path = first.save_checkpoint(tmp_path / "gpt.npz")
    stored = set(np.load(path).files)
    assert "params/blocks.1.up.w" in stored and "optimizer/m/blocks.0.ln1.weight" in stored
    resumed = trainer()
    resumed.load_checkpoint(path)
    resumed_losses = [resumed.step(*_batch(t)) for t in range(3, 6)]
    assert resumed_losses == losses[3:]
    for a, b in zip(tree.flatten(straight.get_params())[0], tree.flatten(resumed.get_params())[0], strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# --- ParamList: the flat form of the same mechanism -------------------------------------------


class Flat(sg.ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"], Float[Tensor, "h"], Float[Tensor, "h"]]):
    names = ("w1", "b1", "ln_g", "ln_b")


def test_paramlist_attribute_access_by_name() -> None:
    p = Flat.init(sg.nn.init.kaiming, seed=0, h=3)
    assert p.w1 is p[0] and p.ln_b is p[3]
    with pytest.raises(AttributeError, match="parameter names are"):
        p.w9  # noqa: B018


def test_paramlist_init_gives_norm_gains_ones_with_one_initializer() -> None:
    p = Flat.init(sg.nn.init.kaiming, seed=0, h=3)
    np.testing.assert_array_equal(p.ln_g.numpy(), np.ones(3))
    np.testing.assert_array_equal(p.ln_b.numpy(), np.zeros(3))
    np.testing.assert_array_equal(p.b1.numpy(), np.zeros(3))


def test_checkpoint_keys_inside_lists_keep_parameter_names(tmp_path: Path) -> None:
    params = {"blocks": [Flat.init(sg.nn.init.kaiming, seed=i, h=2) for i in range(2)]}
    path = sg.save_checkpoint(tmp_path / "c.npz", params)
    assert "params/blocks/1.ln_g" in np.load(path).files
    loaded = sg.load_checkpoint(path, params).params
    np.testing.assert_array_equal(loaded["blocks"][1].w1.numpy(), params["blocks"][1].w1.numpy())


def test_a_tensor_in_a_static_field_is_an_error_not_a_constant() -> None:
    class Biased(Module):
        w: Float[Tensor, "o i"]
        b: Tensor | None = None

    with pytest.raises(TypeError, match=r"Biased.b holds a tensor but is annotated"):
        Biased(w=np.ones((2, 2), np.float32), b=np.ones(2, np.float32))
    assert Biased(w=np.ones((2, 2), np.float32)).b is None


# --- a ParamList / BlockStack inside a Module is part of the model (issue 24, item 10) --------


class Affine(sg.ParamList[Float[Tensor, "d d"], Float[Tensor, "d"]]):
    names = ("w", "b")


class WithList(Module):
    scale: Float[Tensor, " d"]
    body: Affine


def _affine_loss(net: WithList, x: Any, y: Any) -> Tensor:
    r = (x @ net.body.w.T + net.body.b) * net.scale - y
    return (r * r).mean()


def _numpy_affine_grads(
    w: np.ndarray, b: np.ndarray, s: np.ndarray, x: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d/d(s, w, b) of mean(((x w^T + b) * s - y)^2), by hand."""
    z = x @ w.T + b
    dr = 2.0 * (z * s - y) / y.size
    dz = dr * s
    return (dr * z).sum(0), dz.T @ x, dz.sum(0)


def _with_list() -> WithList:
    rng = np.random.default_rng(3)
    body = Affine([rng.normal(size=(3, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)])
    return WithList(scale=rng.normal(size=3).astype(np.float32), body=body)


def test_a_paramlist_field_is_counted_flagged_and_named() -> None:
    net = _with_list()
    assert net.num_params() == 3 + 9 + 3  # the ParamList used to be left out (3)
    assert net.requires_grad == (True, True, True)
    assert list(net.named()) == ["scale", "body.w", "body.b"]
    assert len(tree.flatten(net)[0]) == 3
    frozen = net.replace(body=net.body.freeze("w"))
    assert frozen.requires_grad == (True, False, True) and frozen.num_params() == 6
    assert frozen.num_params(trainable_only=False) == 15
    assert "body: Affine" in net.summary() and "15 trainable parameters" in net.summary()


def test_sg_grad_of_a_paramlist_field_is_its_gradient_not_its_value() -> None:
    net = _with_list()
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    grads = sg.grad(_affine_loss)(net, sg.tensor(x), sg.tensor(y))
    want_s, want_w, want_b = _numpy_affine_grads(
        net.body.w.numpy(), net.body.b.numpy(), net.scale.numpy(), x, y
    )
    assert isinstance(grads.body, Affine)
    np.testing.assert_allclose(grads.body.w.numpy(), want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.body.b.numpy(), want_b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads.scale.numpy(), want_s, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "compiled-numpy", "compiled-c"])
def test_scalar_trainer_updates_a_paramlist_inside_a_module(mode: str) -> None:
    if mode == "compiled-c" and C_SKIP is not None:
        pytest.skip(C_SKIP)
    kwargs: dict[str, Any] = (
        {"mode": "eager"} if mode == "eager" else {"mode": "compiled", "backend": mode.split("-")[1]}
    )
    net = _with_list()
    lr = 0.1
    trainer = sg.ScalarTrainer(_affine_loss, net, optimizer=sg.optim.SGD(lr=lr), **kwargs)
    rng = np.random.default_rng(5)
    w, b, s = net.body.w.numpy().copy(), net.body.b.numpy().copy(), net.scale.numpy().copy()
    for _ in range(3):
        x, y = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)
        trainer.step(x, y)
        gs, gw, gb = _numpy_affine_grads(w, b, s, x, y)
        s, w, b = s - lr * gs, w - lr * gw, b - lr * gb
    trained = trainer.get_params()
    assert isinstance(trained, WithList) and isinstance(trained.body, Affine)
    assert not np.allclose(trained.body.w.numpy(), net.body.w.numpy())
    np.testing.assert_allclose(trained.body.w.numpy(), w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trained.body.b.numpy(), b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(trained.scale.numpy(), s, rtol=1e-4, atol=1e-5)


def test_init_builds_a_blockstack_field_with_roles_or_per_element_initializers() -> None:
    class Stacked(Module):
        embed: Float[Tensor, "v d"]
        stack: sg.nn.BlockStack
        tuned: sg.nn.BlockStack = field(init=sg.nn.transformer.block_init(0.02))

    net = Stacked.init(seed=0, v=5, d=4, layers=2, f=8)
    count = 5 * 4 + 2 * (2 * (4 + 4 + 12 * 4 + 12 + 16 + 4 + 4 + 4 + 32 + 8 + 32 + 4))
    assert net.num_params() == count
    assert net.stack.names == sg.nn.BlockStack.names
    assert net.stack.w_qkv.shape == (2, 12, 4)
    # rank >= 2 elements default to the weight role (std 1/sqrt(fan_in)); block_init gives
    # LayerNorm gains ones and biases zeros, per element
    np.testing.assert_array_equal(net.tuned.ln1_w.numpy(), 1.0)
    np.testing.assert_array_equal(net.tuned.b_qkv.numpy(), 0.0)
    again = Stacked.init(seed=0, v=5, d=4, layers=2, f=8)
    np.testing.assert_array_equal(again.stack.w_1.numpy(), net.stack.w_1.numpy())
    all_leaves = [t.numpy().ravel()[:4] for t in tree.flatten(net)[0] if t.numpy().std() > 0]
    assert len({tuple(v) for v in all_leaves}) == len(all_leaves)  # one seed per tensor
    with pytest.raises(ValueError, match="2 initializers for 12 elements"):

        class Bad(Module):
            stack: sg.nn.BlockStack = field(init=[sg.nn.init.zeros, sg.nn.init.ones])

        Bad.init(seed=0, d=4, layers=2, f=8)


def test_a_static_field_hiding_tensors_in_a_container_is_an_error() -> None:
    class Hidden(Module):
        w: Float[Tensor, "o i"]
        extra: tuple[Any, ...] = ()

    with pytest.raises(TypeError, match=r"Hidden.extra holds a tensor .*\(at extra\[1\]\)"):
        Hidden(w=np.ones((2, 2), np.float32), extra=(1.0, sg.ones(2)))
    assert Hidden(w=np.ones((2, 2), np.float32), extra=(1, "relu")).extra == (1, "relu")


def test_a_paramlist_field_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    net = _with_list()
    path = sg.save_checkpoint(tmp_path / "net.npz", net)
    assert {"params/body.w", "params/body.b", "params/scale"} <= set(np.load(path).files)
    loaded = sg.load_checkpoint(path, WithList(scale=np.zeros(3, np.float32), body=Affine([np.zeros((3, 3), np.float32), np.zeros(3, np.float32)]))).params
    assert isinstance(loaded.body, Affine) and loaded.body.names == ("w", "b")
    np.testing.assert_array_equal(loaded.body.w.numpy(), net.body.w.numpy())
