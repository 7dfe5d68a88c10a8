"""The vectorized erf (ops/special.py) against ``math.erf``, the libm reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from shapegrad.ops.special import erf


def _math_erf(x: np.ndarray) -> np.ndarray:
    return np.array([math.erf(v) for v in x.astype(np.float64).ravel()]).reshape(x.shape)


def test_erf_matches_libm_to_a_few_ulps_over_the_whole_range() -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            np.linspace(-7.0, 7.0, 20001),
            rng.standard_normal(5000) * 3,
            np.array([1e-300, -1e-300, 5e-324, 0.125, 0.12499999999, 5.99999999, 6.0, 40.0]),
            np.array([2.0**-k for k in range(1, 60)]),
        ]
    )
    ref = _math_erf(x)
    got = erf(x)
    np.testing.assert_allclose(got, ref, rtol=4e-15, atol=0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.0, 0.0), (np.inf, 1.0), (-np.inf, -1.0), (100.0, 1.0), (-100.0, -1.0)],
)
def test_erf_special_values_are_exact(value: float, expected: float) -> None:
    assert erf(np.array([value]))[0] == expected


def test_erf_keeps_signed_zero_and_nan() -> None:
    out = erf(np.array([-0.0, np.nan, -np.nan]))
    assert out[0] == 0.0 and np.signbit(out[0])
    assert np.isnan(out[1]) and np.isnan(out[2])


def test_erf_rounds_once_to_the_input_float_dtype_and_widens_integers() -> None:
    x32 = np.linspace(-4, 4, 1001, dtype=np.float32)
    got = erf(x32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _math_erf(x32).astype(np.float32))
    ints = erf(np.arange(-3, 4, dtype=np.int32))
    assert ints.dtype == np.float64
    np.testing.assert_allclose(ints, _math_erf(np.arange(-3, 4)), rtol=4e-15)


def test_erf_of_a_scalar_and_of_a_matrix_keeps_the_shape() -> None:
    assert erf(np.array(0.5)).shape == ()
    np.testing.assert_allclose(erf(np.array(0.5)), math.erf(0.5), rtol=4e-15)
    m = np.linspace(-3, 3, 12).reshape(3, 4)
    np.testing.assert_allclose(erf(m), _math_erf(m), rtol=4e-15)
