"""Initializers: statistics against closed forms, reproducibility, dtypes, errors."""

import math

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.nn import init


def _rng(*seed: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(seed))))


def test_kaiming_normal_std_matches_he_formula() -> None:
    shape = (800, 500)
    w = init.kaiming(shape, seed=3, dtype="float64").numpy()
    expected = math.sqrt(2.0 / 500)  # ReLU gain sqrt(2), fan_in = 500
    assert w.shape == shape
    assert abs(w.std() / expected - 1) < 0.01
    assert abs(w.mean()) < 4 * expected / math.sqrt(w.size)


def test_kaiming_uniform_bound_and_std() -> None:
    w = init.kaiming_uniform((600, 400), seed=1, dtype="float64").numpy()
    bound = math.sqrt(6.0 / 400)
    assert np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.999 * bound
    assert abs(w.std() / math.sqrt(2.0 / 400) - 1) < 0.01


def test_kaiming_fan_out_mode_and_conv_fans() -> None:
    assert init.fans((64, 3, 3, 3)) == (27, 576)
    w = init.Kaiming(mode="fan_out")((200, 30, 3, 3), seed=0, dtype="float64").numpy()
    assert abs(w.std() / math.sqrt(2.0 / (200 * 9)) - 1) < 0.02


def test_xavier_uniform_bound_and_normal_std() -> None:
    fan_out, fan_in = 700, 300
    u = init.xavier_uniform((fan_out, fan_in), seed=2, dtype="float64").numpy()
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    assert np.abs(u).max() <= bound
    assert np.abs(u).max() > 0.999 * bound
    n = init.xavier((fan_out, fan_in), seed=2, dtype="float64").numpy()
    assert abs(n.std() / math.sqrt(2.0 / (fan_in + fan_out)) - 1) < 0.01
    assert init.glorot is init.xavier_normal and init.he is init.kaiming_normal


def test_values_equal_numpy_pcg64_stream() -> None:
    # The documented contract: Generator(PCG64(SeedSequence(seed))) drawing in float64.
    got = init.kaiming((4, 5), seed=(7, 2), dtype="float64").numpy()
    expected = _rng(7, 2).normal(0.0, math.sqrt(2.0 / 5), size=(4, 5))
    np.testing.assert_array_equal(got, expected)
    got_u = init.uniform(-2.0, 3.0)((6,), seed=11, dtype="float64").numpy()
    np.testing.assert_array_equal(got_u, _rng(11).uniform(-2.0, 3.0, size=6))


def test_reproducible_and_seed_sensitive() -> None:
    a = init.kaiming((30, 20), seed=5).numpy()
    b = init.kaiming((30, 20), seed=5).numpy()
    c = init.kaiming((30, 20), seed=6).numpy()
    d = init.kaiming((30, 20), seed=(5, 1)).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert not np.allclose(a, d)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_dtype_is_respected(dtype: str) -> None:
    t = init.normal(std=0.5)((50, 40), seed=0, dtype=dtype)
    assert t.dtype.name == dtype
    assert t.numpy().dtype == np.dtype(dtype)
    reference = _rng(0).normal(0.0, 0.5, size=(50, 40)).astype(dtype)
    np.testing.assert_array_equal(t.numpy(), reference)


def test_normal_and_uniform_statistics() -> None:
    n = init.normal(std=0.02, mean=1.0)((400, 400), seed=9, dtype="float64").numpy()
    assert abs(n.mean() - 1.0) < 4 * 0.02 / 400
    assert abs(n.std() / 0.02 - 1) < 0.01
    u = init.uniform(-0.5, 1.5)((400, 400), seed=9, dtype="float64").numpy()
    assert u.min() >= -0.5 and u.max() < 1.5
    assert abs(u.mean() - 0.5) < 0.01
    assert abs(u.var() - 4.0 / 12) < 0.01


def test_constant_zeros_ones_any_dtype() -> None:
    np.testing.assert_array_equal(init.zeros((2, 3), dtype="int32").numpy(), np.zeros((2, 3)))
    assert init.zeros((2, 3), dtype="int32").dtype == sg.int32
    np.testing.assert_array_equal(init.ones((4,), dtype="bool").numpy(), np.ones(4, bool))
    np.testing.assert_array_equal(init.constant(2.5)((3,)).numpy(), np.full(3, 2.5, np.float32))


def test_biases_get_zeros_under_kaiming_and_xavier() -> None:
    for initializer in (init.kaiming, init.kaiming_uniform, init.xavier, init.xavier_uniform):
        np.testing.assert_array_equal(initializer((16,), seed=3).numpy(), np.zeros(16))
    with pytest.raises(ValueError, match="rank >= 2"):
        init.Kaiming(bias_zero=False)((16,), seed=0)


def test_gain_values() -> None:
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)
    assert init.calculate_gain("leaky_relu", 0.2) == pytest.approx(math.sqrt(2 / 1.04))
    w = init.Kaiming(nonlinearity="linear")((500, 400), seed=0, dtype="float64").numpy()
    assert abs(w.std() / math.sqrt(1 / 400) - 1) < 0.01


def test_bad_arguments_raise() -> None:
    with pytest.raises(sg.DTypeError, match="int32"):
        init.kaiming((3, 3), dtype="int32")
    with pytest.raises(ValueError, match="std"):
        init.normal(std=-1.0)
    with pytest.raises(ValueError, match="a <= b"):
        init.uniform(1.0, 0.0)
    with pytest.raises(ValueError, match="seed"):
        init.normal()((2,), seed=-1)


def test_linear_and_mlp_match_numpy() -> None:
    rng = np.random.default_rng(0)
    x, w1, b1 = rng.standard_normal((4, 3)), rng.standard_normal((5, 3)), rng.standard_normal(5)
    w2, b2 = rng.standard_normal((2, 5)), rng.standard_normal(2)
    params = [sg.tensor(a) for a in (w1, b1, w2, b2)]
    got = sg.nn.mlp(params, sg.tensor(x)).numpy()
    expected = np.maximum(x @ w1.T + b1, 0) @ w2.T + b2
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    with pytest.raises(sg.ShapeError, match="linear"):
        sg.nn.linear(sg.tensor(x), sg.tensor(w2))
    with pytest.raises(ValueError, match="pairs"):
        sg.nn.mlp(params[:3], sg.tensor(x))
