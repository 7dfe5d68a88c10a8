"""The demo models: shapes from the annotations, forward passes against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import shapegrad as sg
from shapegrad import models


def numpy_mlp(params: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    h = x.astype(np.float64)
    for i in range(0, len(params), 2):
        h = h @ params[i].T.astype(np.float64) + params[i + 1]
        if i + 2 < len(params):
            h = np.maximum(h, 0)
    return h


def numpy_conv_relu_pool(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """3x3 conv (padding 1) + bias, ReLU, then 2x2 max-pool, by explicit loops."""
    n, _, hgt, wid = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], hgt, wid))
    for i in range(hgt):
        for j in range(wid):
            patch = padded[:, :, i : i + 3, j : j + 3]
            out[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w) + b
    out = np.maximum(out, 0)
    return out.reshape(n, w.shape[0], hgt // 2, 2, wid // 2, 2).max(axis=(3, 5))


def test_moons_mlp_shapes_scores_and_hinge() -> None:
    params = models.MoonsMLP.init(models.kaiming, seed=1, h=16)
    assert [p.shape for p in params] == [(16, 2), (16,), (16, 16), (16,), (1, 16), (1,)]
    assert params.names == ("w1", "b1", "w2", "b2", "w3", "b3")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    x = rng.standard_normal((7, 2)).astype(np.float32)
    y = np.sign(rng.standard_normal(7)).astype(np.float32)
    typed = models.MoonsMLP(arrays)
    scores = models.moons_scores(typed, sg.tensor(x)).numpy()
    expected = numpy_mlp(arrays, x)[:, 0]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-5)
    loss = models.moons_loss(typed, sg.tensor(x), sg.tensor(y)).item()
    assert loss == pytest.approx(np.maximum(1 - y * expected, 0).mean(), rel=1e-5)


def test_digits_mlp_logits_and_loss() -> None:
    rng = np.random.default_rng(1)
    params = models.DigitsMLP.init(models.kaiming, seed=0, h=32)
    arrays = [rng.standard_normal(p.shape).astype(np.float32) * 0.3 for p in params]
    x = rng.random((5, 64)).astype(np.float32)
    labels = np.array([0, 3, 9, 3, 1], dtype=np.int32)
    logits = numpy_mlp(arrays, x)
    typed = models.DigitsMLP(arrays)
    np.testing.assert_allclose(
        models.digits_logits(typed, sg.tensor(x)).numpy(), logits, rtol=1e-4, atol=1e-4
    )
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -log_probs[np.arange(5), labels].mean()
    assert models.digits_loss(typed, sg.tensor(x), sg.tensor(labels)).item() == pytest.approx(
        expected, rel=1e-4
    )


def test_digits_cnn_matches_loop_reference() -> None:
    params = models.DigitsCNN.init(models.kaiming, seed=0, c=4, d=6)
    assert [p.shape for p in params] == [(4, 1, 3, 3), (4,), (6, 4, 3, 3), (6,), (10, 24), (10,)]
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(p.shape).astype(np.float32) * 0.5 for p in params]
    x = rng.random((3, 1, 8, 8)).astype(np.float32)
    h = numpy_conv_relu_pool(x.astype(np.float64), arrays[0], arrays[1])
    h = numpy_conv_relu_pool(h, arrays[2], arrays[3])
    expected = h.reshape(3, -1) @ arrays[4].T + arrays[5]
    got = models.digits_cnn_logits(models.DigitsCNN(arrays), sg.tensor(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_wrong_shapes_are_rejected_by_the_annotation() -> None:
    good = [p.numpy() for p in models.MoonsMLP.init(models.kaiming, seed=0, h=8)]
    good[2] = np.zeros((8, 9), dtype=np.float32)  # w2 must be [h, h]
    with pytest.raises(sg.ShapeError, match="w2"):
        models.MoonsMLP(good)
