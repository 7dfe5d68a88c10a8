"""Independent NumPy references for the composite ops of the op table (loops where clearer)."""

from __future__ import annotations

import math

import numpy as np

_MASK = 0xFFFFFFFF


def uniform(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The RANDOM primitive's documented bits, one Python int at a time (murmur3 finaliser)."""
    n = math.prod(shape)
    golden = (seed * 0x9E3779B9) & _MASK
    values = []
    for i in range(n):
        x = (i + golden) & _MASK
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & _MASK
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & _MASK
        x ^= x >> 16
        values.append((x >> 8) / float(1 << 24))
    return np.array(values, dtype=np.float64).reshape(shape)


# --- sg.random's keyed generator, from its documented definition, in int64 bit arithmetic ---

_M24 = 1 << 24
_KEY_ADD = (0x3C6EF3, 0xA54FF5, 0x510E52, 0x1F83D9, 0x5BE0CD)
_KEY_MUL = (0x9E3779, 0x85EBCB, 0xC2B2AF, 0x27D4EB, 0x165667)


def keyed_permutation(x: np.ndarray, k0: int, k1: int) -> np.ndarray:
    """Five rounds of s <- swap12(T(C * (s + word + R))) mod 2^24, T(t) = t(2t+1)."""
    s = np.asarray(x, dtype=np.int64) % _M24
    for r in range(5):
        s = (s + (k0 if r % 2 == 0 else k1) + _KEY_ADD[r]) % _M24
        s = (s * _KEY_MUL[r]) % _M24
        s = (s * (2 * s + 1)) % _M24
        s = ((s & 0xFFF) << 12) | (s >> 12)
    return s


def key_fold_in(key: tuple[int, int], data: int) -> tuple[int, int]:
    k0, k1 = key
    d = np.asarray([data % _M24])
    return int(keyed_permutation(d, k0, k1)[0]), int(keyed_permutation(d, k1, (k0 + 0x6A09E6) % _M24)[0])


def key_from_seed(seed: int) -> tuple[int, int]:
    words = []
    while True:
        words.append(seed & 0xFFFFFF)
        seed >>= 24
        if not seed:
            break
    key = (words[0], len(words))
    for w in words[1:]:
        key = key_fold_in(key, w)
    return key_fold_in(key, 0)


def keyed_uniform(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``sg.random.uniform(sg.random.key(seed), shape)`` in float64."""
    k0, k1 = key_from_seed(seed)
    n = math.prod(shape)
    return (keyed_permutation(np.arange(n), k0, k1) / float(_M24)).reshape(shape)


def normal(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Box-Muller over ``2n`` uniforms: first half radius, second half angle."""
    n = math.prod(shape)
    u = uniform((2 * n,), seed)
    z = np.sqrt(-2.0 * np.log(1.0 - u[:n])) * np.cos(2.0 * math.pi * u[n:])
    return z.reshape(shape)


def gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def logsumexp(
    x: np.ndarray, axis: int | tuple[int, ...] | None = None, keepdims: bool = False
) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return x - logsumexp(x, axis=axis, keepdims=True)


def cross_entropy_int(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    logp = log_softmax(logits)
    return -np.mean([logp[i, labels[i]] for i in range(len(labels))])


def cross_entropy_soft(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    return -np.mean(np.sum(targets * log_softmax(logits), axis=-1))


def layer_norm(
    x: np.ndarray,
    weight: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    axes: tuple[int, ...] = (-1,),
    eps: float = 1e-5,
) -> np.ndarray:
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None = None,
    stride: tuple[int, int] = (1, 1),
    padding: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """Direct cross-correlation with explicit output loops."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    ho = (h + 2 * padding[0] - kh) // stride[0] + 1
    wo = (wd + 2 * padding[1] - kw) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            r, c = i * stride[0], j * stride[1]
            window = xp[:, :, r : r + kh, c : c + kw]
            out[:, :, i, j] = np.tensordot(window, w, axes=([1, 2, 3], [1, 2, 3]))
    if bias is not None:
        out += bias[None, :, None, None]
    return out


def pool2d(
    x: np.ndarray,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    kind: str,
) -> np.ndarray:
    fill = -np.inf if kind == "max" else 0.0
    pads = ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2)
    xp = np.pad(x, pads, constant_values=fill)
    ho = (xp.shape[2] - kernel[0]) // stride[0] + 1
    wo = (xp.shape[3] - kernel[1]) // stride[1] + 1
    out = np.zeros((*x.shape[:2], ho, wo))
    for i in range(ho):
        for j in range(wo):
            r, c = i * stride[0], j * stride[1]
            window = xp[:, :, r : r + kernel[0], c : c + kernel[1]]
            out[:, :, i, j] = window.max(axis=(2, 3)) if kind == "max" else window.mean(axis=(2, 3))
    return out


def scatter_add(updates: np.ndarray, idx: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Loop form of SCATTER_ADD for a 1-d index: out[..., idx[k], ...] += updates[..., k, ...]."""
    out_shape = list(updates.shape)
    out_shape[axis] = size
    out = np.zeros(out_shape)
    for k, target in enumerate(idx):
        src = np.take(updates, k, axis=axis)
        dst = [slice(None)] * len(out_shape)
        dst[axis] = int(target)
        out[tuple(dst)] += src
    return out
