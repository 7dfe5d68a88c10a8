"""Attention's products on head views, read and written in place (``compiler/contract.py``'s
two-level batches, ``products.permute_product_outputs``, ``fusion.py``'s viewed operands):
no copy kernel splits or merges heads, and values match NumPy in float64."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import C_TARGET, CUDA_TARGET, Target
from shapegrad.ir import Graph
from shapegrad.nn.attention import merge_heads, split_heads

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

B, T, H, D = 2, 8, 4, 16


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _graph(fn, *args) -> Graph:  # type: ignore[no-untyped-def]
    return sg.compile(fn, backend="numpy").graph(*args)


def _program(graph: Graph, target: Target = C_TARGET) -> L.Program:
    return lower_program(graph, target.replace(contract_min_macs=1), "t")[0]


def _contracts(program: L.Program) -> list[L.Contract]:
    return [s for k in program.kernels for s in L.walk(k.body) if isinstance(s, L.Contract)]


def _copy_kernels(program: L.Program) -> list[str]:
    """Kernels whose every store is a plain load of another buffer (a layout copy)."""
    out = []
    for k in program.kernels:
        stores = [s for s in L.walk(k.body) if isinstance(s, L.Store)]
        if stores and all(isinstance(s.value, L.Load) for s in stores):
            out.append(k.name)
    return out


def _heads(x: sg.Tensor, bias: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
    qkv = x + bias
    d = H * D
    return tuple(split_heads(qkv[:, :, i * d : (i + 1) * d], H) for i in range(3))  # type: ignore[return-value]


def _attention(x: sg.Tensor, bias: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
    q, k, v = _heads(x, bias)
    weights = sg.softmax(sg.einsum("bhqd,bhkd->bhqk", q, k) * 0.25, axis=-1)
    return merge_heads(sg.einsum("bhqk,bhkd->bhqd", weights, v)) @ w


def _attention_np(x: np.ndarray, bias: np.ndarray, w: np.ndarray) -> np.ndarray:
    qkv = (x.astype(np.float64) + bias).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
    q, k, v = qkv
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * 0.25
    e = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), v)
    return o.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ w


def _args() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return _f32(B, T, 3 * H * D), _f32(3 * H * D, seed=1), _f32(H * D, 24, seed=2)


def test_head_view_products_read_and_write_in_place() -> None:
    x, bias, w = _args()
    program = _program(_graph(_attention, sg.tensor(x), sg.tensor(bias), sg.tensor(w)))
    heads = [c for c in _contracts(program) if c.batch == B * H]
    assert len(heads) == 2
    assert all(c.inner == H for c in heads)  # batch (b, h): two strides, no copy
    scores, out = heads
    assert scores.a == scores.b and scores.lda == 3 * H * D  # q and k: views of one buffer
    assert out.row_c == H * D  # heads merged as written: rows H*D apart
    assert not _copy_kernels(program)
    assert not [b for b in program.buffers if b.startswith("pack")]


def test_cuda_target_keeps_one_stride_per_batch() -> None:
    x, bias, w = _args()
    program = _program(_graph(_attention, sg.tensor(x), sg.tensor(bias), sg.tensor(w)), CUDA_TARGET)
    assert all(c.plain_batch for c in _contracts(program))


@needs_cc
def test_head_view_attention_matches_numpy() -> None:
    x, bias, w = _args()
    out = sg.compile(_attention, backend="c", contract_min=1)(
        sg.tensor(x), sg.tensor(bias), sg.tensor(w)
    ).numpy()
    np.testing.assert_allclose(out, _attention_np(x, bias, w), rtol=1e-4, atol=1e-5)


@needs_cc
def test_head_view_attention_gradients_match_the_reference() -> None:
    x, bias, w = _args()

    def loss(x: sg.Tensor, bias: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
        return (_attention(x, bias, w) ** 2).sum()

    args = (sg.tensor(x), sg.tensor(bias), sg.tensor(w))
    grad = sg.grad(loss, argnums=(0, 1, 2))
    got = sg.compile(grad, backend="c", contract_min=1)(*args)
    program = _program(_graph(grad, *args))
    assert sum(c.inner == H for c in _contracts(program)) >= 6  # forward and backward
    assert not [b for b in program.buffers if b.startswith("pack")]
    # float64 central differences of the NumPy forward, on a few elements of each input
    rng = np.random.default_rng(3)
    for g, name in zip(got, "xbw", strict=True):
        base = {"x": x, "b": bias, "w": w}
        flat = base[name].reshape(-1)
        for i in rng.choice(flat.size, 4, replace=False):
            hi, lo = ({k: v.astype(np.float64).copy() for k, v in base.items()} for _ in range(2))
            hi[name].reshape(-1)[i] += 1e-5
            lo[name].reshape(-1)[i] -= 1e-5
            fd = ((_attention_np(hi["x"], hi["b"], hi["w"]) ** 2).sum()
                  - (_attention_np(lo["x"], lo["b"], lo["w"]) ** 2).sum()) / 2e-5  # fmt: skip
            np.testing.assert_allclose(g.numpy().reshape(-1)[i], fd, rtol=2e-3, atol=2e-3)


@needs_cc
def test_product_writing_a_merged_layout_matches_numpy() -> None:
    # [b, h, t, k] @ [b, h, k, d] -> [b, t, h, d]: a batch letter between rows and columns
    p, v = _f32(2, 3, 4, 4), _f32(2, 3, 4, 5, seed=1)

    def fn(p: sg.Tensor, v: sg.Tensor) -> sg.Tensor:
        return (p @ v).transpose((0, 2, 1, 3)) * 2.0

    program = _program(_graph(fn, sg.tensor(p), sg.tensor(v)))
    (c,) = _contracts(program)
    assert (c.batch, c.inner, c.row_c) == (6, 3, 15)
    out = sg.compile(fn, backend="c", contract_min=1)(sg.tensor(p), sg.tensor(v)).numpy()
    ref = (p.astype(np.float64) @ v).transpose(0, 2, 1, 3) * 2.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
