"""Batch interleaving (``compiler/batchfuse.py``): a batch-fused convolution product runs
its neighbouring per-image kernels (bias + ReLU + mean after it, the ReLU mask of the
gradient before it) inside its own per-image loop. Checked against the same program
without interleaving (bitwise), the NumPy backend, PyTorch and float64 finite
differences, at odd shapes (batch 1, non-square, stride 2, padding 0, odd channels)."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import functional as F
from shapegrad.compiler import loops as L
from shapegrad.compiler.target import C_TARGET, Target

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

# batch-fuse even these small tests' patches (the default keeps operands < 1 MB whole)
SMALL = C_TARGET.replace(batch_fusion_min_operand=1, contract_min_macs=0, batch_interleave=True)
OFF = SMALL.replace(batch_interleave=False)

# (batch, in channels, height, width, mid channels, out channels, stride, padding)
SHAPES = {
    "b3-odd-channels": (3, 3, 9, 7, 5, 7, 1, 1),
    "batch1": (1, 2, 6, 6, 3, 4, 1, 1),
    "stride2-pad0": (4, 2, 11, 8, 5, 3, 2, 0),
    "wide-17ch": (2, 1, 5, 13, 17, 6, 1, 1),
}


def _im2col_conv(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor, stride: int, pad: int) -> sg.Tensor:
    """A user's im2col convolution (pad, stacked shifted slices, one einsum)."""
    _, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    xp = F.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x
    cols = F.stack(
        [
            xp[
                :,
                :,
                dy : dy + stride * (ho - 1) + 1 : stride,
                dx : dx + stride * (wo - 1) + 1 : stride,
            ]
            for dy in range(kh)
            for dx in range(kw)
        ],
        2,
    )
    out = F.einsum("bckhw,ock->bohw", cols, w.reshape((o, c, kh * kw)))
    return out + b.reshape((1, o, 1, 1))


def _loss(form: str, stride: int, pad: int) -> Callable[..., sg.Tensor]:
    def conv(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor, s: int, p: int) -> sg.Tensor:
        if form == "conv2d":
            return sg.conv2d(x, w, b, stride=s, padding=p)
        return _im2col_conv(x, w, b, s, p)

    def loss(
        w1: sg.Tensor, b1: sg.Tensor, w2: sg.Tensor, b2: sg.Tensor, x: sg.Tensor, c: sg.Tensor
    ) -> sg.Tensor:
        h = sg.relu(conv(x, w1, b1, stride, pad))
        h = sg.relu(conv(h, w2, b2, 1, 1))
        return (h.mean(axis=(2, 3)) * c).sum()

    return loss


def _args(shape: tuple[int, ...], dtype: type = np.float32, seed: int = 0) -> list[np.ndarray]:
    n, cin, h, w, mid, out, _, _ = shape
    rng = np.random.default_rng(seed)
    arrays = [
        rng.standard_normal((mid, cin, 3, 3)) * 0.5,
        rng.standard_normal(mid) * 0.1,
        rng.standard_normal((out, mid, 3, 3)) * 0.3,
        rng.standard_normal(out) * 0.1,
        rng.standard_normal((n, cin, h, w)),
        rng.standard_normal((n, out)),
    ]
    return [a.astype(dtype) for a in arrays]


def _compiled(form: str, shape: tuple[int, ...], target: Target):  # type: ignore[no-untyped-def]
    vg = sg.value_and_grad(_loss(form, *shape[6:]), argnums=(0, 1, 2, 3))
    return sg.compile(vg, backend="c", target=target)


def _run(fn, args: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    value, grads = fn(*map(sg.tensor, args))
    return [value.numpy(), *(g.numpy() for g in grads)]


def _interleaved(fn, args: list[np.ndarray]) -> list[str]:  # type: ignore[no-untyped-def]
    exe = fn.lower(*args).executable
    return [n for k in exe.program.kernels for n in k.inlined if "per batch index, " in n]


@pytest.mark.parametrize("form", ["conv2d", "im2col"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_interleaved_step_equals_plain_and_numpy(form: str, name: str) -> None:
    shape = SHAPES[name]
    args = _args(shape)
    on, off = _compiled(form, shape, SMALL), _compiled(form, shape, OFF)
    taken = _interleaved(on, args)
    assert not _interleaved(off, args)
    if shape[0] > 1:  # bias + ReLU (+ mean) after a product, the ReLU mask before one
        assert any("after" in t for t in taken) and any("before" in t for t in taken), taken
    got = _run(on, args)
    for a, b in zip(got, _run(off, args), strict=True):
        np.testing.assert_array_equal(a, b)  # same values, same order within each image
    vg = sg.value_and_grad(_loss(form, *shape[6:]), argnums=(0, 1, 2, 3))
    ref = _run(sg.compile(vg, backend="numpy"), args)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(SHAPES))
def test_interleaved_step_matches_torch(name: str) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch reference not installed")
    shape = SHAPES[name]
    stride, pad = shape[6:]
    args = _args(shape)
    got = _run(_compiled("conv2d", shape, SMALL), args)
    w1, b1, w2, b2 = (torch.tensor(a, requires_grad=True) for a in args[:4])
    x, c = (torch.tensor(a) for a in args[4:])
    h = torch.relu(torch.nn.functional.conv2d(x, w1, b1, stride=stride, padding=pad))
    h = torch.relu(torch.nn.functional.conv2d(h, w2, b2, padding=1))
    loss = (h.mean(dim=(2, 3)) * c).sum()
    loss.backward()
    want = [loss.detach().numpy(), *(t.grad.numpy() for t in (w1, b1, w2, b2))]  # type: ignore[union-attr]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["b3-odd-channels", "stride2-pad0"])
def test_interleaved_float64_gradients_match_finite_differences(name: str) -> None:
    shape = SHAPES[name]
    args = _args(shape, np.float64, seed=4)
    fn = _compiled("im2col", shape, SMALL)
    assert _interleaved(fn, args)
    _, *grads = _run(fn, args)
    value = sg.compile(_loss("im2col", *shape[6:]), backend="c", target=SMALL)
    rng = np.random.default_rng(7)
    eps = 1e-6
    for i, grad in enumerate(grads):
        for flat in rng.choice(grad.size, size=min(4, grad.size), replace=False):
            at = np.unravel_index(flat, grad.shape)
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[i][at] += eps
            minus[i][at] -= eps
            fd = (float(value(*plus)) - float(value(*minus))) / (2 * eps)
            np.testing.assert_allclose(grad[at], fd, rtol=1e-5, atol=1e-8)


def test_reader_of_other_images_is_not_interleaved() -> None:
    # the difference of neighbouring images reads the product's output at b and b + 1:
    # it must run after the whole product, and the values must not change
    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        y = sg.conv2d(x, w, padding=1)
        return ((y[1:] - y[:-1]) ** 2).sum()

    rng = np.random.default_rng(1)
    args = [rng.standard_normal((4, 3, 3, 3)).astype(np.float32)]
    args.append(rng.standard_normal((5, 3, 6, 6)).astype(np.float32))
    vg = sg.value_and_grad(loss, argnums=0)
    on = sg.compile(vg, backend="c", target=SMALL)
    value, grad = on(*map(sg.tensor, args))
    ref_value, ref_grad = sg.compile(vg, backend="numpy")(*map(sg.tensor, args))
    np.testing.assert_allclose(value.numpy(), ref_value.numpy(), rtol=1e-5)
    np.testing.assert_allclose(grad.numpy(), ref_grad.numpy(), rtol=1e-4, atol=1e-5)
    exe = on.lower(*args).executable
    fused = [s for k in exe.program.kernels for s in L.walk(k.body) if isinstance(s, L.BatchFused)]
    assert fused
    for s in fused:  # consumers read the product's output only at the current image
        c = s.contract
        for nest in s.consumer:
            for load in L.loads_in(nest.body):
                if load.buffer == c.c:
                    assert load.index.coef(nest.var) == c.stride_c
                    lo, hi = (load.index + L.var(nest.var) * (-c.stride_c)).bounds()
                    assert lo >= 0 and hi < c.stride_c


# --- the rules, on hand-built loop IR: y[b] = s[b] @ w, s[b] built from x[b] per index ---

F32 = sg.float32
B, R = L.Var("b", 2), L.Var("r", 4)


def _nest(
    store: str, value: L.Expr, index: L.Affine | None = None, acc: str | None = None
) -> L.Loop:
    at = index if index is not None else L.var(B) * 4 + L.var(R)
    inner = L.Loop(R, "parallel", (L.Store(store, at, value, accumulate=acc),))
    return L.Loop(B, "parallel", (inner,))


def _load(name: str, shift: int = 0) -> L.Load:
    return L.Load(F32, name, L.var(B) * 4 + L.var(R) + shift)


def _program(before: L.Loop | None, after: L.Loop | None) -> L.Program:
    product = L.Contract("s", "w", "y", 2, 2, 2, False, False, 2, 2, 0, 0, 2, 4, 0, 4, F32)
    fused = L.BatchFused((_nest("s", _load("x")),), product, "a", "s", 4, 2)
    kernels = [L.Kernel("k1", (fused,), 32, "einsum")]
    if before is not None:
        kernels.insert(0, L.Kernel("k0", (before,), 8, "relu"))
    if after is not None:
        kernels.append(L.Kernel("k2", (after,), 8, "mul"))
    sizes = {"x": 8, "w": 4, "y": 8, "z": 8, "s": 8, "u": 8}
    buffers = {n: L.BufferSpec(n, F32, size, "temp") for n, size in sizes.items()}
    return L.Program("p", buffers, kernels)


def _fused_parts(program: L.Program) -> tuple[int, int, int]:
    """(kernels, producer nests, consumer nests) after the stage."""
    from shapegrad.compiler.batchfuse import fuse_batch_producers

    fuse_batch_producers(
        program, C_TARGET.replace(batch_fusion_min_operand=1, batch_interleave=True)
    )
    s = next(s for k in program.kernels for s in k.body if isinstance(s, L.BatchFused))
    return len(program.kernels), len(s.producer), len(s.consumer)


def _twice(name: str, shift: int = 0) -> L.Expr:
    return L.Binary(F32, "mul", _load(name, shift), L.Const(F32, 2.0))


def test_neighbours_reading_and_writing_one_index_are_taken_in() -> None:
    after = _nest("z", _twice("y"))  # z[b] = 2 y[b]: reads the product's output at b
    before = _nest("x", L.Const(F32, 1.0))  # x[b] = 1: the patches read x at b
    assert _fused_parts(_program(before, after)) == (1, 2, 1)


@pytest.mark.parametrize(
    "case",
    ["reads-next-image", "writes-product-input", "accumulates", "writes-weight"],
)
def test_neighbours_touching_other_indices_stay_apart(case: str) -> None:
    before = after = None
    if case == "reads-next-image":  # y[b + 1] is not written yet when b runs
        after = _nest("z", _twice("y", 4))
    elif case == "writes-product-input":  # a later index of the patches would see it
        after = _nest("x", _twice("y"))
    elif case == "accumulates":
        after = _nest("z", _twice("y"), index=L.var(R), acc="add")
    else:  # the product reads all of w at every index
        before = _nest("w", L.Const(F32, 1.0), index=L.var(B) * 2)
    n_kernels = 1 + (before is not None) + (after is not None)
    kernels, producers, consumers = _fused_parts(_program(before, after))
    assert (kernels, producers, consumers) == (n_kernels, 1, 0)
