"""The op table: one Case per (op, shape family), covering every primitive and public op.

Rows are deliberately one line each (formatter off) so the table reads as a
table. ``tests/test_ops.py`` runs every row in every mode of ``modes.MODES``;
other suites (compiled backends, benchmarks) import ``CASES`` from here rather
than copying rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

import references as R
import shapegrad as sg
from harness import (
    Case,
    bools,
    bytes_,
    distinct,
    fixed,
    ints,
    nonzero_ints,
    normal,
    signs,
    strided,
    transposed,
    uniform,
)
from shapegrad.ops import prims as P

Gen = Callable[[np.random.Generator], np.ndarray]

# fmt: off
# --- elementwise families over shapes: scalar, (1,), odd, zero-size, non-contiguous ----------

SHAPES: list[tuple[str, Callable[..., Gen], tuple[int, ...]]] = [
    ("scalar", normal, ()),
    ("one", normal, (1,)),
    ("small", normal, (2, 3)),
    ("odd", normal, (37, 129)),
    ("empty", normal, (0, 3)),
    ("transposed", transposed, (5, 7)),
    ("strided", strided, (4, 6)),
]


def _positive(gen: Gen) -> Gen:
    return lambda rng: np.abs(gen(rng)) + 0.5


def _away_from_zero(gen: Gen) -> Gen:
    return lambda rng: np.sign(gen(rng) + 1e-9) * (np.abs(gen(rng)) + 0.25)


UNARY: list[
    tuple[str, Callable[..., Any], Callable[..., Any], Callable[[Gen], Gen], tuple[str, ...]]
] = [
    ("neg", sg.neg, np.negative, lambda g: g, ("neg",)),
    ("exp", sg.exp, np.exp, lambda g: g, ("exp",)),
    ("log", sg.log, np.log, _positive, ("log",)),
    ("sin", sg.sin, np.sin, lambda g: g, ("sin",)),
    ("cos", sg.cos, np.cos, lambda g: g, ("cos",)),
    ("sqrt", sg.sqrt, np.sqrt, _positive, ("sqrt",)),
    ("tanh", sg.tanh, np.tanh, lambda g: g, ("tanh",)),
    ("abs", sg.abs, np.abs, _away_from_zero, ("abs",)),
    ("sigmoid", sg.sigmoid, R.sigmoid, lambda g: g, ("sigmoid",)),
    ("relu", sg.relu, lambda x: np.maximum(x, 0.0), _away_from_zero, ("relu", "maximum")),
    ("gelu", sg.gelu, R.gelu, lambda g: g, ("gelu",)),
    ("pow2.5", lambda x: x**2.5, lambda x: x**2.5, _positive, ("pow",)),
    ("pow3", lambda x: sg.pow(x, 3), lambda x: x**3, lambda g: g, ("pow",)),
]

PAIRS: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = [
    ("same", (2, 3), (2, 3)),
    ("scalars", (), ()),
    ("scalar_vec", (), (3,)),
    ("outer", (4, 1), (1, 5)),
    ("trailing", (2, 3, 4), (4,)),
    ("empty", (0, 3), (1, 3)),
    ("odd", (37, 129), (129,)),
]

BINARY: list[
    tuple[str, Callable[..., Any], Callable[..., Any], Callable[[Gen], Gen], tuple[str, ...]]
] = [
    ("add", lambda a, b: a + b, np.add, lambda g: g, ("add",)),
    ("sub", lambda a, b: a - b, np.subtract, lambda g: g, ("sub",)),
    ("mul", lambda a, b: a * b, np.multiply, lambda g: g, ("mul",)),
    ("div", lambda a, b: a / b, np.divide, _away_from_zero, ("div",)),
    ("pow", lambda a, b: a**b, np.power, _positive, ("pow",)),
    ("maximum", sg.maximum, np.maximum, lambda g: g, ("maximum",)),
    ("minimum", sg.minimum, np.minimum, lambda g: g, ("minimum",)),
]

COMPARISONS = [
    ("less", lambda a, b: a < b, np.less),
    ("less_equal", lambda a, b: a <= b, np.less_equal),
    ("greater", lambda a, b: a > b, np.greater),
    ("greater_equal", lambda a, b: a >= b, np.greater_equal),
    ("equal", lambda a, b: a == b, np.equal),
    ("not_equal", lambda a, b: a != b, np.not_equal),
]


def _small_ints(*shape: int) -> Gen:
    return lambda rng: rng.integers(0, 3, shape).astype(np.float64)  # ties on purpose


def elementwise_cases() -> list[Case]:
    cases = []
    for name, fn, ref, domain, covers in UNARY:
        for label, make, shape in SHAPES:
            cases.append(Case(f"{name}[{label}]", fn, [domain(make(*shape))], ref, covers))
    for name, fn, ref, domain, covers in BINARY:
        for label, sa, sb in PAIRS:
            gens = (
                [normal(*sa), domain(normal(*sb))]
                if name == "div"
                else [domain(normal(*sa)), domain(normal(*sb))]
            )
            cases.append(Case(f"{name}[{label}]", fn, gens, ref, (*covers, "broadcast")))
    for name, fn, ref in COMPARISONS:
        cases.append(
            Case(
                f"{name}[outer]",
                fn,
                [_small_ints(4, 1), _small_ints(1, 5)],
                ref,
                (name.replace("greater", "less"),),
                grad=False,
            )
        )
    cases += [
        Case("where[broadcast]", lambda c, a, b: sg.where(c, a, b), [bools(3, 1), normal(3, 4), normal(4)], np.where, ("where",)),
        Case("where[scalar]", lambda c, a: sg.where(c, a, 0.5), [bools(2, 3), normal(2, 3)], lambda c, a: np.where(c, a, 0.5), ("where",)),
        Case("exp[transpose_slice]", lambda x: sg.exp(x.T[1:, ::2]), [normal(6, 5)], lambda x: np.exp(x.T[1:, ::2]), ("exp", "slice", "permute")),
        Case("stop_gradient", lambda x: sg.stop_gradient(x) * 2.0, [normal(3)], lambda x: x * 2.0, ("stop_gradient",), grad=False),
        Case("cast[int]", lambda x: (x * 3.0).astype("int32"), [normal(2, 5)], lambda x: np.trunc(x * 3.0).astype(np.int32), ("cast",), grad=False),
        Case("cast[f32]", lambda x: x.astype("float32").astype(x.dtype), [normal(2, 5)], lambda x: x.astype(np.float32).astype(np.float64), ("cast",), fd_step=1e-2),
    ]
    return cases


# --- reductions and normalisers ---------------------------------------------------------


def _red(name: str, fn: Any, ref: Any, gen: Gen, covers: tuple[str, ...], **kw: Any) -> Case:
    return Case(name, fn, [gen], ref, covers, **kw)


def reduction_cases() -> list[Case]:
    return [
        _red("sum[all]", lambda x: sg.sum(x), lambda x: np.sum(x), normal(3, 4), ("sum", "reduce_sum")),
        _red("sum[axis]", lambda x: x.sum(axis=(0, 2)), lambda x: x.sum(axis=(0, 2)), normal(2, 3, 4), ("sum",)),
        _red("sum[keepdims]", lambda x: x.sum(axis=-1, keepdims=True), lambda x: x.sum(-1, keepdims=True), normal(3, 5), ("sum",)),
        _red("sum[scalar]", lambda x: sg.sum(x), np.sum, normal(), ("sum",)),
        _red("sum[empty]", lambda x: x.sum(axis=0), lambda x: x.sum(axis=0), normal(0, 3), ("sum",)),
        _red("sum[odd]", lambda x: x.sum(axis=1), lambda x: x.sum(axis=1), normal(37, 129), ("sum",)),
        _red("mean", lambda x: sg.mean(x, axis=1), lambda x: x.mean(axis=1), normal(4, 5), ("mean",)),
        _red("mean[empty_kept]", lambda x: sg.mean(x, axis=1), lambda x: x.mean(axis=1), normal(0, 5), ("mean",)),
        _red("var", lambda x: sg.var(x, axis=0, keepdims=True), lambda x: x.var(axis=0, keepdims=True), normal(6, 3), ("var",)),
        _red("max[all]", lambda x: sg.max(x), np.max, distinct(3, 4), ("max", "reduce_max")),
        _red("max[axis]", lambda x: x.max(axis=1, keepdims=True), lambda x: x.max(1, keepdims=True), distinct(4, 5), ("max",)),
        _red("max[empty_batch]", lambda x: x.max(axis=1), lambda x: x.max(axis=1), normal(0, 5), ("max",)),
        _red("min", lambda x: sg.min(x, axis=0), lambda x: x.min(axis=0), distinct(4, 3), ("min",)),
        _red("argmax", lambda x: sg.argmax(x, axis=0), lambda x: np.argmax(x, axis=0).astype(np.int32), distinct(5, 3), ("argmax",), grad=False),
        _red("logsumexp", lambda x: sg.logsumexp(x, axis=1), lambda x: R.logsumexp(x, axis=1), normal(3, 7), ("logsumexp",)),
        _red("logsumexp[all]", lambda x: sg.logsumexp(x), R.logsumexp, normal(2, 3), ("logsumexp",)),
        _red("logsumexp[large]", lambda x: sg.logsumexp(x, axis=-1), lambda x: R.logsumexp(x, axis=-1), uniform(-1e4, 1e4, 3, 4), ("logsumexp",)),
        _red("softmax", lambda x: sg.softmax(x, axis=0), lambda x: R.softmax(x, axis=0), normal(4, 3), ("softmax",)),
        _red("softmax[large]", lambda x: sg.softmax(x), R.softmax, uniform(-50, 50, 2, 5), ("softmax",)),
        _red("log_softmax", lambda x: sg.log_softmax(x), R.log_softmax, normal(3, 6), ("log_softmax",)),
        _red("layer_norm", lambda x: sg.layer_norm(x), R.layer_norm, normal(3, 8), ("layer_norm",)),
        Case("layer_norm[affine]", lambda x, w, b: sg.layer_norm(x, w, b, axis=(1, 2)), [normal(2, 3, 4), normal(3, 4), normal(3, 4)], lambda x, w, b: R.layer_norm(x, w, b, axes=(1, 2)), ("layer_norm",)),
    ]


# --- layout, indexing, contraction -------------------------------------------------------------


def layout_cases() -> list[Case]:
    idx = np.array([2, 0, -1, 2], dtype=np.int32)
    return [
        Case("reshape", lambda x: sg.reshape(x, (3, -1)), [normal(2, 3, 2)], lambda x: x.reshape(3, -1), ("reshape",)),
        Case("reshape[empty]", lambda x: x.reshape(3, 0), [normal(0, 3)], lambda x: x.reshape(3, 0), ("reshape",)),
        Case("transpose", lambda x: sg.transpose(x, (1, 2, 0)), [normal(2, 3, 4)], lambda x: x.transpose(1, 2, 0), ("transpose", "permute")),
        Case("T", lambda x: x.T, [normal(3, 5)], lambda x: x.T, ("transpose",)),
        Case("index[basic]", lambda x: x[1:, None, ::2, -1], [normal(4, 5, 3)], lambda x: x[1:, None, ::2, -1], ("slice", "reshape")),
        Case("index[advanced]", lambda x: x[:, idx], [normal(2, 3)], lambda x: x[:, idx], ("gather",)),
        Case("slice", lambda x: sg.slice(x, 1, None, 2, axis=1), [normal(3, 7)], lambda x: x[:, 1::2], ("slice",)),
        Case("slice[empty]", lambda x: sg.slice(x, 5, 2), [normal(4, 2)], lambda x: x[5:2], ("slice",)),
        Case("broadcast_to", lambda x: x.broadcast_to((2, 3, 4)), [normal(3, 1)], lambda x: np.broadcast_to(x, (2, 3, 4)), ("broadcast",)),
        Case("concat", lambda a, b, c: sg.concat([a, b, c], axis=1), [normal(2, 3), normal(2, 0), normal(2, 1)], lambda a, b, c: np.concatenate([a, b, c], 1), ("concat",)),
        Case("stack", lambda a, b: sg.stack([a, b], axis=-1), [normal(2, 3), normal(2, 3)], lambda a, b: np.stack([a, b], -1), ("stack", "concat")),
        Case("stack[scalars]", lambda a, b: sg.stack([a, b]), [normal(), normal()], lambda a, b: np.stack([a, b]), ("stack",)),
        Case("pad[pairs]", lambda x: sg.pad(x, ((1, 0), (2, 3)), constant_values=1.5), [normal(2, 3)], lambda x: np.pad(x, ((1, 0), (2, 3)), constant_values=1.5), ("pad",)),
        Case("pad[int]", lambda x: sg.pad(x, 1), [normal(2, 2)], lambda x: np.pad(x, 1), ("pad",)),
        Case("pad[empty]", lambda x: sg.pad(x, (1, 2)), [normal(0, 2)], lambda x: np.pad(x, (1, 2)), ("pad",)),
        Case("take[flat]", lambda x: sg.take(x, [[5, 0], [-1, 3]]), [normal(2, 3)], lambda x: np.take(x, [[5, 0], [-1, 3]]), ("take",)),
        Case("take[axis]", lambda x, i: sg.take(x, i, axis=1), [normal(3, 4, 2), ints(-4, 4, 5)], lambda x, i: np.take(x, i, axis=1), ("take",)),
        Case("gather", lambda x, i: sg.gather(x, i, 0), [normal(5, 3), ints(0, 5, 2, 6)], lambda x, i: np.take(x, i, axis=0), ("gather",)),
        Case("prim:gather", lambda x, i: P.gather(x, i, 1), [normal(3, 5, 2), ints(0, 5, 2, 3)], lambda x, i: np.take(x, i, axis=1), ("gather",)),
        Case("prim:scatter_add", lambda u, i: P.scatter_add(u, i, 1, 3), [normal(2, 5, 3), ints(0, 3, 5)], lambda u, i: R.scatter_add(u, i, 1, 3), ("scatter_add",)),
        Case("embedding", lambda t, i: sg.embedding(t, i), [normal(6, 4), ints(0, 6, 2, 3)], lambda t, i: t[i], ("embedding",)),
        Case("one_hot", lambda i: sg.one_hot(i, 4), [ints(0, 4, 5)], lambda i: np.eye(4)[i], ("one_hot",), grad=False, keeps_dtype=False),
        Case("prim:pad", lambda x: P.pad(x, [0, 2], [1, 0], value=-1.0), [normal(3, 2)], lambda x: np.pad(x, ((0, 1), (2, 0)), constant_values=-1.0), ("pad",)),
        Case("prim:slice", lambda x: P.slice_(x, [1, 0], [6, 3], [2, 3]), [normal(7, 4)], lambda x: x[1:6:2, 0:3:3], ("slice",)),
        Case("prim:broadcast", lambda x: P.broadcast_in_dim(x, (3, 2, 4), (0, 2)), [normal(3, 1)], lambda x: np.broadcast_to(x[:, None, :], (3, 2, 4)), ("broadcast",)),
    ]


EINSUMS: list[tuple[str, list[tuple[int, ...]]]] = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(2, 3), (3, 2)]),
    ("ba", [(3, 2)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(3, 3)]),
    ("iij,jk->ki", [(3, 3, 2), (2, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...i,i", [(2, 3, 4), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
    ("ab,bc,cd,d", [(2, 3), (3, 2), (2, 3), (3,)]),
    ("ij,ij->", [(0, 3), (0, 3)]),
    (",ij->ij", [(), (2, 3)]),
    ("ij,kj->ik", [(37, 129), (3, 129)]),
]


def contraction_cases() -> list[Case]:
    cases = [
        Case(
            f"einsum[{spec}]",
            lambda *xs, spec=spec: sg.einsum(spec, *xs),
            [normal(*s) for s in shapes],
            lambda *xs, spec=spec: np.einsum(spec, *xs),
            ("einsum",),
        )
        for spec, shapes in EINSUMS
    ]
    for a, b in [
        ((3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((3, 4), (4,)),
        ((2, 3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((0, 4), (4, 2)),
    ]:
        cases.append(
            Case(
                f"matmul{a}@{b}",
                lambda x, y: x @ y,
                [normal(*a), normal(*b)],
                np.matmul,
                ("matmul", "einsum"),
            )
        )
    cases.append(
        Case(
            "matmul[transposed]",
            sg.matmul,
            [transposed(3, 4), strided(4, 2)],
            np.matmul,
            ("matmul",),
        )
    )
    cases.append(
        Case(
            "prim:einsum",
            lambda a, b: P.einsum("ijk,kj->ki", a, b),
            [normal(2, 3, 4), normal(4, 3)],
            lambda a, b: np.einsum("ijk,kj->ki", a, b),
            ("einsum",),
        )
    )
    return cases


# --- losses, convolution, pooling, constructors ------------------------------------------------------


def _probs(*shape: int) -> Gen:
    return lambda rng: R.softmax(rng.standard_normal(shape))


def nn_cases() -> list[Case]:
    conv = [
        ("plain", (1, 2, 4, 4), (2, 2, 2, 2), {}),
        ("stride_pad_bias", (2, 3, 5, 6), (4, 3, 3, 3), {"stride": 2, "padding": 1}),
        ("rect", (1, 2, 7, 5), (3, 2, 3, 2), {"stride": (2, 1), "padding": (1, 0)}),
        ("empty_batch", (0, 2, 4, 4), (3, 2, 3, 3), {}),
        # Winograd F(2x2, 3x3): odd output sizes (padded to whole tiles, cropped).
        ("winograd", (2, 3, 7, 5), (4, 3, 3, 3), {"padding": 1, "algorithm": "winograd"}),
        ("winograd_empty", (0, 2, 4, 4), (3, 2, 3, 3), {"algorithm": "winograd"}),
    ]
    cases = []
    for label, xs, ws, kw in conv:
        if label == "stride_pad_bias":
            fn = lambda x, w, b, kw=kw: sg.conv2d(x, w, b, **kw)  # noqa: E731
            ref = lambda x, w, b, kw=kw: R.conv2d(x, w, b, **_pairs(kw))  # noqa: E731
            gens = [normal(*xs), normal(*ws), normal(ws[0])]
        else:
            fn = lambda x, w, kw=kw: sg.conv2d(x, w, **kw)  # noqa: E731
            ref = lambda x, w, kw=kw: R.conv2d(x, w, **_pairs(kw))  # noqa: E731
            gens = [normal(*xs), normal(*ws)]
        cases.append(Case(f"conv2d[{label}]", fn, gens, ref, ("conv2d",)))
    for kind, op in (("max", sg.max_pool2d), ("avg", sg.avg_pool2d)):
        for label, shape, kernel, stride, pad in [
            ("k2", (1, 2, 4, 6), 2, None, 0),
            ("k2crop", (2, 2, 5, 7), 2, None, 0),  # windows tile a cropped input
            ("k2p1", (1, 2, 5, 6), 2, 2, 1),  # ... a padded one
            ("k3s2p1", (2, 1, 5, 5), 3, 2, 1),
            ("rect", (1, 1, 5, 4), (2, 3), (1, 2), (1, 0)),
        ]:
            kp = kernel if isinstance(kernel, tuple) else (kernel, kernel)
            sp = (
                kp
                if stride is None
                else (stride if isinstance(stride, tuple) else (stride, stride))
            )
            pp = pad if isinstance(pad, tuple) else (pad, pad)
            cases.append(
                Case(
                    f"{kind}_pool2d[{label}]",
                    lambda x, op=op, k=kernel, s=stride, p=pad: op(x, k, s, p),
                    [distinct(*shape)],
                    lambda x, kind=kind, k=kp, s=sp, p=pp: R.pool2d(x, k, s, p, kind),
                    (f"{kind}_pool2d",),
                )
            )
    cases += [
        Case("cross_entropy[int]", sg.cross_entropy, [normal(5, 4), ints(0, 4, 5)], R.cross_entropy_int, ("cross_entropy",)),
        Case("cross_entropy[soft]", sg.cross_entropy, [normal(3, 4), _probs(3, 4)], R.cross_entropy_soft, ("cross_entropy",)),
        Case("cross_entropy[large]", sg.cross_entropy, [uniform(-1e3, 1e3, 4, 3), ints(0, 3, 4)], R.cross_entropy_int, ("cross_entropy",)),
        Case("mse", sg.mse, [normal(4, 3), normal(4, 3)], lambda a, b: np.mean((a - b) ** 2), ("mse",)),
        Case("hinge", sg.hinge, [normal(6), signs(6)], lambda s, y: np.mean(np.maximum(1 - y * s, 0)), ("hinge",), diff=(True, False)),
    ]
    return cases


def _pairs(kw: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """The reference's keyword pairs (the ``algorithm`` choice does not change values)."""
    return {k: v if isinstance(v, tuple) else (v, v) for k, v in kw.items() if k != "algorithm"}


def constructor_cases() -> list[Case]:
    return [
        Case("zeros", lambda x: x + sg.zeros(x.shape, x.dtype), [normal(2, 3)], lambda x: x, ("zeros", "constant")),
        Case("ones", lambda x: x * sg.ones((3,), x.dtype), [normal(2, 3)], lambda x: x, ("ones",)),
        Case("full", lambda x: x * sg.full((2, 1), 2.5, x.dtype), [normal(2, 3)], lambda x: x * 2.5, ("full",)),
        Case("zeros_like", lambda x: x + sg.zeros_like(x), [normal(3)], lambda x: x, ("zeros_like",)),
        Case("ones_like", lambda x: x * sg.ones_like(x), [normal(3)], lambda x: x, ("ones_like",)),
        Case("constant", lambda x: x * P.constant([1.0, -2.0, 3.0], x.dtype, like=x), [normal(2, 3)], lambda x: x * [1.0, -2.0, 3.0], ("constant",)),
        Case("arange", lambda x: x * sg.arange(0.5, 3.0, 0.5, dtype=x.dtype), [normal(2, 5)], lambda x: x * np.arange(0.5, 3.0, 0.5), ("arange",)),
        Case("arange[int]", lambda x: sg.arange(x.shape[0]) * 2, [normal(4)], lambda x: np.arange(4, dtype=np.int32) * 2, ("arange",), grad=False),
        Case("eye", lambda x: x * sg.eye(3, 4, k=1, dtype=x.dtype), [normal(3, 4)], lambda x: x * np.eye(3, 4, k=1), ("eye",)),
        Case("iota", lambda x: x * P.iota(x.shape, 1, x.dtype, like=x), [normal(2, 4)], lambda x: x * np.arange(4), ("iota",)),
        Case("rand", lambda x: x * sg.rand(x.shape, seed=3, dtype=x.dtype), [normal(3, 5)], lambda x: x * R.uniform((3, 5), 3), ("rand", "random_uniform")),
        Case("prim:random", lambda x: x + P.random_uniform(x.shape, 11, x.dtype, like=x), [normal(4)], lambda x: x + R.uniform((4,), 11), ("random_uniform",)),
        Case("randn", lambda x: x * sg.randn(x.shape, seed=5, dtype=x.dtype), [normal(2, 3)], lambda x: x * R.normal((2, 3), 5), ("randn",), rtol32=1e-3),
        Case("dropout", lambda x: sg.dropout(x, 0.25, seed=9), [normal(4, 5)], lambda x: np.where(R.uniform((4, 5), 9) >= 0.25, x / 0.75, 0.0), ("dropout",)),
        Case("neg[fixed]", lambda x: -x, [fixed([[1.5, -2.0]])], np.negative, ("neg",)),
    ]


def _batch_norm_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    axes = (0, 2, 3)
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)


def _group_norm_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    g = x.reshape(x.shape[0], groups, -1)
    mu = g.mean(axis=-1, keepdims=True)
    var = ((g - mu) ** 2).mean(axis=-1, keepdims=True)
    y = ((g - mu) / np.sqrt(var + 1e-5)).reshape(x.shape)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return y * w.reshape(shape) + b.reshape(shape)


def parity_cases() -> list[Case]:
    """NumPy/PyTorch-parity ops and norms (issue 14): aliases, squeeze/expand, indexing forms."""
    return [
        Case("batch_norm[train]", lambda x, w, b: sg.batch_norm(x, w, b, P.zeros_like(w), P.ones_like(w), training=True)[0], [normal(4, 3, 2, 2), normal(3), normal(3)], _batch_norm_ref, ("batch_norm",)),
        Case("batch_norm[stats]", lambda x, m, v: sg.batch_norm(x, None, None, m, v, training=True, momentum=0.25)[2], [normal(5, 2, 3), uniform(0.5, 2.0, 2), uniform(0.5, 2.0, 2)], lambda x, m, v: 0.75 * v + 0.25 * x.var(axis=(0, 2), ddof=1), ("batch_norm",), grad=False),
        Case("batch_norm[eval]", lambda x, m, v: sg.batch_norm(x, None, None, m, v, training=False)[0], [normal(3, 2, 4), normal(2), uniform(0.5, 2.0, 2)], lambda x, m, v: (x - m.reshape(1, 2, 1)) / np.sqrt(v.reshape(1, 2, 1) + 1e-5), ("batch_norm",)),
        Case("group_norm", lambda x, w, b: sg.group_norm(x, 2, w, b), [normal(2, 4, 3), normal(4), normal(4)], lambda x, w, b: _group_norm_ref(x, w, b, 2), ("group_norm",)),
        Case("clip", lambda x: sg.clip(x, -0.5, 0.7), [normal(3, 4)], lambda x: np.clip(x, -0.5, 0.7), ("clip", "maximum", "minimum")),
        Case("squeeze", lambda x: sg.squeeze(x, (0, 2)), [normal(1, 3, 1, 2)], lambda x: np.squeeze(x, (0, 2)), ("squeeze",)),
        Case("expand_dims", lambda x: sg.expand_dims(x, (0, -1)), [normal(3, 2)], lambda x: np.expand_dims(x, (0, -1)), ("expand_dims",)),
        Case("unsqueeze", lambda x: sg.unsqueeze(x, 1), [normal(3, 2)], lambda x: np.expand_dims(x, 1), ("unsqueeze",)),
        Case("cat", lambda a, b: sg.cat([a, b], 1), [normal(2, 3), normal(2, 1)], lambda a, b: np.concatenate([a, b], 1), ("cat", "concatenate")),
        Case("index[ellipsis]", lambda x: x[..., 1], [normal(2, 3, 4)], lambda x: x[..., 1], ("slice",)),
        Case("index[None,neg step]", lambda x: x[None, ::-2, 1:], [normal(5, 3)], lambda x: x[None, ::-2, 1:], ("slice", "gather")),
        Case("index[arrays]", lambda x: x[[0, 2, 2], :, [1, -1, 0]], [normal(3, 2, 4)], lambda x: x[[0, 2, 2], :, [1, -1, 0]], ("gather",)),
        Case("index[adjacent arrays]", lambda x: x[:, [[1], [0]], [0, 2]], [normal(2, 3, 4)], lambda x: x[:, [[1], [0]], [0, 2]], ("gather",)),
        Case("dropout[key]", lambda x: sg.dropout(x, 0.3, sg.random.key(3)), [normal(4, 5)], lambda x: np.where(R.keyed_uniform((4, 5), 3) >= 0.3, x / 0.7, 0.0), ("dropout",)),
    ]


_ERF = np.frompyfunc(math.erf, 1, 1)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ERF(x), dtype=np.float64)


def _softplus(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    return np.where(beta * x > threshold, x, np.logaddexp(0.0, beta * x) / beta)


def _conv1d_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, padding: int) -> np.ndarray:
    return R.conv2d(x[:, :, None, :], w[:, :, None, :], b, (1, stride), (0, padding))[:, :, 0, :]


def _resize_ref(x: np.ndarray, size: tuple[int, ...], mode: str, align_corners: bool = False) -> np.ndarray:
    """Per-output-pixel loops in PyTorch's conventions (scale = in / out): nearest picks
    ``floor(dst * scale)``; linear blends the two neighbours of the half-pixel source
    ``(dst + 0.5) * scale - 0.5`` (clamped at 0), or ``dst * (in - 1) / (out - 1)``."""
    out = x
    for axis, n_out in enumerate(size, start=2):
        n_in = out.shape[axis]
        pieces = []
        for d in range(n_out):
            if mode == "nearest":
                pieces.append(np.take(out, [min(int(np.floor(d * n_in / n_out)), n_in - 1)], axis))
                continue
            if align_corners:
                src = d * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
            else:
                src = max((d + 0.5) * n_in / n_out - 0.5, 0.0)
            lo = min(int(np.floor(src)), n_in - 1)
            hi = min(lo + 1, n_in - 1)
            t = src - lo
            pieces.append(np.take(out, [lo], axis) * (1 - t) + np.take(out, [hi], axis) * t)
        out = np.concatenate(pieces, axis)
    return out


def _conv_transpose_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, s: int, p: int, op: int) -> np.ndarray:
    """Scatter form: every input pixel adds ``x * w`` into a stride-``s`` placed window,
    then ``p`` is cropped from each side (``op`` extra rows/cols at the end)."""
    n, _, h, wd = x.shape
    cout, kh, kw = w.shape[1], w.shape[2], w.shape[3]
    full = np.zeros((n, cout, (h - 1) * s + kh + op, (wd - 1) * s + kw + op))
    for i in range(h):
        for j in range(wd):
            full[:, :, i * s : i * s + kh, j * s : j * s + kw] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    out = full[:, :, p : full.shape[2] - p, p : full.shape[3] - p]
    return out if b is None else out + b[None, :, None, None]


def _ce_classes_on(axis: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def ref(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
        moved = np.moveaxis(logits, axis, -1)
        flat = moved.reshape(-1, moved.shape[-1])
        if labels.shape == logits.shape:
            return R.cross_entropy_soft(flat, np.moveaxis(labels, axis, -1).reshape(flat.shape))
        return R.cross_entropy_int(flat, labels.reshape(-1))

    return ref


def issue25_cases() -> list[Case]:
    """Activations, boolean/norm reductions, triangles, rearrangements, conv1d, resampling,
    N-d cross-entropy and erf (issue 25), against NumPy/math (PyTorch: tests/test_ops25_torch.py)."""
    return [
        Case("silu", sg.silu, [normal(3, 5)], lambda x: x * R.sigmoid(x), ("silu",)),
        Case("softplus", sg.softplus, [uniform(-30, 30, 4, 5)], _softplus, ("softplus",)),
        Case("softplus[beta_threshold]", lambda x: sg.softplus(x, beta=2.0, threshold=1.0), [normal(4, 5)], lambda x: _softplus(x, 2.0, 1.0), ("softplus",)),
        Case("elu", lambda x: sg.elu(x, 0.7), [_away_from_zero(normal(3, 4))], lambda x: np.where(x > 0, x, 0.7 * np.expm1(x)), ("elu",)),
        Case("leaky_relu", lambda x: sg.leaky_relu(x, 0.2), [_away_from_zero(normal(3, 4))], lambda x: np.where(x > 0, x, 0.2 * x), ("leaky_relu",)),
        Case("erf", sg.erf, [uniform(-3, 3, 4, 6)], _erf, ("erf",)),
        Case("erf[empty]", sg.erf, [normal(0, 3)], _erf, ("erf",)),
        Case("gelu[none]", lambda x: sg.gelu(x, approximate="none"), [normal(3, 7)], lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))), ("gelu", "erf")),
        Case("argmin", lambda x: sg.argmin(x, axis=0), [distinct(5, 3)], lambda x: np.argmin(x, axis=0).astype(np.int32), ("argmin",), grad=False),
        Case("all", lambda x: sg.all(x, axis=1), [bools(4, 3)], lambda x: np.all(x, axis=1), ("all",), grad=False),
        Case("any[keepdims]", lambda x: sg.any(x, axis=0, keepdims=True), [bools(3, 4)], lambda x: np.any(x, axis=0, keepdims=True), ("any",), grad=False),
        Case("any[float]", lambda x: sg.any(x > 0.5), [normal(3, 4)], lambda x: np.any(x > 0.5), ("any",), grad=False),
        Case("all[empty]", lambda x: sg.all(x, axis=0), [bools(0, 3)], lambda x: np.all(x, axis=0), ("all",), grad=False),
        Case("norm", lambda x: sg.norm(x), [normal(3, 4)], np.linalg.norm, ("norm",)),
        Case("norm[p3_keepdims]", lambda x: sg.norm(x, 3, axis=1, keepdims=True), [_away_from_zero(normal(3, 4))], lambda x: np.linalg.norm(x, 3, axis=1, keepdims=True), ("norm",)),
        Case("norm[l1]", lambda x: sg.norm(x, 1, axis=0), [_away_from_zero(normal(3, 4))], lambda x: np.linalg.norm(x, 1, axis=0), ("norm",)),
        Case("norm[inf]", lambda x: sg.norm(x, math.inf, axis=-1), [distinct(3, 4)], lambda x: np.linalg.norm(x, np.inf, axis=-1), ("norm",)),
        Case("norm[fro]", lambda x: sg.norm(x, "fro", axis=(0, 2)), [normal(2, 3, 4)], lambda x: np.linalg.norm(np.moveaxis(x, 1, -1), "fro", axis=(0, 1)), ("norm",)),
        Case("tril", lambda x: sg.tril(x), [normal(2, 4, 3)], np.tril, ("tril",)),
        Case("tril[k]", lambda x: sg.tril(x, -1), [normal(4, 5)], lambda x: np.tril(x, -1), ("tril",)),
        Case("triu[k]", lambda x: sg.triu(x, 2), [normal(3, 5)], lambda x: np.triu(x, 2), ("triu",)),
        Case("flip", lambda x: sg.flip(x, (0, 2)), [normal(3, 2, 4)], lambda x: np.flip(x, (0, 2)), ("flip",)),
        Case("flip[all]", sg.flip, [normal(4, 3)], np.flip, ("flip",)),
        Case("roll", lambda x: sg.roll(x, (1, -2), (0, 1)), [normal(3, 5)], lambda x: np.roll(x, (1, -2), (0, 1)), ("roll",)),
        Case("roll[flat]", lambda x: sg.roll(x, 7), [normal(2, 3)], lambda x: np.roll(x, 7), ("roll",)),
        Case("repeat", lambda x: sg.repeat(x, [2, 0, 3], axis=1), [normal(2, 3)], lambda x: np.repeat(x, [2, 0, 3], axis=1), ("repeat",)),
        Case("repeat[flat]", lambda x: sg.repeat(x, 2), [normal(2, 2)], lambda x: np.repeat(x, 2), ("repeat",)),
        Case("tile", lambda x: sg.tile(x, (2, 1, 3)), [normal(2, 3)], lambda x: np.tile(x, (2, 1, 3)), ("tile",)),
        Case("conv1d", lambda x, w, b: sg.conv1d(x, w, b, stride=2, padding=1), [normal(2, 3, 9), normal(4, 3, 3), normal(4)], lambda x, w, b: _conv1d_ref(x, w, b, 2, 1), ("conv1d", "conv2d")),
        Case("interpolate[nearest]", lambda x: sg.interpolate(x, size=(5, 3)), [normal(1, 2, 3, 4)], lambda x: _resize_ref(x, (5, 3), "nearest"), ("interpolate",)),
        Case("interpolate[bilinear]", lambda x: sg.interpolate(x, size=(7, 3), mode="bilinear"), [normal(2, 2, 3, 5)], lambda x: _resize_ref(x, (7, 3), "linear"), ("interpolate",)),
        Case("interpolate[bilinear_corners]", lambda x: sg.interpolate(x, size=(5, 4), mode="bilinear", align_corners=True), [normal(1, 2, 3, 3)], lambda x: _resize_ref(x, (5, 4), "linear", True), ("interpolate",)),
        Case("upsample", lambda x: sg.upsample(x, 2, mode="bilinear"), [normal(1, 1, 3, 2)], lambda x: _resize_ref(x, (6, 4), "linear"), ("upsample", "interpolate")),
        Case("cross_entropy[nd]", lambda x, y: sg.cross_entropy(x, y, axis=1), [normal(2, 4, 3, 2), ints(0, 4, 2, 3, 2)], _ce_classes_on(1), ("cross_entropy",)),
        Case("cross_entropy[nd_soft]", lambda x, y: sg.cross_entropy(x, y, axis=1), [normal(2, 3, 4), lambda rng: np.moveaxis(R.softmax(rng.standard_normal((2, 4, 3))), 2, 1)], _ce_classes_on(1), ("cross_entropy",)),
        Case("cumsum", lambda x: sg.cumsum(x, axis=1), [normal(3, 11)], lambda x: np.cumsum(x, axis=1), ("cumsum",)),
        Case("cumsum[flat]", sg.cumsum, [normal(2, 3)], np.cumsum, ("cumsum",)),
        Case("cumsum[int]", lambda x: sg.cumsum(x, axis=0), [ints(-5, 5, 6, 2)], lambda x: np.cumsum(x, axis=0).astype(np.int32), ("cumsum",), grad=False),
        Case("conv_transpose2d", lambda x, w, b: sg.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1), [normal(2, 3, 3, 4), normal(3, 2, 3, 3), normal(2)], lambda x, w, b: _conv_transpose_ref(x, w, b, 2, 1, 1), ("conv_transpose2d", "conv2d")),
        Case("conv_transpose2d[plain]", lambda x, w: sg.conv_transpose2d(x, w), [normal(1, 2, 3, 3), normal(2, 3, 2, 2)], lambda x, w: _conv_transpose_ref(x, w, None, 1, 0, 0), ("conv_transpose2d",)),
        Case("cross_entropy[last]", sg.cross_entropy, [normal(2, 3, 5), ints(0, 5, 2, 3)], _ce_classes_on(-1), ("cross_entropy",)),
    ]


def _ties(*shape: int) -> Gen:
    """Few distinct values (halves in [-1.5, 1.5]): many ties, exact in every float type."""
    return lambda rng: rng.integers(-3, 4, shape).astype(np.float64) * 0.5


def _with_nans(*shape: int) -> Gen:
    def gen(rng: np.random.Generator) -> np.ndarray:
        x = rng.standard_normal(shape)
        x.reshape(-1)[:: 5] = np.nan
        return x

    return gen


def _desc_positions(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable descending order (ties in their original order) without NaN: argsort of -x."""
    return np.argsort(-x, axis=axis, kind="stable").astype(np.int32)


def sorting_cases() -> list[Case]:
    """sort / argsort / topk: both directions, several axes, ties, k = 1 and k = n, both
    kernel methods (a short top-k is a bounded selection, the rest a merge sort)."""
    stable = lambda x, axis=-1: np.argsort(x, axis=axis, kind="stable").astype(np.int32)  # noqa: E731
    return [
        Case("sort", sg.sort, [distinct(4, 7)], lambda x: np.sort(x, axis=-1), ("sort", "argsort", "gather")),
        Case("sort[axis0_desc]", lambda x: sg.sort(x, axis=0, descending=True), [distinct(5, 3, 4)], lambda x: -np.sort(-x, axis=0), ("sort",)),
        Case("sort[long]", lambda x: x.sort(axis=1), [distinct(3, 70)], lambda x: np.sort(x, axis=1), ("sort",)),
        Case("sort[ties]", sg.sort, [_ties(4, 9)], np.sort, ("sort",), grad=False),
        Case("sort[nan]", lambda x: sg.sort(x, axis=0), [_with_nans(6, 4)], lambda x: np.sort(x, axis=0), ("sort",), grad=False),
        Case("sort[nan_desc]", lambda x: sg.sort(x, descending=True), [_with_nans(3, 8)], lambda x: np.flip(np.sort(x), -1), ("sort",), grad=False),
        Case("argsort", lambda x: sg.argsort(x, axis=1), [_ties(3, 20)], lambda x: stable(x, 1), ("argsort",), grad=False),
        Case("argsort[desc_ties]", lambda x: sg.argsort(x, descending=True), [_ties(5, 40)], _desc_positions, ("argsort",), grad=False),
        Case("argsort[axis0]", lambda x: x.argsort(dim=0), [_ties(9, 2, 3)], lambda x: stable(x, 0), ("argsort",), grad=False),
        Case("argsort[int]", sg.argsort, [ints(-4, 4, 3, 33)], stable, ("argsort",), grad=False),
        Case("argsort[empty]", sg.argsort, [normal(0, 3)], stable, ("argsort",), grad=False),
        Case("topk", lambda x: sg.topk(x, 3)[0], [distinct(4, 10)], lambda x: -np.sort(-x)[:, :3], ("topk", "argsort")),
        Case("topk[select]", lambda x: sg.topk(x, 5)[0], [distinct(3, 50)], lambda x: -np.sort(-x)[:, :5], ("topk",)),
        Case("topk[smallest_axis0]", lambda x: sg.topk(x, 2, axis=0, largest=False)[0], [distinct(6, 3, 2)], lambda x: np.sort(x, axis=0)[:2], ("topk",)),
        Case("topk[k1]", lambda x: sg.topk(x, 1)[0], [distinct(5, 6)], lambda x: np.max(x, axis=-1, keepdims=True), ("topk",)),
        Case("topk[kn]", lambda x: x.topk(7)[0], [distinct(2, 7)], lambda x: -np.sort(-x), ("topk",)),
        Case("topk[indices]", lambda x: sg.topk(x, 4, dim=0)[1], [_ties(12, 3)], lambda x: _desc_positions(x, 0)[:4], ("topk",), grad=False),
        Case("topk[indices_select]", lambda x: sg.topk(x, 3, largest=False)[1], [_ties(2, 60)], lambda x: stable(x)[:, :3], ("topk",), grad=False),
    ]


# Core ML has no int64 or uint8 type: the ANE lowering refuses them by name.
NO_ANE_INT64 = r"dtype int64, which Core ML does not compute in.*x\.int\(\)"
NO_ANE_UINT8 = r"dtype uint8, which Core ML does not compute in"


def dtype_cases() -> list[Case]:
    """int64 and uint8 (issue 25): casts, arithmetic (int64 exact; uint8 wraps modulo 256
    like NumPy's), int64 sums and indices, uint8 images to float, bool masks."""
    i64 = np.int64
    return [
        Case("int64[cast]", lambda x: (x * 3.0).long(), [normal(2, 5)], lambda x: np.trunc(x * 3.0).astype(i64), ("cast",), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[arith]", lambda i: (i.long() * 3 + 2**40) - i.long(), [ints(-1000, 1000, 3, 4)], lambda i: (i.astype(i64) * 3 + 2**40) - i.astype(i64), ("add", "mul", "sub", "cast"), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[div]", lambda i, j: i.long() * 2**33 / j.long(), [ints(-1000, 1000, 3, 4), nonzero_ints(3, 4)], lambda i, j: np.trunc(i.astype(np.float64) * 2**33 / j).astype(i64), ("div",), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[pow_neg]", lambda i: -(i.long() ** 3), [ints(-2000, 2000, 5)], lambda i: -(i.astype(i64) ** 3), ("pow", "neg"), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[sum]", lambda i: sg.sum(i.long() * 2**33, axis=1), [ints(-1000, 1000, 3, 7)], lambda i: np.sum(i.astype(i64) * 2**33, axis=1), ("sum", "reduce_sum"), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[max_min]", lambda i: sg.max(i.long() - 2**40, axis=0) + sg.min(i.long(), axis=0), [ints(-1000, 1000, 4, 3)], lambda i: np.max(i.astype(i64) - 2**40, axis=0) + np.min(i, axis=0), ("max", "min", "reduce_max"), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[take]", lambda x, i: sg.take(x, i.long(), axis=1), [normal(3, 5), ints(-5, 5, 4)], lambda x, i: np.take(x, i, axis=1), ("take", "gather"), diff=(True, False), ane_error=NO_ANE_INT64),
        Case("int64[argmax]", lambda x: sg.argmax(x, axis=0, dtype=sg.int64), [distinct(5, 3)], lambda x: np.argmax(x, axis=0).astype(i64), ("argmax",), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[argmin]", lambda x: sg.argmin(x, axis=1, dtype=sg.int64), [distinct(3, 5)], lambda x: np.argmin(x, axis=1).astype(i64), ("argmin",), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[arange]", lambda x: sg.arange(2**40, 2**40 + 3 * x.shape[0], 3, dtype=sg.int64), [normal(4)], lambda x: np.arange(2**40, 2**40 + 12, 3, dtype=i64), ("arange",), grad=False, ane_error=NO_ANE_INT64),
        Case("int64[one_hot]", lambda i: sg.one_hot(i.long(), 5), [ints(0, 5, 2, 3)], lambda i: np.eye(5)[i], ("one_hot",), grad=False, keeps_dtype=False, ane_error=NO_ANE_INT64),
        Case("int64[cross_entropy]", lambda x, y: sg.cross_entropy(x, y.long()), [normal(4, 5), ints(0, 5, 4)], R.cross_entropy_int, ("cross_entropy",), diff=(True, False), ane_error=NO_ANE_INT64),
        Case("uint8[to_float]", lambda b, x: b.astype(x.dtype) / 255.0 * x, [bytes_(2, 5), normal(2, 5)], lambda b, x: b / 255.0 * x, ("cast", "div", "mul"), diff=(False, True), ane_error=NO_ANE_UINT8),
        Case("uint8[from_float]", lambda x: x.byte(), [uniform(0, 255.9, 3, 4)], lambda x: x.astype(np.uint8), ("cast",), grad=False, ane_error=NO_ANE_UINT8),
        Case("uint8[arith]", lambda b: b * 3 + 200, [bytes_(3, 4)], lambda b: b * 3 + 200, ("mul", "add"), grad=False, ane_error=NO_ANE_UINT8),
        Case("uint8[sub_neg]", lambda a, b: -(a - b), [bytes_(3, 4), bytes_(3, 4)], lambda a, b: -(a - b), ("sub", "neg"), grad=False, ane_error=NO_ANE_UINT8),
        Case("uint8[div_pow]", lambda a, b: a / b + b**2, [bytes_(3, 4), lambda rng: rng.integers(1, 256, (3, 4)).astype(np.uint8)], lambda a, b: a // b + b**2, ("div", "pow"), grad=False, ane_error=NO_ANE_UINT8),
        Case("uint8[where_mask]", lambda b: sg.where(b > 128, b, 255 - b), [bytes_(3, 5)], lambda b: np.where(b > 128, b, 255 - b), ("where", "gt"), grad=False, ane_error=NO_ANE_UINT8),
        Case("uint8[max_min]", lambda b: sg.maximum(sg.max(b, axis=0), sg.min(b, axis=0) + 100), [bytes_(4, 6)], lambda b: np.maximum(b.max(axis=0), b.min(axis=0) + 100), ("max", "min", "maximum"), grad=False, ane_error=NO_ANE_UINT8),
        Case("bool[masks]", lambda x: sg.where(sg.all(x > -1.5, axis=1, keepdims=True), (x > 0).byte().bool(), sg.any(x > 1.0)), [normal(4, 3)], lambda x: np.where(np.all(x > -1.5, axis=1, keepdims=True), x > 0, np.any(x > 1.0)), ("where", "all", "any", "cast"), grad=False, ane_error=NO_ANE_UINT8),
        Case("cast[methods]", lambda x: (x.double() * 2.0).astype(x.dtype) + x.int().float().astype(x.dtype), [normal(3, 4)], lambda x: x * 2.0 + np.trunc(x), ("cast",), fd_step=1e-3),
    ]


CASES: list[Case] = [
    *elementwise_cases(),
    *reduction_cases(),
    *layout_cases(),
    *contraction_cases(),
    *nn_cases(),
    *constructor_cases(),
    *parity_cases(),
    *issue25_cases(),
    *sorting_cases(),
    *dtype_cases(),
]
GRAD_CASES = [c for c in CASES if c.grad]
# fmt: on
