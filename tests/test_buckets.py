"""``sg.compile(buckets=...)``: padding one varying length to buckets (jit/buckets.py).

References are NumPy computations on the unpadded inputs (or the same function compiled
for the exact shape); compile counts are ``trace_count``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.jit import RetraceWarning
from shapegrad.typing import Float, Tensor

RNG = np.random.default_rng(0)


def masked_mean(x: sg.Tensor, n: sg.Tensor) -> sg.Tensor:
    """Mean of exp over axis 1 of the first ``n`` columns: not causal, and a padded zero
    would add exp(0) = 1, so it needs the length."""
    mask = sg.arange(x.shape[1]) < n
    return sg.where(mask, sg.exp(x), 0.0).sum(axis=1) / n


def test_length_arg_masks_a_mean_of_exp_exactly_and_compiles_once_per_bucket() -> None:
    f = sg.compile(masked_mean, buckets={("x", 1): (4, 8)}, length_arg="n")
    for length in (1, 3, 4, 5, 8, 2, 7):
        x = RNG.normal(size=(2, length)).astype(np.float32)
        np.testing.assert_allclose(f(x).numpy(), np.exp(x).mean(axis=1), rtol=1e-6, atol=1e-6)
    assert f.trace_count == 2  # lengths 1-4 share bucket 4, 5-8 bucket 8
    assert f.buckets == (4, 8)


def causal_cumsum(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
    return sg.cumsum(x, axis=0) * w


def test_out_axis_slices_a_causal_function_back_to_the_true_length() -> None:
    f = sg.compile(causal_cumsum, buckets={(0, 0): (4, 16)}, out_axis=0, backend="c")
    w = RNG.normal(size=3).astype(np.float32)
    for length in (1, 4, 5, 11, 16):
        x = RNG.normal(size=(length, 3)).astype(np.float32)
        out = f(sg.tensor(x), sg.tensor(w)).numpy()
        assert out.shape == (length, 3)
        np.testing.assert_allclose(out, np.cumsum(x, axis=0) * w, rtol=1e-5, atol=1e-5)
    assert f.trace_count == 2


def annotated(x: Float[Tensor, "b t"], y: Float[Tensor, " t"]) -> Float[Tensor, "b t"]:
    return sg.cumsum(x * y, axis=1)


def test_a_dim_name_of_the_annotations_buckets_every_argument_that_names_it() -> None:
    f = sg.compile(annotated, buckets={"t": (8,)}, out_axis=1)
    for length in (3, 8):
        x = RNG.normal(size=(2, length)).astype(np.float32)
        y = RNG.normal(size=length).astype(np.float32)
        out = f(x, y=y).numpy()  # y by keyword: padded too
        np.testing.assert_allclose(out, np.cumsum(x * y, axis=1), rtol=1e-5, atol=1e-5)
    assert f.trace_count == 1


def test_a_bucketed_length_that_matches_a_bucket_is_not_padded() -> None:
    f = sg.compile(lambda x: x * 2.0, buckets={("x", 0): (2, 4)})
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(f(x).numpy(), x * 2)
    assert f.graph(x).inputs[0].aval.shape == (4,)
    assert f.graph(x[:3]).inputs[0].aval.shape == (4,)  # padded: the same program
    assert f.trace(x[:1]).graph.inputs[0].aval.shape == (2,)
    assert f.stats(x[:1]).compile_seconds >= 0


@pytest.mark.parametrize(
    ("buckets", "kwargs", "error", "words"),
    [
        ({"s": (4,)}, {}, ValueError, ["'s' is not a dim name", "['b', 't']"]),
        ({("z", 0): (4,)}, {}, ValueError, ["'z' is not a parameter", "['x', 'y']"]),
        ({(5, 0): (4,)}, {}, ValueError, ["argument index 5", "['x', 'y']"]),
        ({("x", 1): (8, 4)}, {}, ValueError, ["increasing tuple", "(8, 4)"]),
        ({("x", 1): ()}, {}, ValueError, ["non-empty"]),
        ({"t": (4,), ("x", 0): (8,)}, {}, ValueError, ["same bucket sizes"]),
        ({("x", 1): (4,)}, {"length_arg": "m"}, ValueError, ["length_arg='m'", "['x', 'y']"]),
        ({}, {}, TypeError, ["non-empty dict"]),
        ({3: (4,)}, {}, TypeError, ["dim name (str) or an (argument, axis) pair"]),
    ],
)
def test_bad_bucket_specs_are_rejected_naming_what_is_valid(
    buckets: Any, kwargs: dict[str, Any], error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as info:
        sg.compile(annotated, buckets=buckets, **kwargs)
    for word in words:
        assert word in str(info.value)


def test_length_arg_and_out_axis_need_buckets() -> None:
    with pytest.raises(TypeError, match="only apply with buckets"):
        sg.compile(annotated, out_axis=1)


def test_bad_calls_say_what_is_wrong() -> None:
    f = sg.compile(annotated, buckets={"t": (4, 8)}, out_axis=1)
    with pytest.raises(ValueError, match=r"length 9 exceeds the largest bucket 8"):
        f(np.ones((1, 9), np.float32), np.ones(9, np.float32))
    with pytest.raises(ValueError, match=r"share one length, got x axis 1: 3, y axis 0: 4"):
        f(np.ones((1, 3), np.float32), np.ones(4, np.float32))
    with pytest.raises(TypeError, match="must be an array or a tensor, got dict"):
        f({"a": np.ones(3)}, np.ones(3, np.float32))
    total = sg.compile(lambda x: x.sum(), buckets={("x", 0): (4,)}, out_axis=0)
    with pytest.raises(ValueError, match=r"out_axis=0 but an output has shape \[\]"):
        total(np.ones(3, np.float32))
    mixed = sg.compile(lambda x: x[:2] * 1.0, buckets={("x", 0): (4,)}, out_axis=0)
    with pytest.raises(ValueError, match=r"\[2\] is not 4 \(the bucket\)"):
        mixed(np.ones(3, np.float32))


def test_inside_another_trace_it_runs_on_the_exact_shapes() -> None:
    inner = sg.compile(masked_mean, buckets={("x", 1): (4, 8)}, length_arg="n")
    outer = sg.compile(lambda x: inner(x) * 2.0)
    x = RNG.normal(size=(2, 5)).astype(np.float32)
    np.testing.assert_allclose(outer(x).numpy(), 2 * np.exp(x).mean(axis=1), rtol=1e-6)
    assert inner.trace_count == 0  # inlined into outer's trace
    with pytest.raises(TypeError, match="'n' is the length_arg"):
        inner(x, n=3)


def _retrace_messages(f: Any, shapes: list[tuple[int, ...]]) -> list[str]:
    w = sg.tensor(np.ones(3, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shape in shapes:
            f(np.ones(shape, np.float32), w)
    return [str(c.message) for c in caught if issubclass(c.category, RetraceWarning)]


def test_the_retrace_warning_suggests_buckets_when_one_length_varies() -> None:
    f = sg.compile(lambda ids, w: (ids * w).sum())
    (message,) = _retrace_messages(f, [(n, 3) for n in range(90, 97)])
    assert "pass buckets={('ids', 0): (32, 64, 128)}" in message
    g = sg.compile(lambda ids, w: (ids * w[:1]).sum())
    (message,) = _retrace_messages(g, [(n, n) for n in range(1, 8)])  # two axes vary
    assert "buckets=" not in message and "pad the inputs to a few fixed shapes" in message


# --- the charlm generation loop ------------------------------------------------------


def _charlm() -> Any:
    path = Path(__file__).resolve().parents[1] / "examples" / "charlm.py"
    spec = importlib.util.spec_from_file_location("charlm_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["charlm_example"] = module
    spec.loader.exec_module(module)
    return module


def test_charlm_generation_compiles_once_per_bucket_with_exact_logits() -> None:
    charlm = _charlm()
    args = argparse.Namespace(d_model=16, heads=2, blocks=1, context=32, seed=0, remat=False)
    vocab = 11
    params = charlm.init_params(vocab, args)
    step = charlm.sampler(args, backend="numpy")
    assert step.buckets == (16, 32)
    prompt = np.arange(5, dtype=np.int32) % vocab
    out = charlm.generate(step, params, prompt, 200, args.context, np.random.default_rng(1))
    assert len(out) == 200 and all(0 <= i < vocab for i in out)
    assert step.trace_count == 2  # lengths 5..16 -> bucket 16; 17..32 (then sliding) -> 32
    exact = sg.compile(lambda p, ids: charlm.logits_of(p, ids, args))
    for length in (5, 17, 32):
        ids = (np.arange(length, dtype=np.int32) * 7 % vocab)[None]
        np.testing.assert_allclose(
            step(params, ids).numpy(), exact(params, ids).numpy(), rtol=1e-4, atol=1e-5
        )
