"""A CNN training step whose convolution products run shapegrad's own kernels
(``backends/c/sgemm.h``, chosen by ``gemm_kernel``): the per-image forward and
input-gradient products read the im2col / output gradient in place (28 x 28 = 784
columns), and the weight gradient, summed over images, runs as dot products
(``sg_gemm_abt_dot``). Checked against PyTorch in float64 and against the same step built
with the library's products only (``$SHAPEGRAD_GEMM=blas``)."""

from __future__ import annotations

import platform
import re

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.functional as F
from shapegrad.backends.c import gemm_kernel
from shapegrad.backends.c.toolchain import cflags

X86 = platform.machine() in ("x86_64", "AMD64")

LR = 0.05


def _conv3x3(x: sg.Tensor, w: sg.Tensor, b: sg.Tensor) -> sg.Tensor:
    """3x3 convolution, padding 1, as im2col + one einsum (``train_step.py``'s form)."""
    _, c, h, wd = x.shape
    o = w.shape[0]
    xp = F.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = F.stack([xp[:, :, dy : dy + h, dx : dx + wd] for dy in range(3) for dx in range(3)], 2)
    out = F.einsum("bckhw,ock->bohw", cols, w.reshape((o, c, 9)))
    return out + b.reshape((1, o, 1, 1))


def _loss(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    w1, b1, w2, b2, w3, b3 = params
    h = sg.relu(_conv3x3(x, w1, b1))
    h = sg.relu(_conv3x3(h, w2, b2))
    return F.cross_entropy(h.mean(axis=(2, 3)) @ w3 + b3, y)


def _args(batch: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    # conv2: 4 -> 32 channels: forward 32 x 784 x 36, input gradient 36 x 784 x 32 (both
    # read b in place), weight gradient 32 x 36 summed over 784 pixels (dot products)
    rng = np.random.default_rng(7)
    shapes = [(4, 1, 3, 3), (4,), (32, 4, 3, 3), (32,), (32, 10), (10,)]
    params = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in shapes]
    x = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, batch).astype(np.int32)
    return params, x, y


def _step(mode: str, batch: int, monkeypatch: pytest.MonkeyPatch) -> tuple[str, list[np.ndarray]]:
    monkeypatch.setenv(gemm_kernel.ENV, mode)
    params, x, y = _args(batch)
    grad = sg.compile(sg.grad(_loss), backend="c", name=f"conv_own_gemm_{mode}_{batch}")
    lowered = grad.lower(params, x, y)
    assert lowered.source is not None
    return lowered.source, [np.asarray(g) for g in grad(params, x, y)]


@pytest.mark.parametrize("batch", [3, 16])
def test_conv_step_with_own_products_matches_library_and_torch(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, got = _step("auto", batch, monkeypatch)
    # batch 3: whole-batch products split by rows; 16: per-image (batch-fused) products
    assert re.search(r"sg_sgemm\(101, 111, 111, [^,]+, 784, 36,", source)  # forward
    assert re.search(r"sg_sgemm\(101, 112, 111, [^,]+, 784, 32,", source)  # input gradient
    assert "sg_gemm_abt_dot(36, 32, 784," in source  # weight gradient summed over images
    lib_source, want = _step("blas", batch, monkeypatch)
    assert "sg_sgemm(" not in lib_source and "sg_gemm_abt_dot(" not in lib_source
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    torch = pytest.importorskip("torch", reason="PyTorch reference not installed")
    params, x, y = _args(batch)
    tp = [torch.tensor(p.astype(np.float64), requires_grad=True) for p in params]
    xt = torch.tensor(x.astype(np.float64))
    h = torch.relu(torch.nn.functional.conv2d(xt, tp[0], tp[1], padding=1))
    h = torch.relu(torch.nn.functional.conv2d(h, tp[2], tp[3], padding=1))
    logits = h.mean(dim=(2, 3)) @ tp[4] + tp[5]
    torch.nn.functional.cross_entropy(logits, torch.tensor(y, dtype=torch.long)).backward()
    for g, p in zip(got, tp, strict=True):
        assert p.grad is not None
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not X86, reason="the AVX2 build needs an x86-64 -march")
def test_avx2_build_runs_the_library_calls_it_ran_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without AVX-512, ``sg_sgemm`` and ``sg_gemm_abt_dot`` are macros naming the library
    call the step made before, so the step is bit for bit the library-only one."""
    flags = [f for f in cflags() if not f.startswith("-march")] + ["-march=x86-64-v3"]
    monkeypatch.setenv("SHAPEGRAD_CFLAGS", " ".join(flags))
    source, got = _step("auto", 16, monkeypatch)
    assert "sg_gemm_abt_dot(36, 32, 784," in source
    _, want = _step("blas", 16, monkeypatch)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_gemm_mode_keys_the_stored_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    """``$SHAPEGRAD_GEMM`` is part of the manifest key: the same function compiled again
    under another mode gets that mode's library, not the one stored under the first."""
    params, x, y = _args(16)
    keys = {}
    for mode in ("blas", "auto", "blas"):
        monkeypatch.setenv(gemm_kernel.ENV, mode)
        fn = sg.compile(sg.grad(_loss), backend="c", name="conv_own_gemm_keyed")
        exe = fn.lower(params, x, y).executable
        keys.setdefault(mode, set()).add(exe.info.library_key)
    assert len(keys["blas"]) == 1 and keys["blas"].isdisjoint(keys["auto"])
