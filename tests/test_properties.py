"""Property tests (hypothesis): broadcasting and einsum agree with NumPy on random inputs."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shapegrad as sg

SETTINGS = settings(max_examples=150, deadline=None)

dims = st.integers(min_value=0, max_value=3)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)


def _numpy_broadcast(*ss: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*ss))
    except ValueError:
        return None


@SETTINGS
@given(shapes, shapes)
def test_binary_broadcast_matches_numpy(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    a = sg.tensor(np.arange(int(np.prod(sa)), dtype=np.float64).reshape(sa))
    b = sg.tensor(np.ones(sb))
    want = _numpy_broadcast(sa, sb)
    if want is None:
        with pytest.raises(sg.ShapeError, match="cannot broadcast"):
            a + b
        return
    out = a * 2.0 + b
    assert out.shape == want
    np.testing.assert_array_equal(out.numpy(), a.numpy() * 2.0 + b.numpy())


@SETTINGS
@given(shapes, shapes, shapes)
def test_where_broadcast_matches_numpy(
    sc: tuple[int, ...], sa: tuple[int, ...], sb: tuple[int, ...]
) -> None:
    cond = sg.tensor(np.ones(sc, dtype=bool))
    a, b = sg.tensor(np.zeros(sa)), sg.tensor(np.ones(sb))
    want = _numpy_broadcast(sc, sa, sb)
    if want is None:
        with pytest.raises(sg.ShapeError):
            sg.where(cond, a, b)
        return
    assert sg.where(cond, a, b).shape == want


@SETTINGS
@given(shapes, shapes)
def test_broadcast_gradients_count_the_copies(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    out_shape = _numpy_broadcast(sa, sb)
    if out_shape is None:
        return
    ga, gb = sg.grad(lambda a, b: sg.sum(a + b), argnums=(0, 1))(
        sg.tensor(np.zeros(sa)), sg.tensor(np.zeros(sb))
    )
    total = int(np.prod(out_shape))
    # d sum(a + b) / d a[i] = number of output elements a[i] was copied to.
    for g, s in ((ga, sa), (gb, sb)):
        assert g.shape == s
        copies = total // max(int(np.prod(s)), 1) if int(np.prod(s)) else 0
        np.testing.assert_array_equal(g.numpy(), np.full(s, float(copies)))


# --- einsum ---------------------------------------------------------------------------------

LETTERS = "abcde"


@st.composite
def einsum_problems(draw: Any) -> tuple[str, list[np.ndarray]]:
    """A random valid einsum: 1-3 operands, repeated letters, '...', size-1 broadcasting,
    implicit or explicit output."""
    sizes = {c: draw(st.integers(1, 3)) for c in LETTERS}
    n_ops = draw(st.integers(1, 3))
    use_ellipsis = draw(st.booleans())
    ell_shape = draw(st.lists(st.integers(1, 3), max_size=2))
    terms, arrays = [], []
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    for _ in range(n_ops):
        letters = draw(st.lists(st.sampled_from(LETTERS), max_size=3))
        shape = []
        for c in letters:
            # A letter is size 1 in some operands (broadcast) but never twice within one.
            repeated = letters.count(c) > 1
            shape.append(1 if not repeated and draw(st.integers(0, 4)) == 0 else sizes[c])
        term = "".join(letters)
        if use_ellipsis and draw(st.booleans()):
            k = draw(st.integers(0, len(ell_shape)))
            own = [1 if draw(st.booleans()) else d for d in ell_shape[len(ell_shape) - k :]]
            at = draw(st.integers(0, len(letters)))
            term = term[:at] + "..." + term[at:]
            shape = shape[:at] + own + shape[at:]
        terms.append(term)
        arrays.append(rng.standard_normal(shape))
    spec = ",".join(terms)
    if draw(st.booleans()):
        present = sorted({c for t in terms for c in t if c in string.ascii_letters})
        out = draw(st.permutations(present)).copy()[: draw(st.integers(0, len(present)))]
        if any("..." in t for t in terms):
            out.insert(draw(st.integers(0, len(out))), "...")
        spec += "->" + "".join(out)
    return spec, arrays


@SETTINGS
@given(einsum_problems())
def test_einsum_matches_numpy(problem: tuple[str, list[np.ndarray]]) -> None:
    spec, arrays = problem
    try:
        want = np.einsum(spec, *arrays)
    except ValueError:
        with pytest.raises(sg.ShapeError):
            sg.einsum(spec, *[sg.tensor(a) for a in arrays])
        return
    got = sg.einsum(spec, *[sg.tensor(a) for a in arrays])
    assert got.shape == want.shape, spec
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-10, err_msg=spec)


@settings(max_examples=30, deadline=None)
@given(einsum_problems())
def test_einsum_gradients_match_finite_differences(problem: tuple[str, list[np.ndarray]]) -> None:
    spec, arrays = problem
    try:
        out = np.einsum(spec, *arrays)
    except ValueError:
        return
    ct = np.random.default_rng(1).standard_normal(np.shape(out))

    def objective(*xs: np.ndarray) -> float:
        return float(np.sum(np.einsum(spec, *xs) * ct))

    argnums = tuple(range(len(arrays)))
    grads = sg.grad(lambda *xs: sg.sum(sg.einsum(spec, *xs) * sg.tensor(ct)), argnums=argnums)(
        *[sg.tensor(a) for a in arrays]
    )
    h = 1e-6
    for k, (a, g) in enumerate(zip(arrays, grads, strict=True)):
        assert g.shape == a.shape
        numeric = np.zeros(a.shape)
        for index in np.ndindex(a.shape):
            hi, lo = a.copy(), a.copy()
            hi[index] += h
            lo[index] -= h
            xs_hi = [hi if j == k else x for j, x in enumerate(arrays)]
            xs_lo = [lo if j == k else x for j, x in enumerate(arrays)]
            numeric[index] = (objective(*xs_hi) - objective(*xs_lo)) / (2 * h)
        np.testing.assert_allclose(g.numpy(), numeric, rtol=1e-6, atol=1e-7, err_msg=spec)
