"""The layers a user reaches for first (issue 25) against PyTorch: Conv2d, Embedding, RMSNorm,
MultiheadAttention, LSTMCell/GRUCell and the scanned LSTM/GRU sequence layers.

Each test copies a torch module's float64 weights into ours and compares the output and the
gradients of ``sum(y * ct)`` with respect to every parameter and the input, eagerly and
compiled with the C backend. Dropout, which PyTorch draws from its own generator, is checked
against the functional ``sg.dropout`` it wraps and against its defining properties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import _c_unavailable
from shapegrad.nn import (
    GRU,
    LSTM,
    Conv2d,
    Dropout,
    Embedding,
    GRUCell,
    LSTMCell,
    MultiheadAttention,
    RMSNorm,
)

torch = pytest.importorskip("torch", reason="PyTorch is the reference for the nn layers")

C_SKIP = _c_unavailable()
MODES = [
    pytest.param("eager", id="eager"),
    pytest.param("c", id="c", marks=pytest.mark.skipif(C_SKIP is not None, reason=C_SKIP or "")),
]
RTOL, ATOL = 1e-10, 1e-12


def _maybe_compiled(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    return fn if mode == "eager" else sg.compile(fn, backend="c")


def _from_torch(cls: type[Any], ref: Any, **renames: str) -> Any:
    """``cls`` built from a torch module's float64 parameters (``ours=torch_name``)."""
    named = dict(ref.named_parameters())
    return cls(**{ours: named[theirs].detach().numpy().copy() for ours, theirs in renames.items()})


def _value_and_grads(module: Any, inputs: tuple[Any, ...], ct: Any, call: Callable[..., Any]) -> Any:
    """``(y, d module, d inputs...)`` of ``sum(call(module, *inputs)[0] * ct)``."""

    def objective(m: Any, *args: Any) -> Any:
        y = call(m, *args)
        return (y * ct).sum(), y

    argnums = tuple(range(len(inputs) + 1))
    (_, y), grads = sg.value_and_grad(objective, argnums=argnums, has_aux=True)(module, *inputs)
    return y, grads


def _torch_grads(ref: Any, y: Any, ct: np.ndarray, inputs: list[Any]) -> dict[str, np.ndarray]:
    (y * torch.from_numpy(ct)).sum().backward()
    grads = {name: p.grad.numpy() for name, p in ref.named_parameters()}
    grads.update({f"input{i}": t.grad.numpy() for i, t in enumerate(inputs)})
    return grads


def _close(ours: Any, theirs: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> None:
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=rtol, atol=atol)


def _leaf(x: np.ndarray) -> Any:
    return torch.from_numpy(x).requires_grad_(True)


# --- Conv2d ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_conv2d_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(0)
    ref = torch.nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0)).double()
    conv = _from_torch(Conv2d, ref, weight="weight", bias="bias").replace(stride=(2, 1), padding=(1, 0))
    x = rng.normal(size=(2, 3, 7, 6))
    tx = _leaf(x)
    ty = ref(tx)
    ct = rng.normal(size=tuple(ty.shape))
    expected = _torch_grads(ref, ty, ct, [tx])
    step = _maybe_compiled(lambda m, v, c: _value_and_grads(m, (v,), c, lambda m, v: m(v)), mode)
    y, (g_conv, g_x) = step(conv, sg.tensor(x), sg.tensor(ct))
    _close(y.numpy(), ty.detach().numpy())
    _close(g_conv.weight.numpy(), expected["weight"])
    _close(g_conv.bias.numpy(), expected["bias"])
    _close(g_x.numpy(), expected["input0"])


def test_conv2d_init_shapes_and_fan_in() -> None:
    conv = Conv2d.init(seed=0, c_in=8, c_out=16, kh=3, kw=3, dtype="float64")
    assert conv.weight.shape == (16, 8, 3, 3) and conv.bias.shape == (16,)
    assert conv.num_params() == torch.nn.Conv2d(8, 16, 3).weight.numel() + 16
    assert abs(conv.weight.numpy().std() - 1 / np.sqrt(8 * 9)) < 0.02  # LeCun normal over c_in*kh*kw
    assert not conv.bias.numpy().any()
    with pytest.raises(sg.ShapeError, match="conv2d"):
        conv(sg.ones((1, 3, 5, 5), dtype="float64"))  # 3 channels for an 8-channel layer


# --- Embedding --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_embedding_matches_torch_with_repeated_ids(mode: str) -> None:
    rng = np.random.default_rng(1)
    ref = torch.nn.Embedding(7, 5).double()
    emb = _from_torch(Embedding, ref, weight="weight")
    ids = np.array([[0, 3, 3], [6, 0, 3]])  # repeats: their gradients accumulate
    ty = ref(torch.from_numpy(ids))
    ct = rng.normal(size=tuple(ty.shape))
    expected = _torch_grads(ref, ty, ct, [])
    step = _maybe_compiled(lambda m, i, c: _value_and_grads(m, (), c, lambda m: m(i)), mode)
    y, (g_emb,) = step(emb, sg.tensor(ids.astype(np.int32)), sg.tensor(ct))
    _close(y.numpy(), ty.detach().numpy())
    _close(g_emb.weight.numpy(), expected["weight"])


def test_embedding_init_is_standard_normal_and_checks_ids() -> None:
    emb = Embedding.init(seed=3, v=400, d=50, dtype="float64")
    table = emb.weight.numpy()
    assert table.shape == (400, 50)
    assert abs(table.std() - 1.0) < 0.02 and abs(table.mean()) < 0.02  # PyTorch's N(0, 1)
    with pytest.raises(IndexError, match=r"index out of range \[-400, 400\)"):
        emb(sg.tensor(np.array([400], np.int32)))


# --- Dropout ------------------------------------------------------------------------------------


def test_dropout_module_is_the_functional_dropout_with_its_probability() -> None:
    x = sg.tensor(np.random.default_rng(2).normal(size=(64, 32)))
    key = sg.random.key(5)
    drop = Dropout(p=0.25)
    np.testing.assert_array_equal(drop(x, key).numpy(), sg.dropout(x, 0.25, key).numpy())
    assert drop(x, key, training=False) is x
    y = drop(x, key).numpy()
    kept = y != 0
    assert 0.70 < kept.mean() < 0.80  # about 1 - p of 2048 elements survive
    np.testing.assert_allclose(y[kept], x.numpy()[kept] / 0.75, rtol=1e-15)
    # the gradient is the same mask and scale (a closed form: d(sum y)/dx = kept / (1 - p))
    g = sg.grad(lambda v: drop(v, key).sum())(x)
    np.testing.assert_allclose(g.numpy(), kept / 0.75, rtol=1e-15)
    assert Dropout.init().p == 0.5 and drop.replace(p=0.0)(x, key) is x
    with pytest.raises(ValueError, match=r"Dropout: p must be a probability in \[0, 1\], got 1.5"):
        Dropout(p=1.5)


@pytest.mark.skipif(C_SKIP is not None, reason=C_SKIP or "")
def test_dropout_compiled_with_a_traced_key_draws_a_new_mask_per_key() -> None:
    x = sg.ones((16, 16), dtype="float64")
    step = sg.compile(lambda m, v, k: m(v, k), backend="c")
    first = step(Dropout(p=0.5), x, sg.random.key(0)).numpy()
    second = step(Dropout(p=0.5), x, sg.random.key(1)).numpy()
    np.testing.assert_array_equal(first, sg.dropout(x, 0.5, sg.random.key(0)).numpy())
    assert (first != second).any()
    assert set(np.unique(first)) <= {0.0, 2.0}


def test_dropout_inside_a_module_trains_with_the_trainers_key() -> None:
    class Net(sg.nn.Module):
        lin: sg.nn.Linear
        drop: Dropout

        def __call__(self, x: sg.Tensor, key: sg.Tensor) -> sg.Tensor:
            return self.drop(self.lin(x), key)

    net = Net.init(seed=0, d_in=4, d_out=3).replace(drop=Dropout(p=0.2))
    assert net.num_params() == 15 and "p = 0.2" in net.summary()

    def loss(m: Net, x: sg.Tensor, y: sg.Tensor, *, key: sg.Tensor) -> sg.Tensor:
        return sg.mse(m(x, key), y)

    trainer = sg.ScalarTrainer(loss, net, optimizer=sg.optim.SGD(lr=0.1))
    x, y = np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32)
    losses = [trainer.step(x, y) for _ in range(5)]
    assert losses[-1] < 0.5 * losses[0]
    assert trainer.get_params().drop.p == 0.2  # a static setting, not a trained leaf


# --- RMSNorm --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_matches_torch(mode: str, eps: float | None) -> None:
    rng = np.random.default_rng(3)
    ref = torch.nn.RMSNorm(6, eps=eps).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(rng.normal(size=6)))
    norm = _from_torch(RMSNorm, ref, weight="weight").replace(eps=eps)
    x = rng.normal(size=(2, 3, 6)) * 0.01  # small values: eps matters
    tx = _leaf(x)
    ty = ref(tx)
    ct = rng.normal(size=x.shape)
    expected = _torch_grads(ref, ty, ct, [tx])
    step = _maybe_compiled(lambda m, v, c: _value_and_grads(m, (v,), c, lambda m, v: m(v)), mode)
    y, (g_norm, g_x) = step(norm, sg.tensor(x), sg.tensor(ct))
    _close(y.numpy(), ty.detach().numpy())
    _close(g_norm.weight.numpy(), expected["weight"])
    _close(g_x.numpy(), expected["input0"], rtol=1e-9)


def test_rms_norm_errors_name_the_shapes() -> None:
    norm = RMSNorm.init(c=4)
    with pytest.raises(sg.ShapeError, match=r"rms_norm.*weight \[4\] should be \[5\]"):
        norm(sg.ones((2, 5)))


# --- MultiheadAttention -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_multihead_attention_matches_torch_with_a_causal_mask(mode: str) -> None:
    rng = np.random.default_rng(4)
    d, heads, t = 8, 2, 5
    ref = torch.nn.MultiheadAttention(d, heads, batch_first=True).double()
    with torch.no_grad():  # non-zero biases, so their gradients are tested too
        ref.in_proj_bias.copy_(torch.from_numpy(rng.normal(size=3 * d)))
        ref.out_proj.bias.copy_(torch.from_numpy(rng.normal(size=d)))
    attn = _from_torch(
        MultiheadAttention,
        ref,
        in_proj_weight="in_proj_weight",
        in_proj_bias="in_proj_bias",
        out_proj_weight="out_proj.weight",
        out_proj_bias="out_proj.bias",
    ).replace(heads=heads)
    x = rng.normal(size=(2, t, d))
    tx = _leaf(x)
    blocked = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)  # torch: True = may NOT attend
    ty, _ = ref(tx, tx, tx, attn_mask=blocked, need_weights=False)
    ct = rng.normal(size=x.shape)
    expected = _torch_grads(ref, ty, ct, [tx])
    step = _maybe_compiled(
        lambda m, v, c: _value_and_grads(m, (v,), c, lambda m, v: m(v, causal=True)), mode
    )
    y, (g_attn, g_x) = step(attn, sg.tensor(x), sg.tensor(ct))
    _close(y.numpy(), ty.detach().numpy(), rtol=1e-9)
    _close(g_attn.in_proj_weight.numpy(), expected["in_proj_weight"], rtol=1e-9, atol=1e-11)
    _close(g_attn.in_proj_bias.numpy(), expected["in_proj_bias"], rtol=1e-9, atol=1e-11)
    _close(g_attn.out_proj_weight.numpy(), expected["out_proj.weight"], rtol=1e-9, atol=1e-11)
    _close(g_attn.out_proj_bias.numpy(), expected["out_proj.bias"], rtol=1e-9, atol=1e-11)
    _close(g_x.numpy(), expected["input0"], rtol=1e-9, atol=1e-11)


def test_multihead_attention_heads_must_divide_d() -> None:
    attn = MultiheadAttention.init(seed=0, d=6)
    assert attn.in_proj_weight.shape == (18, 6) and attn.in_proj_bias.shape == (18,)
    with pytest.raises(sg.ShapeError, match="heads must be a positive divisor of d = 6, got 4"):
        attn.replace(heads=4)(sg.ones((1, 2, 6)))


# --- recurrent cells ------------------------------------------------------------------------------

_CELL_NAMES = {n: n for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}



@pytest.mark.parametrize("mode", MODES)
def test_lstm_cell_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(5)
    ref = torch.nn.LSTMCell(3, 4).double()
    cell = _from_torch(LSTMCell, ref, **_CELL_NAMES)
    x, h, c = rng.normal(size=(2, 3)), rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
    tx, th, tc = _leaf(x), _leaf(h), _leaf(c)
    t_h, t_c = ref(tx, (th, tc))
    ct_h, ct_c = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
    ((t_h * torch.from_numpy(ct_h)).sum() + (t_c * torch.from_numpy(ct_c)).sum()).backward()

    def objective(m: LSTMCell, v: Any, h0: Any, c0: Any, a: Any, b: Any) -> Any:
        h1, c1 = m(v, (h0, c0))
        return (h1 * a).sum() + (c1 * b).sum(), (h1, c1)

    step = _maybe_compiled(sg.value_and_grad(objective, argnums=(0, 1, 2, 3), has_aux=True), mode)
    (_, (h1, c1)), (g_cell, g_x, g_h, g_c) = step(
        cell, *(sg.tensor(a) for a in (x, h, c, ct_h, ct_c))
    )
    _close(h1.numpy(), t_h.detach().numpy())
    _close(c1.numpy(), t_c.detach().numpy())
    for name in _CELL_NAMES:
        _close(getattr(g_cell, name).numpy(), getattr(ref, name).grad.numpy())
    for ours, theirs in ((g_x, tx), (g_h, th), (g_c, tc)):
        _close(ours.numpy(), theirs.grad.numpy())


@pytest.mark.parametrize("mode", MODES)
def test_gru_cell_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(6)
    ref = torch.nn.GRUCell(3, 4).double()
    cell = _from_torch(GRUCell, ref, **_CELL_NAMES)
    x, h = rng.normal(size=(2, 3)), rng.normal(size=(2, 4))
    tx, th = _leaf(x), _leaf(h)
    ty = ref(tx, th)
    ct = rng.normal(size=(2, 4))
    expected = _torch_grads(ref, ty, ct, [tx, th])
    step = _maybe_compiled(lambda m, v, h0, c: _value_and_grads(m, (v, h0), c, lambda m, v, h0: m(v, h0)), mode)
    y, (g_cell, g_x, g_h) = step(cell, sg.tensor(x), sg.tensor(h), sg.tensor(ct))
    _close(y.numpy(), ty.detach().numpy())
    for name in _CELL_NAMES:
        _close(getattr(g_cell, name).numpy(), expected[name])
    _close(g_x.numpy(), expected["input0"])
    _close(g_h.numpy(), expected["input1"])


def test_cells_default_to_a_zero_state_and_check_shapes() -> None:
    ref = torch.nn.LSTMCell(3, 4).double()
    cell = _from_torch(LSTMCell, ref, **_CELL_NAMES)
    x = np.random.default_rng(7).normal(size=(2, 3))
    h, c = cell(sg.tensor(x))
    t_h, t_c = ref(torch.from_numpy(x))
    _close(h.numpy(), t_h.detach().numpy())
    _close(c.numpy(), t_c.detach().numpy())
    with pytest.raises(sg.ShapeError, match=r"LSTMCell.*c must be \[2, 4\], got \[2, 5\]"):
        cell(sg.tensor(x), (sg.tensor(np.zeros((2, 4))), sg.tensor(np.zeros((2, 5)))))
    with pytest.raises(sg.ShapeError, match=r"GRUCell.*input must be \[batch, 3\], got \[2, 4\]"):
        GRUCell.init(d=3, h=4)(sg.ones((2, 4)))
    assert cell.num_params() == sum(p.numel() for p in ref.parameters())


# --- scanned sequence layers -----------------------------------------------------------------------


def _sequence_ref(kind: str) -> tuple[Any, Any]:
    torch_cls, ours = (torch.nn.LSTM, LSTM) if kind == "lstm" else (torch.nn.GRU, GRU)
    ref = torch_cls(3, 4, batch_first=True).double()
    cell_cls = LSTMCell if kind == "lstm" else GRUCell
    cell = cell_cls(**{n: getattr(ref, f"{n}_l0").detach().numpy().copy() for n in _CELL_NAMES})
    return ref, ours(cell=cell)


@pytest.mark.parametrize("mode", MODES)
def test_lstm_over_a_sequence_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(8)
    ref, lstm = _sequence_ref("lstm")
    b, t = 2, 6
    x, h0, c0 = rng.normal(size=(b, t, 3)), rng.normal(size=(b, 4)), rng.normal(size=(b, 4))
    tx, th, tc = _leaf(x), _leaf(h0), _leaf(c0)
    t_ys, (t_h, t_c) = ref(tx, (th[None], tc[None]))
    cts = [rng.normal(size=s) for s in ((b, t, 4), (b, 4), (b, 4))]
    sum(
        (o * torch.from_numpy(ct)).sum() for o, ct in zip((t_ys, t_h[0], t_c[0]), cts, strict=True)
    ).backward()

    def objective(m: LSTM, v: Any, h: Any, c: Any, a: Any, bb: Any, cc: Any) -> Any:
        ys, (hn, cn) = m(v, (h, c))
        return (ys * a).sum() + (hn * bb).sum() + (cn * cc).sum(), (ys, hn, cn)

    step = _maybe_compiled(sg.value_and_grad(objective, argnums=(0, 1, 2, 3), has_aux=True), mode)
    (_, (ys, hn, cn)), (g_lstm, g_x, g_h, g_c) = step(
        lstm, *(sg.tensor(a) for a in (x, h0, c0, *cts))
    )
    _close(ys.numpy(), t_ys.detach().numpy())
    _close(hn.numpy(), t_h[0].detach().numpy())
    _close(cn.numpy(), t_c[0].detach().numpy())
    for name in _CELL_NAMES:
        _close(getattr(g_lstm.cell, name).numpy(), getattr(ref, f"{name}_l0").grad.numpy())
    for ours, theirs in ((g_x, tx), (g_h, th), (g_c, tc)):
        _close(ours.numpy(), theirs.grad.numpy())


@pytest.mark.parametrize("mode", MODES)
def test_gru_over_a_sequence_matches_torch(mode: str) -> None:
    rng = np.random.default_rng(9)
    ref, gru = _sequence_ref("gru")
    x = rng.normal(size=(3, 5, 3))
    tx = _leaf(x)
    t_ys, t_h = ref(tx)  # zero initial state on both sides
    ct = rng.normal(size=(3, 5, 4))
    expected = _torch_grads(ref, t_ys, ct, [tx])
    step = _maybe_compiled(lambda m, v, c: _value_and_grads(m, (v,), c, lambda m, v: m(v)[0]), mode)
    ys, (g_gru, g_x) = step(gru, sg.tensor(x), sg.tensor(ct))
    _close(ys.numpy(), t_ys.detach().numpy())
    _close(gru(sg.tensor(x))[1].numpy(), t_h[0].detach().numpy())
    for name in _CELL_NAMES:
        _close(getattr(g_gru.cell, name).numpy(), expected[f"{name}_l0"])
    _close(g_x.numpy(), expected["input0"])


def test_sequence_layers_init_and_errors() -> None:
    lstm = LSTM.init(seed=0, d=3, h=5)
    assert set(lstm.named()) == {f"cell.{n}" for n in _CELL_NAMES}
    assert lstm.cell.weight_ih.shape == (20, 3) and lstm.cell.weight_hh.shape == (20, 5)
    assert GRU.init(seed=0, d=3, h=5).cell.bias_hh.shape == (15,)
    with pytest.raises(sg.ShapeError, match=r"LSTM.*batch-first \[batch, time, 3\], got \[2, 4\]"):
        lstm(sg.ones((2, 4)))
    with pytest.raises(sg.ShapeError, match=r"GRU.*h0 must be \[2, 5\], got \[1, 5\]"):
        GRU.init(d=3, h=5)(sg.ones((2, 4, 3)), sg.ones((1, 5)))
