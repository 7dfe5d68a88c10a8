"""Explicit random keys (JAX-style): ``key``, ``split``, ``fold_in`` and samplers.

A key is an int32 tensor of shape ``[2]`` (two 24-bit words). Everything here
is ordinary tensor arithmetic, so a key can be an *input* of a compiled
function: passing a new key each step gives new random numbers with no
retrace (a Python-int ``seed`` is baked into the graph instead).

    >>> k = sg.random.key(0)
    >>> k_drop, k_init = sg.random.split(k)
    >>> step = sg.compile(lambda x, key: sg.dropout(x, 0.5, key))
    >>> a = step(sg.ones(8), sg.random.fold_in(k_drop, 1))   # fresh masks,
    >>> b = step(sg.ones(8), sg.random.fold_in(k_drop, 2))   # one executable
    >>> step.trace_count
    1

How the bits are made: element ``i`` of a sample is ``P_key(i)``, where
``P_key`` is a keyed permutation of the 24-bit integers built from five rounds
of ``s <- swap12(T(C_r * (s + key_word + R_r)))`` (all mod 2^24): ``T(t) =
t(2t+1)`` is an invertible nonlinear map, multiplying by an odd constant is
invertible and spreads low bits up, and swapping the 12-bit halves brings high
bits down. Each round is a bijection, so for one key no two of the first 2^24
elements collide and every output value is equally likely; one flipped key or
counter bit flips half the output bits. The integers are held exactly in
float64 (every product is below 2^49), so eager and every compiled backend give
identical bits. (The RANDOM primitive cannot take the key: its seed is a
compile-time attribute.)

Cost: compiled with the C backend a keyed sample takes about 28 elementwise loops
over float64 today (intermediates used twice are materialised by fusion), roughly
10-25x a seeded ``sg.rand``; ``benchmarks/keys_and_modules.py`` measures it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shapegrad.dtypes import DTypeLike, as_dtype, bool_, float32, float64, int32
from shapegrad.ops import prims
from shapegrad.ops.eager import tensor
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = [
    "SEED_BOUND",
    "bernoulli",
    "check_seed",
    "fold_in",
    "is_key",
    "key",
    "normal",
    "split",
    "uniform",
]

# Integer seeds are in [0, SEED_BOUND) everywhere (sg.rand/randn/dropout, Module.init and
# ParamList.init, data helpers, Batches, the CLI): the RANDOM primitive keeps 32 bits of
# its seed, and NumPy's SeedSequence, fed ``(seed, index)``, pads words with zeros, so
# seeds beyond 32 bits silently alias others (2**32 equals 0 for sg.rand; Module.init's
# (2**32, 0) equals (0, 1)). Only ``sg.random.key`` takes any non-negative int: it folds
# every 24-bit chunk in, so no two seeds collide.
SEED_BOUND = 1 << 32

_M = float(1 << 24)
_HALF = float(1 << 12)
_ADD = (0x3C6EF3, 0xA54FF5, 0x510E52, 0x1F83D9, 0x5BE0CD)  # round constants
_MUL = (0x9E3779, 0x85EBCB, 0xC2B2AF, 0x27D4EB, 0x165667)  # odd multipliers
_FOLD_SALT = 0x6A09E6  # second key word of fold_in
_SPLIT_SALT = 0x3C6EF3  # split's keys differ from fold_in's


def _floor_div(x: Tensor, d: float) -> Tensor:
    """``floor(x / d)`` of a non-negative float64 integer with a quotient below 2^31."""
    return prims.cast(prims.cast(x / d, int32), float64)


def _low(x: Tensor) -> Tensor:
    """``x mod 2^24`` of a non-negative float64 integer below 2^53."""
    return x - _floor_div(x, _M) * _M


def _permute(x: Tensor, k0: Tensor, k1: Tensor) -> Tensor:
    """The keyed permutation ``P_(k0, k1)`` of 24-bit integers (float64), elementwise."""
    s = x
    for r, (add, mul) in enumerate(zip(_ADD, _MUL, strict=True)):
        # ((s + a) mod M) * C mod M == (s + a) * C mod M, and (s + a) * C < 2^50 is exact:
        # one reduction instead of two (each one is a separate C loop today).
        s = _low((s + (k0 if r % 2 == 0 else k1) + float(add)) * float(mul))
        s = _low(s * (s * 2.0 + 1.0))
        high = _floor_div(s, _HALF)
        s = (s - high * _HALF) * _HALF + high  # swap the 12-bit halves
    return s


def is_key(x: object) -> bool:
    """True for a key: an int32 tensor of shape [2]."""
    return isinstance(x, Tensor) and x.shape == (2,) and x.dtype == int32


def _check_key(op: str, k: Tensor) -> None:
    if not is_key(k):
        shown = f"{k.dtype}{fmt(k.shape)}" if isinstance(k, Tensor) else type(k).__name__
        raise TypeError(
            f"sg.random.{op}: expected a key (int32[2] from sg.random.key(seed)), got {shown}"
        )


def _words(k: Tensor) -> tuple[Tensor, Tensor]:
    f = prims.cast(k, float64)
    return (prims.reshape(prims.slice_(f, [0], [1], [1]), ()),
            prims.reshape(prims.slice_(f, [1], [2], [1]), ()))


def key(seed: int) -> Tensor:
    """A key from a non-negative Python int (any size; different seeds give different keys).

    Example:
        >>> sg.random.key(0).shape
        (2,)
    """
    seed = check_seed(seed, "sg.random.key", bound=None)
    words = []
    while True:  # fold every 24-bit chunk of the seed in, so no two seeds collide by truncation
        words.append(seed & 0xFFFFFF)
        seed >>= 24
        if not seed:
            break
    k = tensor(np.asarray([words[0], len(words)], dtype=np.int32))
    for w in words[1:]:
        k = fold_in(k, w)
    return fold_in(k, 0)


def check_seed(seed: object, where: str, bound: int | None = SEED_BOUND) -> int:
    """``seed`` as an int after checking it is an int in ``[0, bound)`` (no bound: ``>= 0``).

    Raises:
        ValueError: not an int (a bool, a float, a string) or outside the range; the
            message names ``where`` and the valid range (see ``SEED_BOUND``).
    """
    valid = "a non-negative int" if bound is None else f"an int in [0, 2**{bound.bit_length() - 1})"
    if not isinstance(seed, int | np.integer) or isinstance(seed, bool):
        raise ValueError(f"{where}: seed must be {valid}, got {seed!r}")
    if seed < 0 or (bound is not None and seed >= bound):
        raise ValueError(f"{where}: seed must be {valid}, got {seed!r}")
    return int(seed)


def fold_in(k: Tensor, data: int | Tensor) -> Tensor:
    """A new key from ``k`` and an integer (a step number, a layer index); traceable.

    ``data`` is a Python int or an integer scalar tensor (e.g. a traced step counter);
    it is used modulo 2^24.
    """
    _check_key("fold_in", k)
    if isinstance(data, Tensor):
        if data.dtype.is_float or data.size != 1:
            raise TypeError(f"sg.random.fold_in: data must be an integer scalar, got {data.aval}")
        d = prims.cast(prims.reshape(data, ()), float64)
        d = _low(prims.where(d < 0.0, d + float(1 << 31), d))
    else:
        d = prims.full((), float(int(data) % (1 << 24)), float64, like=k)
    k0, k1 = _words(k)
    first = _permute(d, k0, k1)
    second = _permute(d, k1, _low(k0 + float(_FOLD_SALT)))
    return prims.cast(prims.concat([prims.reshape(first, (1,)), prims.reshape(second, (1,))], 0), int32)


def split(k: Tensor, num: int = 2) -> Tensor:
    """``num`` independent keys ``[num, 2]`` (unpack them: ``a, b = split(k)``)."""
    _check_key("split", k)
    if num < 1:
        raise ValueError(f"sg.random.split: num must be >= 1, got {num}")
    if num > 1 << 23:
        raise ValueError(f"sg.random.split: at most 2^23 keys at once, got {num}")
    counters = prims.iota((num, 2), 0, float64, like=k) * 2.0 + prims.iota((num, 2), 1, float64, like=k)
    k0, k1 = (prims.broadcast_to(w, (num, 2)) for w in _words(k))
    return prims.cast(_permute(counters, _low(k0 + float(_SPLIT_SALT)), k1), int32)


def _bits(k: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Float64 integers in [0, 2^24), one per element of ``shape``, from ``k``."""
    n = 1
    for d in shape:
        n *= d
    if n >= 1 << 31:
        raise ShapeError("sg.random", f"at most 2^31 elements per sample, got {fmt(shape)}")
    index = prims.iota((n,), 0, float64, like=k)
    k0, k1 = (prims.broadcast_to(w, (n,)) for w in _words(k))
    if n > 1 << 24:  # each block of 2^24 elements gets its own second key word
        block = _floor_div(index, _M)
        index, k1 = index - block * _M, _low(k1 + block)
    return prims.reshape(_permute(index, k0, k1), shape)


def _shape(op: str, shape: int | Sequence[int]) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ShapeError(op, f"negative dimension in shape {fmt(dims)}")
    return dims


def uniform(
    k: Tensor,
    shape: int | Sequence[int] = (),
    dtype: DTypeLike = float32,
    minval: float = 0.0,
    maxval: float = 1.0,
) -> Tensor:
    """Uniform samples in ``[minval, maxval)`` (24 random bits each).

    Example:
        >>> sg.random.uniform(sg.random.key(0), (2, 3)).shape
        (2, 3)
    """
    _check_key("uniform", k)
    u = _bits(k, _shape("uniform", shape)) * (1.0 / _M)
    if (minval, maxval) != (0.0, 1.0):
        u = u * (maxval - minval) + minval
    return prims.cast(u, as_dtype(dtype))


def normal(k: Tensor, shape: int | Sequence[int] = (), dtype: DTypeLike = float32) -> Tensor:
    """Standard normal samples (Box-Muller over two uniform streams of ``k``)."""
    _check_key("normal", k)
    dims = _shape("normal", shape)
    u = _bits(k, (2, *dims)) * (1.0 / _M)
    u1 = prims.reshape(prims.slice_(u, [0] * (len(dims) + 1), [1, *dims], [1] * (len(dims) + 1)), dims)
    u2 = prims.reshape(prims.slice_(u, [1] + [0] * len(dims), [2, *dims], [1] * (len(dims) + 1)), dims)
    radius = prims.unary(Prim.SQRT, prims.unary(Prim.LOG, 1.0 - u1) * -2.0)
    z = radius * prims.unary(Prim.COS, u2 * (2.0 * np.pi))
    return prims.cast(z, as_dtype(dtype))


def bernoulli(k: Tensor, p: float, shape: int | Sequence[int] = ()) -> Tensor:
    """Booleans that are True with probability ``p``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"sg.random.bernoulli: p must be in [0, 1], got {p}")
    return prims.binary(Prim.LT, uniform(k, shape, float64), p) if p < 1.0 else prims.full(
        _shape("bernoulli", shape), True, bool_, like=k
    )
