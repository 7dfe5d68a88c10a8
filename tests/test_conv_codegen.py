"""Convolution code generation in the C backend (issue 12, CNN step): the weight gradient's
per-thread partials, checked on the generated code and against the NumPy backend at
several team sizes, with and without batch fusion of the patches."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.base import CompileOptions
from shapegrad.backends.c import generate
from shapegrad.compiler.target import C_TARGET

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

TARGETS = {
    "c": C_TARGET,
    "plain": C_TARGET.replace(batch_fusion=False, row_form=False),
}


def _f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_loss(w: sg.Tensor, b: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
    return (sg.relu(sg.conv2d(x, w, b, padding=1)) ** 2).mean()


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_weight_gradient_partials_are_tall_and_match_numpy(target: str, threads: int) -> None:
    # weight gradient: m = 8 output channels < n = 6 * 9 patch rows, summed over 24 images
    args = (_f32(8, 6, 3, 3), _f32(8, seed=1), _f32(24, 6, 14, 14, seed=2))
    vg = sg.value_and_grad(_conv_loss, argnums=(0, 1, 2))
    graph = sg.compile(vg, backend="numpy").graph(*args)
    options = CompileOptions(extra=(("target", TARGETS[target]),))
    _, source = generate(graph, options)
    assert "part[j * 8 + r]" in source  # the 8 x 54 partial is kept as 54 x 8
    fn = sg.compile(vg, backend="c", target=TARGETS[target])
    exe = fn.lower(*args).executable
    exe.lib.sg_set_threads(threads)
    try:
        value, got = fn(*map(sg.tensor, args))
    finally:
        exe.lib.sg_set_threads(1)
    ref_value, ref = sg.compile(vg, backend="numpy")(*map(sg.tensor, args))
    np.testing.assert_allclose(value.numpy(), ref_value.numpy(), rtol=1e-5)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
