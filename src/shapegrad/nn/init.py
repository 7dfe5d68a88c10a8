"""Seeded, reproducible parameter initializers.

Every initializer is called as ``init(shape, seed=0, dtype=sg.float32)`` and
returns an eager :class:`~shapegrad.Tensor`. Random ones draw from
``numpy.random.Generator(PCG64(seed))`` where ``seed`` is an int or a tuple of
ints (``ParamList.init`` passes ``(seed, element_index)``), so the same seed
always gives the same numbers and elements of one ParamList are independent.
Samples are drawn in float64 and then cast to ``dtype``.

Fans follow PyTorch's layout convention (linear weight ``[out, in]``, conv
weight ``[out, in, kh, kw]``): ``fan_in = in * kh * kw``, ``fan_out = out * kh * kw``.

Biases: ``kaiming*``/``he*`` and ``xavier*``/``glorot*`` give **zeros** for
tensors of rank 0 or 1 (biases, norm offsets), since fans are undefined there;
pass ``bias_zero=False`` to their classes to get an error instead.

Example:
    >>> w = sg.nn.init.kaiming((256, 784), seed=0)          # He normal, ReLU gain
    >>> Params.init(sg.nn.init.normal(std=0.02), seed=1, h=16)
    >>> Params.init([sg.nn.init.xavier, sg.nn.init.zeros], h=16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DType, DTypeError, DTypeLike, as_dtype, float32
from shapegrad.ops.eager import tensor
from shapegrad.random import check_seed
from shapegrad.shapes import Shape
from shapegrad.tensor import Tensor

__all__ = [
    "Constant",
    "Initializer",
    "Kaiming",
    "Normal",
    "Uniform",
    "Xavier",
    "calculate_gain",
    "constant",
    "fans",
    "glorot",
    "glorot_normal",
    "glorot_uniform",
    "he",
    "he_normal",
    "he_uniform",
    "kaiming",
    "kaiming_normal",
    "kaiming_uniform",
    "normal",
    "ones",
    "uniform",
    "xavier",
    "xavier_normal",
    "xavier_uniform",
    "zeros",
]

Seed = int | tuple[int, ...]
Nonlinearity = Literal["linear", "relu", "leaky_relu", "tanh", "sigmoid"]


def generator(seed: Seed) -> np.random.Generator:
    """The NumPy generator for ``seed`` (an int or a tuple of non-negative ints)."""
    # each word in [0, 2**32): NumPy pads the entropy with zero words, so (2**32, 0)
    # and (0, 1) (a seed beyond 32 bits and the next element's seed) would collide
    entropy = list(seed) if isinstance(seed, tuple | list) else [seed]
    words = [check_seed(s, "sg.nn.init") for s in entropy]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(words)))


def fans(shape: Shape) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight of ``shape`` (``[out, in, *kernel]``).

    Example:
        >>> fans((64, 3, 3, 3))
        (27, 576)
    """
    if len(shape) < 2:
        raise ValueError(f"fans are defined for rank >= 2 weights, got shape {list(shape)}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: Nonlinearity, negative_slope: float = 0.01) -> float:
    """The recommended gain for a nonlinearity (PyTorch's values): relu → √2, tanh → 5/3."""
    gains = {
        "linear": 1.0,
        "sigmoid": 1.0,
        "tanh": 5.0 / 3.0,
        "relu": math.sqrt(2.0),
        "leaky_relu": math.sqrt(2.0 / (1.0 + negative_slope**2)),
    }
    if nonlinearity not in gains:
        raise ValueError(f"unknown nonlinearity {nonlinearity!r}; expected one of {sorted(gains)}")
    return gains[nonlinearity]


class Initializer:
    """Base class: subclasses implement ``sample``; calling one returns a Tensor."""

    random = True

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        """Values of ``shape`` (float64 or any dtype; cast afterwards)."""
        raise NotImplementedError

    def __call__(self, shape: Shape, seed: Seed = 0, dtype: DTypeLike = float32) -> Tensor:
        """A tensor of ``shape`` and ``dtype``; the same ``seed`` gives the same values.

        Args:
            shape: tuple of non-negative ints.
            seed: an int or a tuple of ints.
            dtype: shapegrad dtype (random initializers need a floating-point one).
        """
        target: DType = as_dtype(dtype)
        if self.random and not target.is_float:
            raise DTypeError(f"{self!r} draws random floats; it cannot make a {target} tensor")
        shape = tuple(int(d) for d in shape)
        values = self.sample(shape, generator(seed))
        return tensor(np.asarray(values).reshape(shape).astype(target.numpy), dtype=target)


@dataclass(frozen=True)
class Constant(Initializer):
    """Every element equals ``value`` (works for any dtype)."""

    value: float = 0.0
    random = False

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        return np.full(shape, self.value)


@dataclass(frozen=True)
class Normal(Initializer):
    """Samples from N(mean, std²)."""

    std: float = 1.0
    mean: float = 0.0

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        return rng.normal(self.mean, self.std, size=shape)


@dataclass(frozen=True)
class Uniform(Initializer):
    """Samples from U[a, b)."""

    a: float = 0.0
    b: float = 1.0

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        return rng.uniform(self.a, self.b, size=shape)


def _normal_or_uniform(
    distribution: Literal["normal", "uniform"],
    std: float,
    shape: Shape,
    rng: np.random.Generator,
) -> npt.NDArray[Any]:
    if distribution == "normal":
        return rng.normal(0.0, std, size=shape)
    bound = math.sqrt(3.0) * std  # U[-b, b] has std b/√3
    return rng.uniform(-bound, bound, size=shape)


@dataclass(frozen=True)
class Kaiming(Initializer):
    """He et al. (2015): std = gain / √fan (fan_in by default, ReLU gain √2).

    ``distribution="uniform"`` draws from U[-√3·std, √3·std]. Rank-0/1 tensors
    (biases) get zeros when ``bias_zero`` (the default).
    """

    distribution: Literal["normal", "uniform"] = "normal"
    mode: Literal["fan_in", "fan_out"] = "fan_in"
    nonlinearity: Nonlinearity = "relu"
    negative_slope: float = 0.01
    bias_zero: bool = True

    def std(self, shape: Shape) -> float:
        """The standard deviation used for a weight of ``shape``."""
        fan_in, fan_out = fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        gain = calculate_gain(self.nonlinearity, self.negative_slope)
        return gain / math.sqrt(fan) if fan > 0 else 0.0

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        if len(shape) < 2 and self.bias_zero:
            return np.zeros(shape)
        return _normal_or_uniform(self.distribution, self.std(shape), shape, rng)


@dataclass(frozen=True)
class Xavier(Initializer):
    """Glorot & Bengio (2010): std = gain·√(2 / (fan_in + fan_out)).

    ``distribution="uniform"`` draws from U[-b, b] with b = gain·√(6 / (fan_in + fan_out)).
    Rank-0/1 tensors (biases) get zeros when ``bias_zero`` (the default).
    """

    distribution: Literal["normal", "uniform"] = "normal"
    gain: float = 1.0
    bias_zero: bool = True

    def std(self, shape: Shape) -> float:
        """The standard deviation used for a weight of ``shape``."""
        fan_in, fan_out = fans(shape)
        total = fan_in + fan_out
        return self.gain * math.sqrt(2.0 / total) if total > 0 else 0.0

    def sample(self, shape: Shape, rng: np.random.Generator) -> npt.NDArray[Any]:
        if len(shape) < 2 and self.bias_zero:
            return np.zeros(shape)
        return _normal_or_uniform(self.distribution, self.std(shape), shape, rng)


def constant(value: float) -> Constant:
    """An initializer filling with ``value``."""
    return Constant(value)


def normal(std: float = 1.0, mean: float = 0.0) -> Normal:
    """An initializer drawing from N(mean, std²). Example: ``normal(std=0.02)``."""
    if std < 0:
        raise ValueError(f"normal: std must be >= 0, got {std}")
    return Normal(std, mean)


def uniform(a: float = 0.0, b: float = 1.0) -> Uniform:
    """An initializer drawing from U[a, b). Example: ``uniform(-0.1, 0.1)``."""
    if b < a:
        raise ValueError(f"uniform: need a <= b, got a={a}, b={b}")
    return Uniform(a, b)


zeros = Constant(0.0)
ones = Constant(1.0)
kaiming_normal = Kaiming("normal")
kaiming_uniform = Kaiming("uniform")
kaiming = he = he_normal = kaiming_normal
he_uniform = kaiming_uniform
xavier_normal = Xavier("normal")
xavier_uniform = Xavier("uniform")
xavier = glorot = glorot_normal = xavier_normal
glorot_uniform = xavier_uniform
