"""PyTorch habits on Tensor and the functional ops (issue 25): PyTorch's spellings work where
they mean what NumPy's do (compared with PyTorch itself), and where PyTorch means something
else the error names the shapegrad spelling."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg

torch = pytest.importorskip("torch", reason="PyTorch is the reference for its own spellings")

A = np.random.default_rng(0).normal(size=(2, 3, 4))


def _pair() -> tuple[sg.Tensor, Any]:
    return sg.tensor(A), torch.from_numpy(A)


def _same(ours: sg.Tensor, theirs: Any) -> None:
    assert ours.shape == tuple(theirs.shape)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-13, atol=1e-14)


CASES: list[tuple[str, Callable[[Any], Any]]] = [
    ("mean(dim=1)", lambda x: x.mean(dim=1)),
    ("mean(dim=-1, keepdim=True)", lambda x: x.mean(dim=-1, keepdim=True)),
    ("mean(dim=(0, 2))", lambda x: x.mean(dim=(0, 2))),
    ("sum(dim=0)", lambda x: x.sum(dim=0)),
    ("sum(dim=[0, 2], keepdim=True)", lambda x: x.sum(dim=[0, 2], keepdim=True)),
    ("logsumexp(dim=2)", lambda x: x.logsumexp(dim=2)),
    ("softmax(dim=1)", lambda x: x.softmax(dim=1)),
    ("log_softmax(dim=0)", lambda x: x.log_softmax(dim=0)),
    ("view(6, 4)", lambda x: x.view(6, 4)),
    ("view(-1)", lambda x: x.view(-1)),
    ("view((4, -1))", lambda x: x.view((4, -1))),
    ("swapaxes(0, 2)", lambda x: x.swapaxes(0, 2)),
    ("flatten(1)", lambda x: x.flatten(1)),
    ("flatten(0, 1)", lambda x: x.flatten(0, 1)),
    ("flatten()", lambda x: x.flatten()),
    ("expand(5, -1, -1, 4)", lambda x: x[:, :1].expand(5, -1, -1, 4)),
    ("clamp(min=-0.5, max=0.5)", lambda x: x.clamp(min=-0.5, max=0.5)),
    ("squeeze(dim=1)", lambda x: x[:, :1].squeeze(dim=1)),
    ("contiguous()", lambda x: x.contiguous()),
]


@pytest.mark.parametrize(("name", "fn"), CASES, ids=[c[0] for c in CASES])
def test_pytorch_spelling_gives_pytorchs_value(name: str, fn: Callable[[Any], Any]) -> None:
    x, t = _pair()
    _same(fn(x), fn(t))


def test_reductions_with_dim_are_differentiable_and_compile() -> None:
    x, t = _pair()
    t.requires_grad_(True)
    (t.mean(dim=1, keepdim=True) * t).sum().backward()
    g = sg.grad(lambda v: (v.mean(dim=1, keepdim=True) * v).sum())(x)
    np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-13)
    compiled = sg.compile(lambda v: (v.sum(dim=2), v.softmax(dim=1), v.view(4, 6)), backend="numpy")
    for ours, theirs in zip(compiled(x), (t.sum(dim=2), t.softmax(dim=1), t.view(4, 6)), strict=True):
        _same(ours, theirs.detach())


def test_functional_ops_take_dim_and_keepdim() -> None:
    x, t = _pair()
    _same(sg.mean(x, dim=1), torch.mean(t, dim=1))
    _same(sg.sum(x, dim=2, keepdim=True), torch.sum(t, dim=2, keepdim=True))
    _same(sg.softmax(x, dim=0), torch.softmax(t, dim=0))
    _same(sg.log_softmax(x, dim=-1), torch.log_softmax(t, dim=-1))
    _same(sg.logsumexp(x, dim=1, keepdim=True), torch.logsumexp(t, dim=1, keepdim=True))
    _same(sg.cat([x, x], dim=1), torch.cat([t, t], dim=1))
    _same(sg.stack([x, x], dim=2), torch.stack([t, t], dim=2))
    _same(sg.var(x, dim=1, correction=1), torch.var(t, dim=1, correction=1))
    _same(sg.var(x, dim=1, ddof=0, keepdim=True), torch.var(t, dim=1, correction=0, keepdim=True))
    _same(sg.max(x, axis=1, keepdim=True), torch.amax(t, dim=1, keepdim=True))
    _same(sg.min(x, axis=(0, 1)), torch.amin(t, dim=(0, 1)))
    indices = sg.argmax(x, dim=1, keepdim=True)
    assert indices.tolist() == torch.argmax(t, dim=1, keepdim=True).tolist()
    assert x.argmax(dim=2).tolist() == t.argmax(dim=2).tolist()
    assert x.argmax(axis=0, keepdims=True).shape == (1, 3, 4)


def test_dim_numel_and_size() -> None:
    x, t = _pair()
    assert x.dim() == t.dim() == 3
    assert x.numel() == t.numel() == 24
    assert x.size == 24 and x.size + 1 == 25 and isinstance(x.size, int)  # NumPy's size stays
    assert sg.tensor(3.0).numel() == 1 and sg.tensor(3.0).size == 1


def test_size_called_like_pytorch_names_the_shapegrad_spelling() -> None:
    x = sg.tensor(A)
    with pytest.raises(TypeError, match=r"NumPy's element count here \(24\).*use x\.shape \(or x\.numel\(\)"):
        x.size()
    with pytest.raises(TypeError, match=r"use x\.shape\[1\]"):
        x.size(1)


def test_max_and_min_over_a_dim_are_refused_with_the_values_and_indices_spelling() -> None:
    x = sg.tensor(A)
    with pytest.raises(TypeError, match=r"returns \(values, indices\).*x\.max\(axis=1\).*x\.argmax\(axis=1\)"):
        x.max(dim=1)
    with pytest.raises(TypeError, match=r"x\.min\(axis=0\).*\(-x\)\.argmax\(axis=0\)"):
        sg.min(x, dim=0)


def test_var_over_a_dim_needs_an_explicit_correction() -> None:
    x = sg.tensor(A)
    with pytest.raises(TypeError, match=r"unbiased \(n - 1\).*var\(x, axis=1, ddof=1\)"):
        x.var(dim=1)
    with pytest.raises(TypeError, match="both ddof=1 and PyTorch's correction=0"):
        sg.var(x, ddof=1, correction=0)
    np.testing.assert_allclose(x.var().numpy(), A.var())  # NumPy's default is unchanged
    np.testing.assert_allclose(x.var(axis=2, ddof=1).numpy(), A.var(axis=2, ddof=1))


def test_transpose_of_two_axes_on_a_3d_tensor_names_swapaxes() -> None:
    x = sg.tensor(A)
    with pytest.raises(sg.ShapeError, match=r"to swap two axes as PyTorch's transpose\(0, 1\) does, use x\.swapaxes\(0, 1\)"):
        x.transpose(0, 1)
    _same(sg.tensor(A[0]).transpose(1, 0), torch.from_numpy(A[0]).transpose(1, 0))  # 2-d: both agree


@pytest.mark.parametrize("dtype", ["int32", sg.float32, np.float16])
def test_view_with_a_dtype_is_refused_naming_astype(dtype: Any) -> None:
    with pytest.raises(TypeError, match=r"reinterprets bits.*x\.astype\(dtype\)"):
        sg.tensor(A).view(dtype)


def test_numpy_and_pytorch_names_together_are_an_error() -> None:
    x = sg.tensor(A)
    with pytest.raises(TypeError, match=r"sum: got both axis=0 and PyTorch's dim=1; give one"):
        x.sum(axis=0, dim=1)
    with pytest.raises(TypeError, match=r"mean: got both keepdims=True and PyTorch's keepdim=True"):
        sg.mean(x, keepdims=True, keepdim=True)
    with pytest.raises(TypeError, match=r"softmax: got both axis=0 and PyTorch's dim=1"):
        sg.softmax(x, 0, dim=1)
    with pytest.raises(sg.ShapeError, match=r"expand: needs at least 3 sizes"):
        x.expand(3, 4)
    with pytest.raises(sg.ShapeError, match=r"flatten: start_dim 2 comes after end_dim 1"):
        x.flatten(2, 1)


def test_iterating_a_tensor_gives_its_rows_as_pytorch_does() -> None:
    x, t = _pair()
    rows = list(x)
    assert len(rows) == len(list(t)) == 2
    for ours, theirs in zip(rows, t, strict=True):
        _same(ours, theirs)
    first, second = x  # unpacking iterates too
    _same(second, t[1])
    with pytest.raises(TypeError, match="0-d"):
        iter(sg.tensor(1.0))
