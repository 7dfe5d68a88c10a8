"""Integer min/max/argmin/argmax at the ends of the range, in every mode, and the CUDA code
that keeps ptxas from miscompiling them.

Two bugs, both silent wrong answers:
* ``min`` was ``-max(-x)``; for integers ``-x`` wraps at the most negative value, so
  ``min([INT_MIN, 0])`` was 0 in eager. Integers now use ``-1 - max(-1 - x)`` (``~x``
  reverses the order exactly).
* ptxas (CUDA 13.0, sm_90, seen on an H100 by the GPU fuzzer) fuses chained int32 max/min
  into VIMNMX3 and drops an operand's negation: ``max(-x)`` over 4 values read one of them
  un-negated. The CUDA source now keeps int32 max/min as calls and negates as ``~x + 1``.

Values are checked against NumPy in eager mode and every compiled mode available here
(CUDA needs a GPU); the source rules need only nvcc, and the machine-code rule cuobjdump.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from modes import MODES
from shapegrad.backends.cuda import generate
from shapegrad.backends.cuda.toolchain import cuobjdump, nvcc

MODE_NAMES = ["eager", "numpy", "c", "cuda"]
INT32 = np.iinfo(np.int32)


def _run(fn: Any, x: np.ndarray, mode: str) -> np.ndarray:
    if mode == "eager":
        return np.asarray(fn(sg.tensor(x)).numpy())
    reason = MODES[mode].unavailable()
    if reason:
        pytest.skip(reason)
    return np.asarray(sg.compile(fn, backend=mode)(x))


def _values(seed: int) -> np.ndarray:
    """[5, 4, 6] int32: small values (ties), and both ends of the range in some columns."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=(5, 4, 6)).astype(np.int32)
    x[0, 0, 0], x[3, 1, 2], x[1, 2, 5] = INT32.min, INT32.max, INT32.min
    x[:, 3, 4] = INT32.min
    return x


CASES = {
    "negation (INT_MIN wraps)": (lambda x: -x, lambda x: -x),
    "min over axis 0": (lambda x: sg.min(x, axis=0), lambda x: x.min(0)),
    "min over axes 1, 2": (lambda x: sg.min(x, axis=(1, 2)), lambda x: x.min((1, 2))),
    "min of all": (lambda x: sg.min(x), lambda x: x.min()),
    "max of the negation": (lambda x: sg.max(-x, axis=0), lambda x: (-x).max(0)),
    "argmin": (lambda x: sg.argmin(x, axis=1), lambda x: x.argmin(1)),
    "argmax": (lambda x: sg.argmax(x, axis=0), lambda x: x.argmax(0)),
    "negated maxima chained": (
        lambda x: sg.maximum(sg.maximum(-x, -(x * 2)), x - 7),
        lambda x: np.maximum(np.maximum(-x, -(x * 2)), x - 7),
    ),
    "min of abs": (lambda x: sg.min(sg.abs(x), axis=2), lambda x: np.abs(x).min(2)),
}


@pytest.mark.parametrize("mode", MODE_NAMES)
@pytest.mark.parametrize("case", list(CASES))
def test_integer_min_max_match_numpy(case: str, mode: str) -> None:
    fn, ref = CASES[case]
    for seed in range(3):
        x = _values(seed)
        with np.errstate(over="ignore"):
            want = ref(x)
        got = _run(fn, x, mode)
        np.testing.assert_array_equal(got, want, err_msg=f"{case}, {mode}, seed {seed}")


def test_min_at_the_most_negative_value() -> None:
    """The case that was wrong in eager: -INT_MIN wraps to INT_MIN."""
    x = np.array([INT32.min, 0, 5], np.int32)
    assert int(sg.min(sg.tensor(x)).numpy()) == INT32.min
    x64 = np.array([np.iinfo(np.int64).min, 0, 5], np.int64)
    assert int(sg.min(sg.tensor(x64, dtype=sg.int64)).numpy()) == np.iinfo(np.int64).min


def _cuda_source(fn: Any) -> str:
    graph = sg.compile(fn, backend="numpy").graph(_values(0))
    return generate(graph)[1]


def test_cuda_source_negates_int32_without_a_negated_operand() -> None:
    source = _cuda_source(lambda x: sg.max(-x, axis=0))
    assert "sg_negi(" in source
    assert re.search(r"__noinline__ int32_t sg_maxi\(", source)
    assert re.search(r"__noinline__ int32_t sg_mini\(", source)
    body = source[source.index("__global__") :]
    assert "(-(" not in body  # no plain int32 negation left in a kernel


needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc not found (no CUDA toolkit)")
CUOBJDUMP = cuobjdump()


@needs_nvcc
@pytest.mark.skipif(CUOBJDUMP is None, reason="cuobjdump not found (the dev extra installs it on Linux x86-64)")
@pytest.mark.parametrize("case", ["min over axis 0", "max of the negation", "negated maxima chained"])
def test_sass_has_no_three_input_integer_max(case: str, tmp_path: Path) -> None:
    """The instruction that drops the negation is VIMNMX3; none is left in these kernels."""
    src = tmp_path / "k.cu"
    src.write_text(_cuda_source(CASES[case][0]), encoding="utf-8")
    cubin = tmp_path / "k.cubin"
    nvcc_path = nvcc()
    assert nvcc_path is not None and CUOBJDUMP is not None
    subprocess.run(
        [nvcc_path, "-O3", "-std=c++17", "-arch=sm_90", "-cubin", "-o", str(cubin), str(src)],
        check=True,
        capture_output=True,
    )
    sass = subprocess.run(
        [CUOBJDUMP, "-sass", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    assert "VIMNMX" in sass or "CALL" in sass  # the kernels were disassembled
    assert "VIMNMX3" not in sass
