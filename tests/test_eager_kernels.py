"""NumPy kernels of the eager interpreter that replace a slower NumPy call: the
branch-free ``select`` of large where's and the planned two-operand einsum. Both are
checked against the NumPy call they replace (bit for bit / to float tolerance)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.ops.einsum_plan import plan_einsum

RNG = np.random.default_rng(11)


# --- the branch-free select of large where's -------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_large_select_is_bit_identical_to_np_where(dtype: Any) -> None:
    from shapegrad.ops.reference import SELECT_BITWISE_MIN, select

    n = SELECT_BITWISE_MIN + 3
    a = RNG.standard_normal(n).astype(dtype)
    b = RNG.standard_normal(n).astype(dtype)
    if dtype != np.int32:
        a[:5] = [np.nan, np.inf, -0.0, -np.inf, 0.0]
    zero, neg_zero = dtype(0), dtype(-0.0) if dtype != np.int32 else dtype(0)
    cases = [(a, b), (a, dtype(3)), (dtype(2), b), (a, zero), (zero, a), (a, neg_zero)]
    cases += [(dtype(1), neg_zero), (neg_zero, b)]
    cases.append((np.broadcast_to(a[:1], (n,)), b))  # zero-stride views ...
    cases.append((a, np.broadcast_to(zero, (n,))))  # ... of a zero too (the one-AND form)
    # random, all-False (a max's tie mask: one branch, no blend) and all-True masks
    for mask in (RNG.random(n) < 0.5, np.zeros(n, bool), np.ones(n, bool)):
        for x, y in cases:
            got, expected = select(mask, x, y), np.where(mask, x, y)
            assert got.dtype == expected.dtype and got.shape == expected.shape
            assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(expected).tobytes()
    # and through the op, with gradients
    x = sg.tensor(a.astype(np.float64) if dtype != np.int32 else a)
    np.testing.assert_array_equal(
        sg.where(sg.tensor(mask), x, 0.0 if dtype != np.int32 else 0).numpy(),
        np.where(mask, x.numpy(), 0),
    )


@pytest.mark.parametrize(
    "spec,shape_a,shape_b",
    [
        ("ab,bc->ac", (3, 4), (4, 5)),
        ("ab,cb->ac", (3, 4), (5, 4)),
        ("ba,bc->ac", (4, 3), (4, 5)),
        ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
        ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
        ("ij,ij->i", (3, 4), (3, 4)),
        ("ij,ij->", (3, 4), (3, 4)),
        ("i,j->ij", (3,), (4,)),
        ("abc,cd->dba", (2, 3, 4), (4, 5)),
        ("ab,c->ac", (3, 4), (5,)),  # c summed inside b alone
        ("ij,jk->", (3, 4), (4, 5)),
        ("ab,bc->ca", (3, 0), (0, 5)),  # an empty contraction is zeros
        ("ab,bc->ac", (0, 4), (4, 5)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_einsum_plan_matches_np_einsum(
    spec: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...], dtype: Any
) -> None:
    a = RNG.standard_normal(shape_a).astype(dtype)
    b = RNG.standard_normal(shape_b).astype(dtype)
    got, expected = plan_einsum(spec, shape_a, shape_b)(a, b), np.einsum(spec, a, b)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # through the eager primitive (and its VJP, which is einsums again)
    ta, tb = sg.tensor(a), sg.tensor(b)
    np.testing.assert_allclose(sg.einsum(spec, ta, tb).numpy(), expected, rtol=1e-5, atol=1e-5)
