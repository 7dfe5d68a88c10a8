"""Attention and transformer blocks vs PyTorch (values and gradients), eager / numpy / C."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad.nn.attention import (
    AttentionParams,
    attention_init,
    multi_head_attention,
    scaled_dot_product_attention,
)
from shapegrad.nn.transformer import (
    BlockParams,
    BlockStack,
    block_init,
    embed,
    transformer_block,
    transformer_stack,
)

torch = pytest.importorskip("torch", reason="PyTorch is the reference for attention")

MODE_NAMES = ["eager", "numpy", "c"]
TOL = {"float64": 1e-10, "float32": 2e-4}


def _mode(name: str) -> Any:
    runner = MODES[name]
    reason = runner.unavailable()
    if reason:
        pytest.skip(reason)
    return runner


def _close(a: np.ndarray, b: np.ndarray, dtype: str) -> None:
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(a, b, rtol=TOL[dtype], atol=TOL[dtype] * scale)


def _t(a: np.ndarray) -> Any:
    return torch.tensor(a, requires_grad=a.dtype.kind == "f")


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_sdpa_matches_torch(mode: str, dtype: str, masking: str) -> None:
    runner = _mode(mode)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, 5, 4)).astype(dtype) for _ in range(3))
    cot = rng.normal(size=(2, 3, 5, 4)).astype(dtype)
    keep = np.ones((2, 1, 1, 5), dtype=bool)
    keep[1, :, :, 3:] = False  # the second sequence has 3 valid keys

    def fn(q: sg.Tensor, k: sg.Tensor, v: sg.Tensor, *rest: sg.Tensor) -> sg.Tensor:
        mask = rest[0] if masking == "padding" else None
        return scaled_dot_product_attention(q, k, v, mask=mask, causal=masking == "causal")

    extra = [keep] if masking == "padding" else []
    (out,) = runner.call(fn, [q, k, v, *extra])
    tq, tk, tv = _t(q), _t(k), _t(v)
    ref = torch.nn.functional.scaled_dot_product_attention(
        tq,
        tk,
        tv,
        attn_mask=torch.tensor(keep) if masking == "padding" else None,
        is_causal=masking == "causal",
    )
    _close(out, ref.detach().numpy(), dtype)

    def loss(q: sg.Tensor, k: sg.Tensor, v: sg.Tensor, c: sg.Tensor, *rest: sg.Tensor) -> sg.Tensor:
        return (fn(q, k, v, *rest) * c).sum()

    grads = runner.grad(loss, [q, k, v, cot, *extra], (0, 1, 2))
    (ref * torch.tensor(cot)).sum().backward()
    for g, t in zip(grads, (tq, tk, tv), strict=True):
        _close(g, t.grad.numpy(), dtype)


def _torch_layer(params: Any, d: int, heads: int, f: int, dtype: str) -> Any:
    layer = torch.nn.TransformerEncoderLayer(
        d,
        heads,
        f,
        dropout=0.0,
        activation=lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
        batch_first=True,
        norm_first=True,
        dtype=getattr(torch, dtype),
    )
    named = dict(zip(BlockParams.names, (np.asarray(t.numpy()) for t in params), strict=True))
    pairs = [
        (layer.norm1.weight, "ln1_w"),
        (layer.norm1.bias, "ln1_b"),
        (layer.self_attn.in_proj_weight, "w_qkv"),
        (layer.self_attn.in_proj_bias, "b_qkv"),
        (layer.self_attn.out_proj.weight, "w_o"),
        (layer.self_attn.out_proj.bias, "b_o"),
        (layer.norm2.weight, "ln2_w"),
        (layer.norm2.bias, "ln2_b"),
        (layer.linear1.weight, "w_1"),
        (layer.linear1.bias, "b_1"),
        (layer.linear2.weight, "w_2"),
        (layer.linear2.bias, "b_2"),
    ]
    with torch.no_grad():
        for tensor, name in pairs:
            tensor.copy_(torch.tensor(named[name]))
    return layer, [t for t, _ in pairs]


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masking", ["causal", "padding"])
def test_transformer_block_matches_torch(mode: str, dtype: str, masking: str) -> None:
    runner = _mode(mode)
    d, heads, f, b, t = 8, 2, 16, 2, 5
    params = BlockParams.init(block_init(0.3), seed=1, d=d, f=f, dtype=dtype)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(b, t, d)).astype(dtype)
    cot = rng.normal(size=(b, t, d)).astype(dtype)
    valid = np.ones((b, t), dtype=bool)
    valid[0, 4:] = False
    keep = valid[:, None, None, :]
    arrays = [np.asarray(p.numpy()) for p in params]

    def fn(x: sg.Tensor, *rest: sg.Tensor) -> sg.Tensor:
        if masking == "padding":
            return transformer_block(rest[1:], x, heads, mask=rest[0])
        return transformer_block(rest, x, heads, causal=True)

    extra = [keep] if masking == "padding" else []
    (out,) = runner.call(fn, [x, *extra, *arrays])
    layer, tparams = _torch_layer(params, d, heads, f, dtype)
    tx = _t(x)
    if masking == "padding":
        ref = layer(tx, src_key_padding_mask=torch.tensor(~valid))
    else:
        causal = torch.nn.Transformer.generate_square_subsequent_mask(
            t, dtype=getattr(torch, dtype)
        )
        ref = layer(tx, src_mask=causal, is_causal=True)
    _close(out, ref.detach().numpy(), dtype)

    def loss(x: sg.Tensor, c: sg.Tensor, *rest: sg.Tensor) -> sg.Tensor:
        return (fn(x, *rest) * c).sum()

    first = 3 if masking == "padding" else 2
    grads = runner.grad(loss, [x, cot, *extra, *arrays], (0, *range(first, first + 12)))
    (ref * torch.tensor(cot)).sum().backward()
    for g, tp in zip(grads, [tx, *tparams], strict=True):
        _close(g, tp.grad.numpy(), dtype)


@pytest.mark.parametrize("mode", ["eager", "c"])
def test_multi_head_attention_matches_torch(mode: str) -> None:
    runner = _mode(mode)
    d, heads = 12, 3
    params = AttentionParams.init(attention_init(0.3), seed=3, d=d, dtype="float64")
    x = np.random.default_rng(4).normal(size=(2, 6, d))
    (out,) = runner.call(
        lambda x, *ps: multi_head_attention(ps, x, heads), [x, *(p.numpy() for p in params)]
    )
    mha = torch.nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.tensor(params[0].numpy()))
        mha.in_proj_bias.copy_(torch.tensor(params[1].numpy()))
        mha.out_proj.weight.copy_(torch.tensor(params[2].numpy()))
        mha.out_proj.bias.copy_(torch.tensor(params[3].numpy()))
    tx = torch.tensor(x)
    ref, _ = mha(tx, tx, tx, need_weights=False)
    _close(out, ref.detach().numpy(), "float64")


def test_fully_masked_row_is_finite_and_uniform() -> None:
    q = sg.tensor(np.ones((1, 2, 3)))
    k = sg.tensor(np.ones((1, 3, 3)))
    v = sg.tensor(np.arange(6.0).reshape(1, 3, 2))
    mask = sg.tensor(np.zeros((1, 2, 3), dtype=bool))
    out = scaled_dot_product_attention(q, k, v, mask=mask).numpy()
    np.testing.assert_allclose(out, np.broadcast_to(v.numpy().mean(axis=1), (1, 2, 2)))


def test_shape_errors_name_the_op() -> None:
    q = sg.tensor(np.ones((2, 3, 4)))
    with pytest.raises(sg.ShapeError, match="scaled_dot_product_attention"):
        scaled_dot_product_attention(q, sg.tensor(np.ones((2, 3, 5))), q)
    with pytest.raises(sg.ShapeError, match="split_heads"):
        multi_head_attention(
            AttentionParams.init(attention_init(), d=6),
            sg.tensor(np.ones((1, 2, 6)), "float32"),
            heads=4,
        )
    with pytest.raises(sg.ShapeError, match="embed"):
        embed(
            sg.tensor(np.ones((5, 4))),
            sg.tensor(np.ones((3, 4))),
            sg.tensor(np.zeros((1, 4), "int32")),
        )


def test_embed_adds_positions() -> None:
    tok = np.arange(20.0).reshape(5, 4)
    pos = np.arange(12.0).reshape(3, 4) * 100
    ids = np.array([[4, 0], [1, 1]], dtype=np.int32)
    out = embed(sg.tensor(tok), sg.tensor(pos), sg.tensor(ids)).numpy()
    np.testing.assert_allclose(out, tok[ids] + pos[:2])


@pytest.mark.parametrize("loop", [False, True])
def test_transformer_stack_equals_blocks_in_sequence(loop: bool) -> None:
    stack = BlockStack.init(block_init(0.2), seed=5, layers=3, d=8, f=16, dtype="float64")
    x = sg.tensor(np.random.default_rng(6).normal(size=(2, 4, 8)))
    out = transformer_stack(stack, x, heads=2, causal=True, loop=loop).numpy()
    h = x
    for i in range(3):
        h = transformer_block([t[i] for t in stack], h, 2, causal=True)
    np.testing.assert_allclose(out, h.numpy(), rtol=0, atol=1e-12)
    assert math.isfinite(float(out.sum()))
