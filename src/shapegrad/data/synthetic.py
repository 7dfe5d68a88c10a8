"""Small 2-d toy datasets (moons, circles, spirals), generated from a seed.

Every generator returns ``(x, y)``: ``x`` float32 of shape ``(n, 2)`` and ``y``
int32 class labels of shape ``(n,)``. The same ``seed`` always gives the same
arrays (NumPy's PCG64 generator), and ``noise`` is the standard deviation of
Gaussian jitter added to every coordinate.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shapegrad.random import check_seed

Points = npt.NDArray[np.float32]
Labels = npt.NDArray[np.int32]


def _check(name: str, n: int, noise: float) -> None:
    if n < 2:
        raise ValueError(f"{name}: need n >= 2 samples, got {n}")
    if not 0 <= noise < float("inf"):  # NaN fails too: it made every point NaN
        raise ValueError(
            f"{name}: noise is a standard deviation and must be finite and >= 0, got {noise}"
        )


def _split_counts(n: int, classes: int) -> list[int]:
    """Sizes of ``classes`` groups summing to ``n``; the first groups get the remainder."""
    base, extra = divmod(n, classes)
    return [base + (1 if k < extra else 0) for k in range(classes)]


def _finish(
    parts: list[npt.NDArray[np.float64]], rng: np.random.Generator, noise: float
) -> tuple[Points, Labels]:
    """Stack per-class point sets, add noise and shuffle so classes are interleaved."""
    x = np.concatenate(parts, axis=0)
    y = np.concatenate([np.full(len(part), k, dtype=np.int32) for k, part in enumerate(parts)])
    if noise > 0:
        x = x + rng.normal(0.0, noise, size=x.shape)
    order = rng.permutation(len(x))
    return x[order].astype(np.float32), y[order]


def make_moons(n: int = 1000, noise: float = 0.1, seed: int = 0) -> tuple[Points, Labels]:
    """Two interleaving half circles ("moons").

    Class 0 is the upper arc of the unit circle; class 1 is the lower arc
    shifted right by 1 and up by 0.5, so the two hook into each other.

    Args:
        n: total number of points (split as evenly as possible).
        noise: standard deviation of the Gaussian noise on each coordinate.
        seed: random seed, an int in [0, 2**32); equal seeds give equal data.
    Returns:
        ``(x, y)`` with ``x`` float32 ``(n, 2)`` and ``y`` int32 ``(n,)`` in {0, 1}.
    Example:
        >>> x, y = make_moons(200, noise=0.05, seed=1)
        >>> x.shape, sorted(set(y.tolist()))
        ((200, 2), [0, 1])
    """
    _check("make_moons", n, noise)
    rng = np.random.default_rng(check_seed(seed, "make_moons"))
    n_upper, n_lower = _split_counts(n, 2)
    t_upper = np.linspace(0.0, np.pi, n_upper)
    t_lower = np.linspace(0.0, np.pi, n_lower)
    upper = np.stack([np.cos(t_upper), np.sin(t_upper)], axis=1)
    lower = np.stack([1.0 - np.cos(t_lower), 0.5 - np.sin(t_lower)], axis=1)
    return _finish([upper, lower], rng, noise)


def make_circles(
    n: int = 1000, noise: float = 0.05, factor: float = 0.5, seed: int = 0
) -> tuple[Points, Labels]:
    """Two concentric circles: class 0 on the unit circle, class 1 at radius ``factor``.

    Args:
        n: total number of points.
        noise: standard deviation of the Gaussian noise on each coordinate.
        factor: radius of the inner circle, in (0, 1).
        seed: random seed.
    Returns:
        ``(x, y)`` with ``x`` float32 ``(n, 2)`` and ``y`` int32 ``(n,)`` in {0, 1}.
    Example:
        >>> x, y = make_circles(100, noise=0.0, seed=0)
        >>> bool(abs(np.hypot(*x[y == 1].T) - 0.5).max() < 1e-6)
        True
    """
    _check("make_circles", n, noise)
    if not 0.0 < factor < 1.0:
        raise ValueError(f"make_circles: factor must be in (0, 1), got {factor}")
    rng = np.random.default_rng(check_seed(seed, "make_circles"))
    parts = []
    for count, radius in zip(_split_counts(n, 2), (1.0, factor), strict=True):
        # endpoint=False: 0 and 2*pi are the same point, don't place it twice
        t = np.linspace(0.0, 2.0 * np.pi, count, endpoint=False)
        parts.append(radius * np.stack([np.cos(t), np.sin(t)], axis=1))
    return _finish(parts, rng, noise)


def make_spirals(
    n: int = 1000, classes: int = 2, noise: float = 0.05, turns: float = 1.5, seed: int = 0
) -> tuple[Points, Labels]:
    """``classes`` interleaved spiral arms growing from the origin to radius 1.

    Arm ``k`` at radius ``r`` sits at angle ``2*pi*(turns*r + k/classes)``.

    Args:
        n: total number of points.
        classes: number of arms (= number of labels), at least 2.
        noise: standard deviation of the Gaussian noise on each coordinate.
        turns: how many full turns each arm makes.
        seed: random seed.
    Returns:
        ``(x, y)`` with ``x`` float32 ``(n, 2)`` and ``y`` int32 ``(n,)`` in ``range(classes)``.
    Example:
        >>> x, y = make_spirals(300, classes=3, seed=0)
        >>> np.bincount(y).tolist()
        [100, 100, 100]
    """
    _check("make_spirals", n, noise)
    if classes < 2:
        raise ValueError(f"make_spirals: need at least 2 classes, got {classes}")
    rng = np.random.default_rng(check_seed(seed, "make_spirals"))
    parts = []
    for k, count in enumerate(_split_counts(n, classes)):
        # start slightly off the origin so the arms are distinguishable at their roots
        r = np.linspace(0.05, 1.0, count)
        angle = 2.0 * np.pi * (turns * r + k / classes)
        parts.append(np.stack([r * np.cos(angle), r * np.sin(angle)], axis=1))
    return _finish(parts, rng, noise)
