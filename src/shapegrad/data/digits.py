"""scikit-learn's handwritten digits (1797 real 8x8 images, 10 classes), split deterministically.

The data ships inside scikit-learn (no download). Install it with the
optional extra: ``pip install 'shapegrad[data]'``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shapegrad.data.synthetic import Labels
from shapegrad.random import check_seed

Features = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Split:
    """A train/test split of one dataset (arrays are never shared between the two halves)."""

    x_train: Features
    y_train: Labels
    x_test: Features
    y_test: Labels


def _load_raw() -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    try:
        # imported by name: scikit-learn is optional and ships no type information
        sk_datasets = importlib.import_module("sklearn.datasets")
    except ImportError as error:  # the dataset is an optional extra
        raise ImportError(
            "the digits dataset needs scikit-learn: pip install 'shapegrad[data]'"
        ) from error
    bunch = sk_datasets.load_digits()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)


def stratified_split(
    y: npt.NDArray[np.integer], test_fraction: float, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Indices ``(train, test)``: each class contributes ``round(test_fraction * count)`` test rows.

    Args:
        y: integer labels.
        test_fraction: share of every class held out, in (0, 1).
        seed: random seed for the per-class shuffles.
    Returns:
        sorted index arrays for the training and test rows (disjoint, covering ``y``).
    Example:
        >>> tr, te = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1]), 0.25, seed=0)
        >>> len(tr), len(te)
        (6, 2)
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(check_seed(seed, "stratified_split"))
    train: list[npt.NDArray[np.int64]] = []
    test: list[npt.NDArray[np.int64]] = []
    for label in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == label)).astype(np.int64)
        n_test = round(test_fraction * len(rows))
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def load_digits(test_fraction: float = 0.2, seed: int = 0, images: bool = False) -> Split:
    """The digits dataset, pixel values scaled to [0, 1], split per class.

    Args:
        test_fraction: share of each digit class held out for testing.
        seed: seed of the split, an int in [0, 2**32); equal seeds give equal splits.
        images: return ``x`` as ``(n, 1, 8, 8)`` images (NCHW, for conv nets)
            instead of ``(n, 64)`` vectors.
    Returns:
        a :class:`Split` with float32 features and int32 labels in ``range(10)``.
    Raises:
        ImportError: scikit-learn is not installed.
    Example:
        >>> split = load_digits()
        >>> split.x_train.shape, split.x_test.shape
        ((1438, 64), (359, 64))
    """
    check_seed(seed, "load_digits")  # before the (slow) load
    data, target = _load_raw()
    x = (data / 16.0).astype(np.float32)  # pixels are integers 0..16
    if images:
        x = x.reshape(-1, 1, 8, 8)
    y = target.astype(np.int32)
    train, test = stratified_split(y, test_fraction, seed)
    return Split(x[train], y[train], x[test], y[test])
