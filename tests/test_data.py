"""Datasets and batching: closed-form geometry, determinism, noise level, batch semantics."""

from __future__ import annotations

import numpy as np
import pytest

from shapegrad import data


@pytest.mark.parametrize(
    "make", [data.make_moons, data.make_circles, lambda **k: data.make_spirals(classes=3, **k)]
)
def test_shapes_dtypes_and_determinism(make) -> None:  # type: ignore[no-untyped-def]
    x, y = make(n=301, seed=3)
    assert x.shape == (301, 2) and x.dtype == np.float32
    assert y.shape == (301,) and y.dtype == np.int32
    x2, y2 = make(n=301, seed=3)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    x3, _ = make(n=301, seed=4)
    assert not np.array_equal(x, x3)
    counts = np.bincount(y)
    assert counts.max() - counts.min() <= 1  # classes split as evenly as possible


def test_moons_without_noise_lie_on_their_arcs() -> None:
    x, y = data.make_moons(n=400, noise=0.0, seed=0)
    upper, lower = x[y == 0].astype(np.float64), x[y == 1].astype(np.float64)
    np.testing.assert_allclose(np.hypot(upper[:, 0], upper[:, 1]), 1.0, atol=1e-6)
    assert upper[:, 1].min() >= -1e-6
    np.testing.assert_allclose(np.hypot(lower[:, 0] - 1.0, lower[:, 1] - 0.5), 1.0, atol=1e-6)
    assert lower[:, 1].max() <= 0.5 + 1e-6


def test_noise_is_gaussian_with_the_requested_std() -> None:
    clean, y = data.make_circles(n=20000, noise=0.0, seed=7)
    noisy, y_noisy = data.make_circles(n=20000, noise=0.08, seed=7)
    # circles are rotation symmetric, so compare radial deviations per class
    for label, radius in ((0, 1.0), (1, 0.5)):
        radial = np.hypot(*noisy[y_noisy == label].T.astype(np.float64)) - radius
        assert abs(radial.std() - 0.08) < 0.005
        assert abs(radial.mean()) < 0.01
    np.testing.assert_allclose(np.hypot(*clean[y == 1].T), 0.5, atol=1e-6)


def test_spirals_follow_the_angle_formula() -> None:
    x, y = data.make_spirals(n=600, classes=3, noise=0.0, turns=1.25, seed=0)
    r = np.hypot(x[:, 0], x[:, 1]).astype(np.float64)
    expected = 2 * np.pi * (1.25 * r + y / 3)
    angle = np.arctan2(x[:, 1], x[:, 0])
    wrapped = np.angle(np.exp(1j * (angle - expected)))
    np.testing.assert_allclose(wrapped, 0.0, atol=1e-4)


def test_generators_reject_bad_arguments() -> None:
    with pytest.raises(ValueError, match="noise"):
        data.make_moons(n=10, noise=-1.0)
    with pytest.raises(ValueError, match="factor"):
        data.make_circles(n=10, factor=1.5)
    with pytest.raises(ValueError, match="classes"):
        data.make_spirals(n=10, classes=1)


def test_batches_cover_a_fresh_permutation_every_epoch() -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    y = np.arange(10)
    batches = data.Batches(x, y, batch_size=5, seed=1)
    epochs = [list(batches) for _ in range(3)]
    orders = []
    for epoch in epochs:
        assert len(epoch) == len(batches) == 2
        for xb, yb in epoch:
            np.testing.assert_array_equal(xb[:, 0], 2 * yb)  # rows stay aligned across arrays
        orders.append(np.concatenate([yb for _, yb in epoch]))
        assert sorted(orders[-1].tolist()) == list(range(10))
    assert not all(np.array_equal(orders[0], o) for o in orders[1:])
    again = [np.concatenate([yb for _, yb in data.Batches(x, y, batch_size=5, seed=1)])]
    np.testing.assert_array_equal(again[0], orders[0])
    resumed = data.Batches(x, y, batch_size=5, seed=1, start_epoch=2)
    np.testing.assert_array_equal(np.concatenate([yb for _, yb in resumed]), orders[2])


def test_last_batch_drop_pad_and_keep() -> None:
    y = np.arange(7)
    dropped = [b[0].tolist() for b in data.Batches(y, batch_size=3, shuffle=False)]
    assert dropped == [[0, 1, 2], [3, 4, 5]]
    padded = [b[0].tolist() for b in data.Batches(y, batch_size=3, shuffle=False, last="pad")]
    assert padded == [[0, 1, 2], [3, 4, 5], [6, 0, 1]]
    kept = [b[0].tolist() for b in data.Batches(y, batch_size=3, shuffle=False, last="keep")]
    assert kept == [[0, 1, 2], [3, 4, 5], [6]]
    tiny = [b[0].tolist() for b in data.Batches(y[:2], batch_size=5, shuffle=False, last="pad")]
    assert tiny == [[0, 1, 0, 1, 0]]
    shuffled = data.Batches(y, batch_size=3, last="pad", seed=5)
    order = shuffled.order(0)
    last = list(shuffled)[-1][0]
    np.testing.assert_array_equal(last, [order[6], order[0], order[1]])


def test_batches_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="first dimension"):
        data.Batches(np.zeros(3), np.zeros(4), batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        data.Batches(np.zeros(3), batch_size=0)
    with pytest.raises(ValueError, match="would yield nothing"):
        data.Batches(np.zeros(3), batch_size=4)


def test_digits_split_is_stratified_disjoint_and_matches_sklearn() -> None:
    datasets = pytest.importorskip("sklearn.datasets", reason="digits need scikit-learn")
    raw = datasets.load_digits()
    split = data.load_digits(test_fraction=0.2, seed=0)
    assert split.x_train.shape[1:] == (64,) and split.x_train.dtype == np.float32
    assert len(split.x_train) + len(split.x_test) == len(raw.target)
    assert split.x_train.min() >= 0.0 and split.x_train.max() <= 1.0
    # every row of the split is a row of the raw data with its own label
    table = {tuple(row): label for row, label in zip(raw.data / 16.0, raw.target, strict=True)}
    for xs, ys in ((split.x_train, split.y_train), (split.x_test, split.y_test)):
        for row, label in zip(xs.astype(np.float64), ys, strict=True):
            assert table[tuple(row)] == label
    per_class_test = np.bincount(split.y_test, minlength=10)
    per_class_all = np.bincount(raw.target, minlength=10)
    np.testing.assert_array_equal(per_class_test, np.round(0.2 * per_class_all))
    again = data.load_digits(test_fraction=0.2, seed=0, images=True)
    assert again.x_test.shape == (len(split.x_test), 1, 8, 8)
    np.testing.assert_array_equal(again.x_test.reshape(-1, 64), split.x_test)
    other = data.load_digits(test_fraction=0.2, seed=1)
    assert not np.array_equal(other.y_test, split.y_test)
