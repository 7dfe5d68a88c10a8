"""Large products with k = 1 (batches of outer products: per-example weight gradients)
render as rows written with streaming stores (``teamsplit.outer_product``), not as library
calls; values against NumPy, float32 and float64, contiguous and strided operands."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.compiler.target import CTuning

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")

# Output sizes just above the streaming threshold (8 MiB in float32).
NB, NI, NJ = 16, 384, 352


def _source(fn: Callable[..., Any], *args: Any) -> str:
    return str(sg.compile(fn, backend="c").lower(*args).source)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "spec,shapes",
    [
        ("ai,aj->aij", [(NB, NI), (NB, NJ)]),  # per-example outer products
        ("ai,aj->aji", [(NB, NI), (NB, NJ)]),  # the other order of the result
        ("ia,aj->aij", [(NI, NB), (NB, NJ)]),  # a strided left operand
        ("ai,ja->aij", [(NB, NI), (NJ, NB)]),  # a strided right operand
        ("aki,akj->aij", [(NB, 1, NI), (NB, 1, NJ)]),  # a summed axis of size 1
    ],
)
def test_batched_outer_products_match_numpy(spec: str, shapes: list[Any], dtype: Any) -> None:
    assert CTuning().stream_outer_min_bytes <= NB * NI * NJ * 4
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(dtype) for s in shapes)
    fn = sg.compile(lambda a, b: sg.einsum(spec, a, b), backend="c")
    got = fn(sg.tensor(a), sg.tensor(b)).numpy()
    want = np.einsum(spec, a, b)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # one rounding per element, as NumPy's


def test_the_rows_are_streamed_and_small_products_stay_library_calls() -> None:
    a, b = sg.tensor(np.ones((NB, NI), np.float32)), sg.tensor(np.ones((NB, NJ), np.float32))
    source = _source(lambda a, b: sg.einsum("ai,aj->aij", a, b), a, b)
    assert "sg_outer_row_f32(" in source and "sgemm(" not in source.split("sg_body")[-1]
    small = _source(lambda a, b: sg.einsum("ai,aj->aij", a, b), a[:2], b[:2])
    assert "sg_outer_row_f32(" not in small.split("sg_body")[-1]
