"""Evaluating a digits CNN on 8x8 images with a confusion matrix built in NumPy."""

import numpy as np

import shapegrad as sg
from shapegrad import Float, Int, Tensor


@sg.typechecked
def cnn(
    x: Float[Tensor, "b 1 8 8"], k: Float[Tensor, "8 1 3 3"], fc: Float[Tensor, "10 128"]
) -> Float[Tensor, "b 10"]:
    h = sg.relu(sg.conv2d(x, k, padding=1))  # [b, 8, 8, 8]
    h = sg.avg_pool2d(h, 2)  # [b, 8, 4, 4]
    flat = h.reshape(h.shape[0], -1)  # [b, 128]
    return flat @ fc.T


def confusion(pred: np.ndarray, truth: np.ndarray, classes: int = 10) -> np.ndarray:
    m = np.zeros((classes, classes), dtype=np.int64)
    np.add.at(m, (truth, pred), 1)
    return m


@sg.typechecked
def predict(
    x: Float[Tensor, "b 1 8 8"], k: Float[Tensor, "8 1 3 3"], fc: Float[Tensor, "10 128"]
) -> Int[Tensor, " b"]:
    return sg.argmax(cnn(x, k, fc), axis=-1)


def run() -> float:
    rng = np.random.default_rng(0)
    images = rng.random((12, 64)).astype(np.float32).reshape(12, 1, 8, 8)
    truth = rng.integers(0, 10, size=12)
    pred = predict(sg.tensor(images), sg.randn((8, 1, 3, 3)), sg.randn((10, 128))).numpy()
    return float(np.trace(confusion(pred, truth)))
