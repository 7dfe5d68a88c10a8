"""Explicit random keys (issue 14): determinism, independence, statistics, the documented bits
(an independent int64 reimplementation), traced keys in compiled code without retracing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import references as R
import shapegrad as sg
from modes import _c_unavailable
from shapegrad.models import MoonsMLP

needs_c = pytest.mark.skipif(_c_unavailable() is not None, reason=_c_unavailable() or "")


def test_keys_are_deterministic_and_distinct() -> None:
    assert sg.random.key(0).tolist() == sg.random.key(0).tolist()
    keys = {tuple(sg.random.key(s).tolist()) for s in [0, 1, 2, 1 << 24, (1 << 24) + 1, 1 << 40]}
    assert len(keys) == 6
    k = sg.random.key(7)
    pair = sg.random.split(k, 2).numpy()
    derived = {tuple(pair[0]), tuple(pair[1]), tuple(sg.random.fold_in(k, 0).tolist()), tuple(k.tolist())}
    assert len(derived) == 4
    a, b = sg.random.split(k)
    assert a.shape == (2,) and a.dtype == sg.int32 and not np.array_equal(a.numpy(), b.numpy())


def test_bits_follow_the_documented_definition() -> None:
    assert tuple(sg.random.key(12345).tolist()) == R.key_from_seed(12345)
    assert tuple(sg.random.key(1 << 50).tolist()) == R.key_from_seed(1 << 50)
    k = sg.random.key(3)
    assert tuple(sg.random.fold_in(k, 99).tolist()) == R.key_fold_in(R.key_from_seed(3), 99)
    np.testing.assert_array_equal(sg.random.uniform(k, (3, 50), "float64").numpy(), R.keyed_uniform((3, 50), 3))


def test_uniform_statistics_and_independence_between_keys() -> None:
    n = 40000
    base = sg.random.key(0)
    samples = [sg.random.uniform(sg.random.fold_in(base, i), (n,), "float64").numpy() for i in range(6)]
    everything = np.concatenate(samples)
    assert everything.min() >= 0.0 and everything.max() < 1.0
    assert abs(everything.mean() - 0.5) < 5 * np.sqrt(1 / 12 / everything.size)
    counts = np.histogram(everything, bins=32, range=(0, 1))[0]
    expected = everything.size / 32
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 31 + 5 * np.sqrt(2 * 31)  # 5 sigma above the mean of chi2(31)
    for a, b in itertools.pairwise(samples):  # consecutive keys: uncorrelated
        assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
    for a in samples:  # neighbouring elements: uncorrelated
        assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / np.sqrt(n)


def test_normal_and_bernoulli_moments() -> None:
    z = sg.random.normal(sg.random.key(1), (200, 200), "float64").numpy()
    assert abs(z.mean()) < 5 / 200 and abs(z.std() - 1.0) < 0.02
    hits = sg.random.bernoulli(sg.random.key(2), 0.3, (100000,)).numpy()
    assert hits.dtype == np.bool_ and abs(hits.mean() - 0.3) < 5 * np.sqrt(0.21 / 1e5)


def test_dropout_with_a_key_rate_and_scaling() -> None:
    x = sg.ones((200, 100))
    y = sg.dropout(x, 0.25, sg.random.key(4)).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 5 * np.sqrt(0.1875 / y.size)
    np.testing.assert_allclose(y[kept], 1 / 0.75)
    with pytest.raises(TypeError, match="a key"):
        sg.dropout(x, 0.25, sg.ones(2))


@needs_c
def test_traced_key_gives_fresh_masks_without_retrace_and_matches_eager() -> None:
    step = sg.compile(lambda x, key: sg.dropout(x, 0.5, key), backend="c")
    x = sg.ones((8, 16))
    base = sg.random.key(0)
    masks = []
    for i in range(4):
        key = sg.random.fold_in(base, i)
        out = step(x, key).numpy()
        np.testing.assert_array_equal(out, sg.dropout(x, 0.5, key).numpy())
        masks.append(out != 0)
    assert step.trace_count == 1
    assert all(not np.array_equal(masks[i], masks[i + 1]) for i in range(3))


@needs_c
def test_key_functions_trace_with_a_traced_counter() -> None:
    def draw(key: sg.Tensor, count: sg.Tensor) -> tuple[sg.Tensor, sg.Tensor, sg.Tensor]:
        k = sg.random.fold_in(key, count)
        return sg.random.uniform(k, (5,)), sg.random.normal(k, (3,)), sg.random.split(k, 3)

    fast = sg.compile(draw, backend="c")
    key = sg.random.key(9)
    for count in (0, 1, 2**30):
        got = fast(key, np.int32(count))
        want = draw(key, sg.tensor(np.int32(count)))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert fast.trace_count == 1


def test_bad_keys_and_arguments() -> None:
    with pytest.raises(TypeError, match=r"expected a key \(int32\[2\]"):
        sg.random.uniform(sg.ones(2), (3,))
    with pytest.raises(ValueError, match="non-negative int"):
        sg.random.key(-1)
    with pytest.raises(ValueError, match="num must be >= 1"):
        sg.random.split(sg.random.key(0), 0)


# --- seeds outside the documented range are refused, not aliased (issue 24, item 7) -----------

SEED_ENTRIES = {
    "sg.rand": lambda s: sg.rand((4,), seed=s),
    "sg.randn": lambda s: sg.randn((4,), seed=s),
    "sg.dropout": lambda s: sg.dropout(sg.ones(8), 0.5, s),
    "sg.nn.init": lambda s: sg.nn.init.normal(1.0)((3,), seed=s),
    "Module.init": lambda s: sg.nn.Linear.init(seed=s, d_in=2, d_out=2),
    "ParamList.init": lambda s: MoonsMLP.init(sg.nn.init.kaiming, seed=s, h=2),
    "make_moons": lambda s: sg.data.make_moons(8, seed=s),
    "make_circles": lambda s: sg.data.make_circles(8, seed=s),
    "make_spirals": lambda s: sg.data.make_spirals(8, seed=s),
    "stratified_split": lambda s: sg.data.stratified_split(np.array([0, 0, 1, 1]), 0.5, s),
    "Batches": lambda s: sg.data.Batches(np.arange(4.0), batch_size=2, seed=s),
    "ScalarTrainer": lambda s: sg.ScalarTrainer(lambda p, x: (p[0] * x).sum(), [sg.ones(2)], seed=s),
}


def test_sg_rand_seeds_used_to_alias_modulo_2_to_the_32() -> None:
    # what the bound prevents: the RANDOM primitive keeps 32 bits of its seed
    with pytest.raises(ValueError, match=r"rand: seed must be an int in \[0, 2\*\*32\), got 18446744073709551616"):
        sg.rand((4,), seed=2**64)
    with pytest.raises(ValueError, match=r"got -5"):
        sg.rand((4,), seed=-5)
    last = sg.rand((4,), seed=2**32 - 1).numpy()  # the top of the range works and differs
    assert not np.array_equal(last, sg.rand((4,), seed=0).numpy())


def test_init_seeds_beyond_32_bits_would_alias_the_next_elements_seed() -> None:
    # why NumPy seeds are bounded too: SeedSequence pads with zero words, so the entropy
    # (2**32, 0) is (0, 1): Module.init(seed=2**32)'s first tensor = seed 0's second one
    a = np.random.default_rng((2**32, 0)).random(3)
    np.testing.assert_array_equal(a, np.random.default_rng((0, 1)).random(3))
    with pytest.raises(ValueError, match=r"Linear.init: seed must be an int in \[0, 2\*\*32\)"):
        sg.nn.Linear.init(seed=2**32, d_in=2, d_out=2)


@pytest.mark.parametrize("entry", list(SEED_ENTRIES))
@pytest.mark.parametrize("seed", [-1, -5, 2**32, 2**64, 1.0, True, "0"])
def test_every_seed_entry_refuses_out_of_range_seeds(entry: str, seed: object) -> None:
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*32\), got"):
        SEED_ENTRIES[entry](seed)


@pytest.mark.parametrize("entry", list(SEED_ENTRIES))
def test_every_seed_entry_accepts_the_ends_of_the_range(entry: str) -> None:
    for seed in (0, 2**32 - 1, np.int64(7)):
        SEED_ENTRIES[entry](seed)


def test_random_key_takes_any_non_negative_int_without_collisions() -> None:
    keys = {tuple(sg.random.key(s).tolist()) for s in (0, 2**32, 2**64, 2**64 + 1, 2**100)}
    assert len(keys) == 5
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"sg\.random\.key: seed must be a non-negative int"):
            sg.random.key(bad)  # type: ignore[arg-type]


def test_data_helpers_refuse_nan_noise_and_a_negative_start_epoch() -> None:
    for make in (sg.data.make_moons, sg.data.make_circles, sg.data.make_spirals):
        with pytest.raises(ValueError, match="noise is a standard deviation and must be finite"):
            make(10, noise=float("nan"))
    with pytest.raises(ValueError, match="start_epoch must be an int >= 0, got -1"):
        sg.data.Batches(np.arange(4.0), batch_size=2, start_epoch=-1)
